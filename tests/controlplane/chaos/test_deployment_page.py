"""The deployment page's chaos card: the opt-in, experiments and game days, the active run with its checks as the
driver last judged them and an Abort button for operators (which reverts every fault through the same service as
the API), and recent runs with their verdicts."""
from __future__ import annotations

import re
import time

import pytest
from django.test import Client

from controlplane.chaos.models import ChaosRun, RunStatus
from controlplane.chaos.schedules import schedule_create
from controlplane.chaos.services import run_start
from controlplane.models import Action
from tests.controlplane.chaos.conftest import chaos_pass, process_state, wait_until
from tests.controlplane.chaos.test_driver import steady_history

PAGE = "/deployments/demo/"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def card(html: str) -> str:
    return re.search(r'<section class="card" id="chaos">(.*?)</section>', html, re.S).group(1)


@pytest.mark.django_db
def test_the_card_shows_the_active_run_and_an_operator_aborts_it(experiment, world, gateway, admin, operator, viewer,
                                                                agent_inline, django_capture_on_commit_callbacks):
    schedule_create(experiment=experiment, actor=admin, cron="0 10 * * 2", timezone_name="Europe/Paris")
    t = time.time()
    ok = steady_history(gateway, t)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    wait_until("the decode worker paused", lambda: process_state(world["handle"].pid) == "stopped")
    gateway.serve(ok + 10, errors=10)  # half the requests of this pass fail: the error check fails
    chaos_pass(now=time.time())

    html = card(signed_in(viewer).get(PAGE).content.decode())
    assert 'id="chaos-enabled">opted in' in html
    assert 'data-experiment="pause-decode"' in html and "0 10 * * 2</code> Europe/Paris" in html
    assert f'data-run="{run.pk}"' in html and "during the faults" in html
    checks = re.findall(r'<tr data-check="(\d)">.*?class="pill (ok|bad)"', html, re.S)
    assert checks == [("0", "bad"), ("1", "ok"), ("2", "ok")]
    assert 'data-testid="chaos-abort"' not in html  # a viewer sees no button
    assert signed_in(viewer).post(f"/deployments/demo/chaos/runs/{run.pk}/abort").status_code == 403

    operator_page = card(signed_in(operator).get(PAGE).content.decode())
    assert 'data-testid="chaos-abort"' in operator_page
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_in(operator).post(f"/deployments/demo/chaos/runs/{run.pk}/abort",
                                            {"reason": "enough"}, follow=True)
    assert "every fault is being reverted" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.RECOVERING and run.abort_reason == "dashboard: enough"
    aborted = Action.objects.get(params__event="chaos_aborted")
    assert aborted.actor == operator.username
    wait_until("the decode worker resumed", lambda: process_state(world["handle"].pid) != "stopped")


@pytest.mark.django_db
def test_finished_runs_are_listed_with_their_verdict_and_report(experiment, world, gateway, operator, viewer,
                                                                agent_inline, django_capture_on_commit_callbacks):
    from controlplane.chaos.services import run_abort

    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
        run_abort(run=run, actor=operator)
        run_abort(run=run, actor=operator)
    assert ChaosRun.objects.get().verdict == "aborted"
    html = card(signed_in(viewer).get(PAGE).content.decode())
    assert f'href="/api/v1/deployments/demo/chaos/runs/{run.pk}/report"' in html
    assert 'class="pill warn"' in html and ">aborted</span>" in html
    assert 'id="chaos-active"' not in html
