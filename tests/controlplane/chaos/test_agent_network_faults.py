"""The node agent's network faults on real simulated workers: a `partition` points the worker's row at a fault proxy
that answers nothing, health checks included, until its revert; a KV fault (`kv_latency`, `kv_reset`, `kv_corrupt`)
moves only the decode worker's KV address (the membership's `kv_urls`), so that a prefill worker's push crosses the
proxy while everything else reaches the worker directly; each is reverted by a revert, by the agent's own deadline,
from the injected row by an agent restarted meanwhile, and by a run's abort, and leaves nothing behind."""
from __future__ import annotations

import time

import pytest
import requests

from controlplane.agent import fault_holds, faults
from controlplane.chaos.services import experiment_create, run_abort, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, Worker
from controlplane.selectors import deployment_endpoints
from inference.worker.sim.kv import encode_fake_payload
from tests.controlplane.chaos.conftest import fault_leftovers, simulated_worker_for, wait_until

AUDIT = {"chaos_run": 1, "experiment": "t"}
pytestmark = pytest.mark.integration


@pytest.fixture
def sim_decode(world, tmp_path, settings):
    """world's decode row, served by a real simulated decode worker."""
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    with simulated_worker_for(world["decode"], "decode", tmp_path / "sim.log") as decode:
        yield decode


def _status(url: str, timeout: float = 2) -> int | str:
    try:
        return requests.get(url, timeout=timeout).status_code
    except requests.Timeout:
        return "timeout"
    except requests.RequestException:
        return "refused"


def _push(url: str, decode: Worker, request_id: str) -> requests.Response:
    layout = requests.get(decode.url + "/info", timeout=10).json()["kv_layout"]
    header = {"request_id": request_id, "prompt_token_ids": list(range(1, 30)), "first_token_id": 5,
              "sampling": {"max_tokens": 4}, "kv_layout": layout}
    return requests.post(url + "/v1/kv", data=encode_fake_payload(header, layout), timeout=30,
                         headers={"Content-Type": "application/octet-stream"})


def _injected(key: str) -> dict:
    return Action.objects.get(idempotency_key=faults.injected_key(key)).result


def _nothing_left(keys, ports) -> None:
    wait_until("every fault to leave nothing behind", lambda: not fault_leftovers(keys=keys, ports=ports))


@pytest.mark.django_db(transaction=True)
def test_a_partition_answers_nothing_health_included_until_its_revert(sim_decode):
    port = sim_decode.port
    assert faults.fault_inject(key="n-part", kind="partition", worker_id=sim_decode.pk, until=time.time() + 60,
                               audit=AUDIT, params={}) == "proxied"
    row = Worker.objects.get(pk=sim_decode.pk)
    assert row.port == _injected("n-part")["proxy_port"] != port and row.kv_port is None
    # What the gateway's probes and the control plane's health checks meet: no answer at all.
    assert _status(row.url + "/health", timeout=1) == "timeout"
    assert _status(f"http://127.0.0.1:{port}/health") == 200  # the worker itself runs on

    assert faults.fault_revert(key="n-part", kind="partition", worker_id=sim_decode.pk, audit=AUDIT) == "restored"
    row.refresh_from_db()
    assert row.port == port and _status(row.url + "/health") == 200
    _nothing_left(["n-part"], {sim_decode.pk: port})


@pytest.mark.django_db(transaction=True)
def test_a_kv_fault_moves_only_the_kv_address_until_the_agents_deadline(sim_decode):
    port = sim_decode.port
    assert faults.fault_inject(key="n-kv", kind="kv_corrupt", worker_id=sim_decode.pk, until=time.time() + 4,
                               audit=AUDIT, params={"ratio": 1, "bytes": 1}) == "proxied"
    row = Worker.objects.get(pk=sim_decode.pk)
    state = _injected("n-kv")
    assert row.port == port and row.kv_port == state["proxy_port"] and state["kv"] is True
    kv_url = f"http://{row.host}:{row.kv_port}"
    group, = deployment_endpoints(row.deployment)["groups"]
    assert group["kv_urls"] == {row.url: kv_url} and group["decode"] == [row.url]
    refused = _push(kv_url, row, "n-kv-1")
    assert refused.status_code == 400 and "bad KV payload" in refused.text  # every push through it is corrupted
    assert _push(row.url, row, "n-kv-2").status_code == 200  # the gateway's path is untouched
    # No revert is ever sent.
    wait_until("the KV address to be gone", lambda: Worker.objects.get(pk=sim_decode.pk).kv_port is None)
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("n-kv")).first())
    assert reverted.result["outcome"] == "restored" and reverted.result["by"] == "the agent's deadline"
    assert "kv_urls" not in deployment_endpoints(row.deployment)["groups"][0]
    _nothing_left(["n-kv"], {sim_decode.pk: port})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind, params", [("kv_reset", {"ratio": 1}), ("kv_latency", {"ms": 1500})])
def test_an_agent_restarted_meanwhile_reverts_a_kv_fault_from_the_injected_row(sim_decode, kind, params):
    port = sim_decode.port
    key = f"n-{kind}"
    faults.fault_inject(key=key, kind=kind, worker_id=sim_decode.pk, until=time.time() + 60, audit=AUDIT,
                        params=params)
    row = Worker.objects.get(pk=sim_decode.pk)
    kv_url = f"http://{row.host}:{row.kv_port}"
    if kind == "kv_reset":
        with pytest.raises(requests.ConnectionError):
            _push(kv_url, row, "n-reset")
    else:
        began = time.monotonic()
        assert _push(kv_url, row, "n-slow").status_code == 200
        assert time.monotonic() - began >= 1.5
    with fault_holds.held_lock:  # the agent restarts: its timers and what it held are gone
        fault_holds.held.pop(key).timer.cancel()
    assert faults.fault_revert(key=key, kind=kind, worker_id=sim_decode.pk, audit=AUDIT) == "restored"
    _nothing_left([key], {sim_decode.pk: port})


@pytest.mark.django_db(transaction=True)
def test_a_runs_abort_reverts_a_kv_fault_and_a_partition_and_leaves_nothing(
        world, sim_decode, admin, operator, agent_inline, django_capture_on_commit_callbacks):
    port = sim_decode.port
    for name, fault in (("kv-corrupt", {"kind": "kv_corrupt", "bytes": 4}), ("partition", {"kind": "partition"})):
        experiment = experiment_create(
            deployment=world["deployment"], actor=admin, name=name, target={"role": "decode", "count": 1},
            faults=[fault], duration_s=60, hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])
        with django_capture_on_commit_callbacks(execute=True):
            run = run_start(experiment=experiment, actor=operator)
        key, = [fault["key"] for fault in type(run).objects.get(pk=run.pk).faults]
        assert _injected(key)["outcome"] == "proxied"
        assert fault_leftovers(keys=[key], ports={sim_decode.pk: port})  # the fault is in place
        with django_capture_on_commit_callbacks(execute=True):
            run_abort(run=run, actor=operator)
        assert Action.objects.get(idempotency_key=faults.reverted_key(key)).result["outcome"] == "restored"
        _nothing_left([key], {sim_decode.pk: port})
        type(run).objects.filter(pk=run.pk).update(status="finished")


@pytest.mark.django_db
@pytest.mark.parametrize("role, fault, field", [
    ("prefill", {"kind": "kv_corrupt"}, "faults[0].kind"),
    ("decode", {"kind": "kv_latency"}, "faults[0].ms"),
    ("decode", {"kind": "kv_corrupt", "bytes": 0}, "faults[0].bytes"),
    ("decode", {"kind": "kv_corrupt", "bytes": 2.5}, "faults[0].bytes"),
    ("decode", {"kind": "kv_reset", "ratio": 2}, "faults[0].ratio"),
    ("decode", {"kind": "partition", "ratio": 1}, "faults[0].ratio"),
    ("decode", {"kind": "partition", "onset_s": 30}, "faults[0].onset_s"),  # begins when the 30 s are over
    ("decode", {"kind": "partition", "duration_s": 4}, "faults[0].onset_s"),  # the default 5 s, likewise
    ("decode", {"kind": "blackhole"}, "faults[0].kind"),
])
def test_bad_network_faults_are_400s_naming_the_field(world, admin, role, fault, field):
    with pytest.raises(ControlPlaneError) as error:
        experiment_create(deployment=world["deployment"], actor=admin, name="bad", target={"role": role, "count": 1},
                          faults=[fault], duration_s=30,
                          hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])
    assert error.value.status == 400 and error.value.extra["field"] == field, error.value.message
