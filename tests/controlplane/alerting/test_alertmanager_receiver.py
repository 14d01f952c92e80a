"""POST /api/v1/webhooks/alertmanager: Alertmanager's v4 payload leads to its action; re-delivery to none; a bad
body gets 400 naming the field; the Bearer token of an operator or above is required."""
import copy

import pytest

URL = "/api/v1/webhooks/alertmanager"
PAYLOAD = {
    "version": "4",
    "groupKey": '{}:{alertname="DecodeSlow"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "tandem",
    "groupLabels": {"alertname": "DecodeSlow"},
    "commonLabels": {"alertname": "DecodeSlow", "deployment": "demo", "role": "decode"},
    "commonAnnotations": {"tandem_action": "scale_up"},
    "externalURL": "http://alertmanager.example:9093",
    "alerts": [{
        "status": "firing",
        "labels": {"alertname": "DecodeSlow", "deployment": "demo", "role": "decode", "severity": "page"},
        "annotations": {"tandem_action": "scale_up", "tandem_scale_step": "2", "summary": "ITL p99 is 300 ms"},
        "startsAt": "2026-11-30T12:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example:9090/graph?g0.expr=x",
        "fingerprint": "c3a1f1b0a1b2c3d4",
        "someFutureField": {"ignored": True},
    }],
}


def bearer(api_for, user):
    from controlplane.services.tokens import token_issue

    client = api_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_issue(user=user, name='alertmanager')}")
    return client


def test_a_firing_alert_scales_and_its_redelivery_does_nothing(deployment, api_for, operator):
    from controlplane.models import Action, Pool

    client = bearer(api_for, operator)
    first = client.post(URL, PAYLOAD, format="json")
    assert first.status_code == 200, first.content
    [result] = first.json()["results"]
    assert result["outcome"] == "created"
    action = Action.objects.get(pk=result["action"])
    assert (action.kind, action.actor_type, action.actor) == ("scale", "webhook", "alertmanager:tandem")
    assert action.user == operator
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert "DecodeSlow" in action.reason and "ITL p99 is 300 ms" in action.reason
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3

    again = client.post(URL, PAYLOAD, format="json")
    assert again.status_code == 200
    assert again.json()["results"][0] == {**result, "outcome": "duplicate"}
    assert Action.objects.filter(kind="scale").count() == 1
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3


def test_a_resolved_alert_and_one_without_tandem_action_do_nothing(deployment, api_for, operator):
    from controlplane.models import Action

    payload = copy.deepcopy(PAYLOAD)
    payload["status"] = "resolved"
    payload["alerts"][0]["status"] = "resolved"
    payload["alerts"].append({"status": "firing", "labels": {"alertname": "Info", "deployment": "demo"}})
    payload["commonAnnotations"] = {}
    response = bearer(api_for, operator).post(URL, payload, format="json")
    assert response.status_code == 200
    assert [r["outcome"] for r in response.json()["results"]] == ["ignored", "ignored"]
    assert not Action.objects.filter(kind="scale").exists()


def test_a_restart_names_the_worker(deployment, make_worker, api_for, operator):
    from controlplane.models import Action

    worker = make_worker(deployment, "decode")
    payload = copy.deepcopy(PAYLOAD)
    payload["alerts"][0]["labels"]["worker"] = str(worker.pk)
    payload["alerts"][0]["annotations"]["tandem_action"] = "restart"
    response = bearer(api_for, operator).post(URL, payload, format="json")
    assert response.json()["results"][0]["outcome"] == "created"
    assert Action.objects.get(kind="restart").worker_id == worker.pk


@pytest.mark.parametrize("mutate, field", [
    (lambda p: p["alerts"][0].__setitem__("labels", ["deployment", "demo"]), "alerts[0].labels must be an object"),
    (lambda p: p["alerts"][0].pop("labels"), "alerts[0].labels is required"),
    (lambda p: p.__setitem__("alerts", {}), "alerts must be a list"),
    (lambda p: p.pop("groupKey"), "groupKey is required"),
    (lambda p: p.__setitem__("status", "burning"), "status must be 'firing' or 'resolved'"),
    (lambda p: p["alerts"][0].__setitem__("startsAt", "yesterday"), "alerts[0].startsAt must be an RFC 3339 time"),
    (lambda p: p["alerts"][0]["annotations"].__setitem__("tandem_scale_step", 2),
     "alerts[0].annotations.tandem_scale_step must be a string"),
    (lambda p: p.__setitem__("version", "3"), 'version must be "4"'),
])
def test_a_malformed_body_gets_400_naming_the_field(deployment, api_for, operator, mutate, field):
    from controlplane.models import Action

    payload = copy.deepcopy(PAYLOAD)
    mutate(payload)
    response = bearer(api_for, operator).post(URL, payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["message"]
    assert not Action.objects.filter(kind="scale").exists()


def test_a_body_that_is_not_json_gets_400(deployment, api_for, operator):
    response = bearer(api_for, operator).post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400


def test_without_or_with_a_wrong_token_it_is_401_and_a_viewer_gets_403(deployment, api_for, viewer, admin):
    assert api_for(None).post(URL, PAYLOAD, format="json").status_code == 401
    wrong = api_for(None)
    wrong.credentials(HTTP_AUTHORIZATION="Bearer " + "0" * 40)
    response = wrong.post(URL, PAYLOAD, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert bearer(api_for, viewer).post(URL, PAYLOAD, format="json").status_code == 403
    assert bearer(api_for, admin).post(URL, PAYLOAD, format="json").status_code == 200


@pytest.mark.parametrize("action, key, value, detail", [
    ("restart", "worker", "²", "label worker names no worker"),  # str.isdigit() is true for it, int() refuses it
    ("restart", "worker", "9" * 30, "label worker names no worker"),  # past 64 bits: would overflow the driver
    ("scale_up", "tandem_scale_step", "²", "tandem_scale_step must be an integer 1..64"),
    ("scale_up", "tandem_scale_step", "٣", "tandem_scale_step must be an integer 1..64"),  # an Arabic-Indic 3
])
def test_a_worker_or_step_that_is_not_ascii_digits_is_rejected_not_a_500(deployment, make_worker, api_for, operator,
                                                                          action, key, value, detail):
    from controlplane.models import Action

    make_worker(deployment, "decode")
    payload = copy.deepcopy(PAYLOAD)
    payload["alerts"][0]["annotations"]["tandem_action"] = action
    payload["commonAnnotations"] = {}
    target = payload["alerts"][0]["labels" if key == "worker" else "annotations"]
    target[key] = value
    response = bearer(api_for, operator).post(URL, payload, format="json")
    assert response.status_code == 200, response.content
    [result] = response.json()["results"]
    assert result["outcome"] == "rejected" and detail in result["detail"], result
    assert not Action.objects.filter(kind__in=["scale", "restart"]).exists()


def test_a_delivery_with_more_alerts_than_the_cap_processes_the_first_and_says_so(deployment, api_for, operator,
                                                                                  settings):
    from controlplane.models import Pool

    settings.TANDEM_ALERTMANAGER_MAX_ALERTS = 2
    body = copy.deepcopy(PAYLOAD)
    alert = body["alerts"][0]
    body["alerts"] = [{**alert, "fingerprint": f"f{index}", "annotations": {"tandem_action": "scale_up"}}
                      for index in range(5)]
    response = bearer(api_for, operator).post(URL, body, format="json")
    assert response.status_code == 200
    data = response.json()
    assert len(data["results"]) == 2 and data["num_ignored"] == 3
    assert "only the first 2 of 5 alerts were processed" in data["detail"]
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3
