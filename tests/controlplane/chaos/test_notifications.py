"""A chaos run that ends aborted or failed tells every enabled notification channel once, with its verdict, reasons
and the report's address; one that passed tells nobody. Delivered to a real local webhook receiver, signed, by the
alerting app's delivery task."""
from __future__ import annotations

import json
import time

import pytest

from controlplane.alerting.models import Channel, Delivery
from controlplane.alerting.webhooks.signing import verify_signature
from controlplane.chaos.models import ChaosRun, Verdict
from controlplane.chaos.services import run_abort, run_finish, run_start
from tests.controlplane.alerting.conftest import Receiver
from tests.controlplane.chaos.conftest import chaos_pass
from tests.controlplane.chaos.test_driver import steady_history

SECRET = "chaos-secret-0123456789"


@pytest.fixture
def receiver(settings):
    settings.TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS = True  # the receiver listens on 127.0.0.1
    settings.TANDEM_WEBHOOK_TIMEOUT_S = 5
    settings.TANDEM_PUBLIC_URL = "https://tandem.example"
    server = Receiver()
    yield server
    server.close()


@pytest.mark.django_db
def test_an_aborted_run_notifies_the_channels_once_with_its_report(experiment, gateway, operator, receiver,
                                                                   agent_inline, django_capture_on_commit_callbacks):
    Channel.objects.create(name="ops", kind="webhook", url=receiver.url, secrets=[SECRET])
    Channel.objects.create(name="chat", kind="slack", url=receiver.url)
    Channel.objects.create(name="off", kind="webhook", url=receiver.url, enabled=False)
    steady_history(gateway, time.time())
    # The agent's tasks and the delivery task run eagerly here when the commit callbacks run (agent_inline).
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
        run_abort(run=run, actor=operator, reason="enough")
        run_abort(run=run, actor=operator)  # recovering: stop waiting, finish now
    run.refresh_from_db()
    assert run.verdict == Verdict.ABORTED
    assert receiver.got.wait(10)
    assert sorted(Delivery.objects.values_list("channel__name", "status", "event")) == [
        ("chat", "succeeded", "aborted"), ("ops", "succeeded", "aborted")]
    assert len(receiver.requests) == 2
    webhook = next(r for r in receiver.requests if "Tandem-Signature" in r["headers"])
    assert verify_signature(webhook["headers"]["Tandem-Signature"], webhook["body"], [SECRET])
    body = json.loads(webhook["body"])
    assert body["kind"] == "chaos_run_aborted" and body["verdict"] == "aborted"
    assert body["chaos_run"] == run.pk and body["experiment"] == "pause-decode" and body["deployment"] == "demo"
    assert body["reasons"][0] == "enough"
    assert body["report_url"] == f"https://tandem.example/deployments/demo/chaos/runs/{run.pk}"
    assert body["report_json_url"] == f"https://tandem.example/api/v1/deployments/demo/chaos/runs/{run.pk}/report"
    slack = json.loads(next(r for r in receiver.requests if "Tandem-Signature" not in r["headers"])["body"])
    assert slack["text"].startswith(f"Chaos run {run.pk} (pause-decode) of demo aborted: enough")
    assert body["report_url"] in slack["text"]

    # A second finish (another driver) queues nothing more.
    assert run_finish(run=ChaosRun.objects.get(pk=run.pk)) is False
    assert Delivery.objects.count() == 2


@pytest.mark.django_db
def test_a_run_that_passed_notifies_nobody(experiment, world, gateway, operator, receiver, agent_inline,
                                           django_capture_on_commit_callbacks):
    Channel.objects.create(name="ops", kind="webhook", url=receiver.url)
    t = time.time()
    ok = steady_history(gateway, t)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    gateway.serve(ok + 10)
    chaos_pass(now=t + 2)
    with django_capture_on_commit_callbacks(execute=True):
        chaos_pass(now=t + 6)  # the duration is over: reverted
    gateway.serve(ok + 20)
    chaos_pass(now=t + 7)
    with django_capture_on_commit_callbacks(execute=True):
        gateway.serve(ok + 30)
        chaos_pass(now=t + 9)  # recovered, every revert reported: finished
    run.refresh_from_db()
    assert run.verdict == Verdict.PASSED
    assert not Delivery.objects.exists() and receiver.requests == []
