"""The rollouts API: operators start and act, viewers read (403 for writes), 400 naming the field, 409 while
another rollout runs, idempotency by body field or header, the report as JSON and CSV."""
from __future__ import annotations

import csv
import io

from controlplane.rollouts.models import AnalysisRun, Rollout

URL = "/api/v1/deployments/demo/rollouts"


def test_an_operator_starts_a_canary_and_a_viewer_reads_it(steady, operator_api, viewer_api):
    response = operator_api.post(URL, {"revision": 2, "strategy": "canary", "steps": [
        {"weight": 10, "duration_s": 5}], "analysis": {"min_requests": 10}}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["revision"], body["stable_revision"], body["step"], body["weight"]) == \
        ("running", 2, 1, 1, 10)
    assert body["analysis"]["min_requests"] == 10 and body["variants"] == ["stable", "canary"]
    listed = viewer_api.get(URL)
    assert listed.status_code == 200 and [r["id"] for r in listed.json()] == [body["id"]]
    assert viewer_api.get(f"{URL}/{body['id']}").json()["id"] == body["id"]


def test_viewers_may_not_start_or_act(steady, viewer_api, operator):
    from controlplane.rollouts.services import rollout_start

    assert viewer_api.post(URL, {"revision": 2, "strategy": "canary"}, format="json").status_code == 403
    rollout = rollout_start(deployment=steady, actor=operator, revision=2)
    for verb in ("promote", "abort", "pause", "resume"):
        assert viewer_api.post(f"{URL}/{rollout.pk}/{verb}", {}, format="json").status_code == 403
    assert Rollout.objects.get().status == "running"


def test_bad_fields_are_a_400_naming_them(steady, operator_api):
    cases = [({"revision": 2, "strategy": "canary", "steps": [{"weight": 150, "duration_s": 5}]}, "steps[0].weight"),
             ({"revision": 2, "strategy": "canary", "analysis": {"min_requests": 0}}, "analysis.min_requests"),
             ({"revision": 2, "strategy": "canary", "analysis": {"max_wait_s": -1}}, "analysis.max_wait_s"),
             ({"revision": 7, "strategy": "canary"}, "revision"),
             ({"revision": 2, "colour": "red"}, "colour"),
             ({"revision": 2, "steps": [{"weight": 10, "duration_s": 5}]}, "steps")]  # rolling has no steps
    for body, field in cases:
        response = operator_api.post(URL, body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert field in response.content.decode(), (field, response.content)
    assert not Rollout.objects.exists()


def test_a_second_start_is_a_409_and_the_same_key_is_the_same_rollout(steady, operator_api):
    first = operator_api.post(URL, {"revision": 2, "strategy": "canary"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = operator_api.post(URL, {"revision": 2, "strategy": "canary"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and Rollout.objects.count() == 1
    other = operator_api.post(URL, {"revision": 2, "strategy": "ab", "duration_s": 60}, format="json")
    assert other.status_code == 409 and "rollout" in other.json()["error"]["message"]


def test_pause_resume_abort_and_a_409_for_an_ended_rollout(steady, operator_api):
    rollout_id = operator_api.post(URL, {"revision": 2, "strategy": "canary"}, format="json").json()["id"]
    paused = operator_api.post(f"{URL}/{rollout_id}/pause", {"reason": "lunch"}, format="json")
    assert paused.status_code == 202 and paused.json()["rollout"]["status"] == "paused"
    assert operator_api.post(f"{URL}/{rollout_id}/pause", {}, format="json").status_code == 409
    assert operator_api.post(f"{URL}/{rollout_id}/resume", {}, format="json").json()["rollout"]["status"] == \
        "running"
    aborted = operator_api.post(f"{URL}/{rollout_id}/abort", {"reason": "enough"}, format="json")
    assert aborted.status_code == 202 and aborted.json()["action"]["kind"] == "abort"
    assert operator_api.post(f"{URL}/{rollout_id}/promote", {}, format="json").status_code == 409
    assert operator_api.get(f"{URL}/999").status_code == 404


def test_the_report_downloads_as_json_and_csv(steady, operator, viewer_api):
    from controlplane.rollouts.services import rollout_start

    rollout = rollout_start(deployment=steady, actor=operator, revision=2, strategy="ab", duration_s=60)
    numbers = {"requests": 100, "errors": 1, "error_ratio": 0.01, "e2e_p99_seconds": 0.4}
    AnalysisRun.objects.create(rollout=rollout, step_index=0, verdict="report",
                               metrics={"a": numbers, "b": {**numbers, "requests": 98}},
                               significance={"note": "at alpha 0.05: no significant difference found"})
    report = viewer_api.get(f"{URL}/{rollout.pk}/report").json()
    run = report["analysis_runs"][0]
    assert run["variants"]["b"]["requests"] == 98 and run["variants"]["a"]["revision"] == 1
    response = viewer_api.get(f"{URL}/{rollout.pk}/report.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["variant"], r["revision"], r["requests"]) for r in rows] == [("a", "1", "100"), ("b", "2", "98")]
    assert rows[0]["significance"].startswith("at alpha")


def test_rolling_is_the_default_strategy_and_replaces_both_pools_at_once(steady, operator_api):
    response = operator_api.post(URL, {"revision": 2, "reason": "go"}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["strategy"] == "rolling" and body["action"]["kind"] == "rollback"
    steady.refresh_from_db()
    assert steady.current_revision.number == 2 and not Rollout.objects.exists()
    assert operator_api.post(URL, {"revision": 1, "strategy": "canary"}, format="json").status_code == 409


def test_a_new_revision_in_a_rollout_needs_an_admin(steady, operator_api, admin_api):
    body = {"revision": {"engine_settings": {"threads": 2}}, "strategy": "canary"}
    refused = operator_api.post(URL, body, format="json")
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    assert steady.revisions.count() == 2
    created = admin_api.post(URL, body, format="json")
    assert created.status_code == 201 and created.json()["revision"] == 3
