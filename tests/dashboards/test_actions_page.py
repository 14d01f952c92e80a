"""The audit log page: every action with reason and outcome, filterable by deployment, actor, kind and status."""
from __future__ import annotations

import pytest

from controlplane.models import Action
from controlplane.services import Actor, action_fail, pool_scale, worker_restart

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(deployment, make_deployment, operator, make_worker):
    other = make_deployment("other")
    scale = pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator, reason="more decode")
    restart = worker_restart(worker=make_worker(deployment, "decode"), actor=Actor.rule("worker-down"),
                             reason="up=0 for 30 s")
    action_fail(action_id=restart.pk, error="process exited with code 1")
    other_scale = pool_scale(deployment=other, role="prefill", replicas=3, actor=operator, reason="other")
    return {"scale": scale, "restart": restart, "other": other_scale}


def _ids(response) -> set[int]:
    import re

    return {int(i) for i in re.findall(r'<tr data-action="(\d+)"', response.content.decode())}


def test_it_lists_every_action_with_its_reason_and_outcome(client_for, viewer, history):
    response = client_for(viewer).get("/actions/")
    text = response.content.decode()
    assert {a.pk for a in history.values()} <= _ids(response)
    assert "more decode" in text and "up=0 for 30 s" in text and "process exited with code 1" in text
    assert "decode 1 → 2" in text


def test_filters_narrow_by_deployment_actor_kind_and_status(client_for, viewer, history):
    client = client_for(viewer)
    assert _ids(client.get("/actions/?deployment=other&kind=scale")) == {history["other"].pk}
    assert {history["scale"].pk, history["restart"].pk}.isdisjoint(_ids(client.get("/actions/?deployment=other")))
    assert _ids(client.get("/actions/?actor=worker-down")) == {history["restart"].pk}
    assert _ids(client.get("/actions/?kind=scale&deployment=demo")) == {history["scale"].pk}
    assert _ids(client.get("/actions/?status=failed")) == {history["restart"].pk}
    assert _ids(client.get("/actions/?actor_type=rule")) == {history["restart"].pk}


def test_unknown_filter_values_and_pages_do_not_break_the_page(client_for, viewer, history):
    client = client_for(viewer)
    for query in ("kind=explode", "status=%00", "page=999", "page=abc", "deployment=" + "x" * 500):
        assert client.get(f"/actions/?{query}").status_code == 200, query
    assert Action.objects.count() >= 3


def test_the_outcome_is_written_in_words_not_as_a_python_dict(client_for, viewer, deployment, operator):
    from controlplane.services import action_succeed

    scale = pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator)
    action_succeed(action_id=scale.pk, result={"role": "decode", "num_ready": 2})
    later = pool_scale(deployment=deployment, role="prefill", replicas=2, actor=operator)
    action_succeed(action_id=later.pk, result={"superseded_by": 12, "odd_detail": ["a", "b"]})
    text = client_for(viewer).get("/actions/").content.decode()
    assert "decode: 2 ready" in text
    assert "superseded by action #12; odd detail: a, b" in text
    assert "{" not in text.split('id="actions"')[1].split("</table>")[0]
