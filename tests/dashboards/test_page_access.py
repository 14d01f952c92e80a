"""Every page by role: anonymous → login, an outsider (no role) → 403 page, viewers read without buttons,
operators see the buttons."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

BUTTON_MARKERS = ("data-testid=\"scale-up-decode\"", "data-testid=\"restart-", "data-testid=\"rollback-1\"",
                  "data-testid=\"silence-", "Turn autoscaler", "Expire now")


@pytest.fixture
def pages(second_revision, deployment, make_worker):
    """A deployment with revision 2 current, a ready worker of each role, a firing alert with a silence and a
    tenant."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.alerting.models import Alert, AlertRule, Silence
    from controlplane.tenants.models import Tenant

    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    rule = AlertRule.objects.create(name="p99-high", deployment=deployment, metric="e2e_p99_seconds",
                                    comparison=">", threshold=0.5)
    Tenant.objects.create(name="acme")
    now = timezone.now()
    Alert.objects.create(rule=rule, fingerprint="f1", labels={"alertname": "p99-high", "deployment": "demo"},
                         deployment=deployment, state="firing", value=0.9, active_at=now, fired_at=now,
                         last_true_at=now, last_evaluated_at=now)
    Silence.objects.create(matchers=[{"name": "deployment", "value": "other", "is_regex": False,
                                      "is_equal": True}], ends_at=now + timedelta(hours=1), comment="maintenance")
    return {
        "/": None,
        "/deployments/demo/": "scale-up-decode",
        "/deployments/demo/live": "scale-up-decode",
        "/deployments/demo/revisions/": "rollback-1",
        "/deployments/demo/rollback/1/": None,
        "/alerts/": "silence-",
        f"/alerts/rules/{rule.pk}/": None,
        "/actions/": None,
        "/tenants/": None,
        "/tenants/acme/": None,
    }


def test_anonymous_visitors_are_sent_to_the_login_page_from_every_page(client, pages):
    for url in list(pages) + ["/deployments/demo/charts.json", "/deployments/demo/stages.json",
                              "/tenants/acme/charts.json"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"/accounts/login/?next={url}"), url


def test_the_login_page_renders_and_signs_a_user_in(client, make_user):
    user = make_user("una", "viewer")
    user.set_password("correct horse")
    user.save()
    assert b"Log in" in client.get("/accounts/login/").content
    response = client.post("/accounts/login/", {"username": "una", "password": "correct horse", "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_a_user_without_a_role_is_told_to_ask_for_one(client_for, outsider, pages):
    client = client_for(outsider)
    for url in pages:
        response = client.get(url)
        assert response.status_code == 403, url
        assert "has no role yet" in response.content.decode(), url


def test_a_viewer_reads_every_page_but_sees_no_button(client_for, viewer, pages):
    client = client_for(viewer)
    for url in pages:
        if "rollback" in url:
            continue  # the confirmation page of an action: operators only (next test)
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for marker in BUTTON_MARKERS:
            assert marker not in html, (url, marker)
        assert 'method="post" action="/deployments' not in html and "/scale\"" not in html, url


def test_a_viewer_cannot_open_the_rollback_confirmation(client_for, viewer, pages):
    assert client_for(viewer).get("/deployments/demo/rollback/1/").status_code == 403


def test_an_operator_sees_the_buttons_of_each_page(client_for, operator, pages):
    client = client_for(operator)
    for url, marker in pages.items():
        response = client.get(url)
        assert response.status_code == 200, url
        if marker:
            assert f'data-testid="{marker}' in response.content.decode(), url


def test_every_button_form_carries_a_csrf_token(client_for, operator, pages):
    client = client_for(operator)
    for url in pages:
        html = client.get(url).content.decode()
        num_forms = html.count('<form method="post"')
        assert html.count("csrfmiddlewaretoken") >= num_forms, url


def test_an_unknown_deployment_is_a_404_not_a_500(client_for, viewer, db):
    client = client_for(viewer)
    for url in ("/deployments/nope/", "/deployments/nope/live", "/deployments/nope/charts.json",
                "/deployments/nope/stages.json", "/deployments/nope/revisions/"):
        assert client.get(url).status_code == 404, url
