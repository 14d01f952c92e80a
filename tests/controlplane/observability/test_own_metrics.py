"""The control plane's own /metrics: viewer token as Bearer or Token, cycle durations, targets up, actions."""
import pytest
from prometheus_client.parser import text_string_to_metric_families
from controlplane.services.tokens import token_issue

from controlplane.observability.models import CycleKind
from controlplane.observability.telemetry import observe_evaluation, record_cycle


def samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def token(viewer):
    return token_issue(user=viewer, name="prometheus")


def test_prometheus_reads_durations_targets_and_actions_with_a_bearer_token(client, token, deployment):
    record_cycle(CycleKind.SCRAPE, 0.2, num_targets=5, num_up=4)
    record_cycle(CycleKind.SCRAPE, 3.0, num_targets=5, num_up=5)
    observe_evaluation(0.004)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    values = samples(response.content.decode())
    scrape = (("kind", "scrape"),)
    assert values[("tandem_controlplane_cycle_duration_seconds_count", scrape)] == 2
    assert values[("tandem_controlplane_cycle_duration_seconds_sum", scrape)] == pytest.approx(3.2)
    assert values[("tandem_controlplane_cycle_duration_seconds_bucket", (("kind", "scrape"), ("le", "0.25")))] == 1
    assert values[("tandem_controlplane_cycle_last_duration_seconds", scrape)] == 3.0
    assert values[("tandem_controlplane_cycle_duration_seconds_count", (("kind", "alert_evaluation"),))] == 1
    assert values[("tandem_controlplane_scrape_targets", (("up", "1"),))] == 5
    assert values[("tandem_controlplane_scrape_targets", (("up", "0"),))] == 0
    # deployment_create recorded one `create` action by a user
    key = ("tandem_controlplane_actions_total", (("actor_type", "user"), ("kind", "create"), ("status", "pending")))
    assert values[key] == 1
    # The alerting app is installed: its deliveries are counted by status (none yet: an empty family, which the
    # exposition leaves out, so ask the collector).
    from controlplane.observability.telemetry import ControlPlaneCollector

    assert "tandem_controlplane_deliveries" in {family.name for family in ControlPlaneCollector().collect()}


def test_the_rest_api_token_scheme_works_too(client, token):
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_anonymous_bad_tokens_and_outsiders_are_refused(client, outsider):
    response = client.get("/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-a-token").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic abc").status_code == 401
    key = token_issue(user=outsider, name="prometheus")
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 403
