"""Network faults injected by the node agent, seen by a real gateway whose membership is the control plane's own
answer (deployment_endpoints over the Worker rows the agent moves), with real worker processes behind it:

- kv_corrupt on one of two decode workers (real tiny-model workers): every KV push to it arrives with bytes flipped,
  the decode worker refuses it by its checksum, the prefill worker pushes once more, the gateway retries the request
  on the other decode worker, and every client completion equals the fault-free one (greedy): never garbage.
- partition of one of two decode workers (simulated workers) under client requests: once the gateway streams
  through the proxy the partition falls; its probes get no answer, it ejects the worker and the streams in flight
  move to the other decode worker; clients see a stall, never a failure; after the revert the worker is back in
  rotation and serves again."""
from __future__ import annotations

import sys
import threading
import time
from datetime import datetime, timezone as dt_timezone

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from controlplane.agent import faults, processes
from controlplane.models import Worker
from controlplane.selectors import deployment_endpoints
from tests.controlplane.chaos.conftest import fault_leftovers, wait_until
from tests.inference.gateway.support import TOKEN, WORKER_ARGS, ControlPlane, complete, start_gateway
from tests.procs import free_port

AUDIT = {"chaos_run": 1, "experiment": "t"}
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fib(n):"]
pytestmark = pytest.mark.integration


class Stack:
    """Rows of `demo` (a prefill and two decode workers) served by real processes the agent can find (each spawned
    with its row's marker), and a real gateway polling a stand-in control plane that answers deployment_endpoints."""

    def __init__(self, deployment, make_worker, tmp_path, worker_args: list[str]):
        self.deployment = deployment
        self.tmp_path = tmp_path
        self.handles = []
        self.prefill = make_worker(deployment, "prefill")
        self.decodes = [make_worker(deployment, "decode") for _ in range(2)]
        Worker.objects.filter(deployment=deployment).exclude(
            pk__in=[self.prefill.pk, *(w.pk for w in self.decodes)]).delete()
        for row in (self.prefill, *self.decodes):
            port = free_port()
            handle = processes.spawn([sys.executable, "-m", "inference.worker", "--role", row.role, "--port",
                                      str(port), *worker_args], log_path=tmp_path / f"worker-{row.pk}.log",
                                     marker=str(row.pk))
            self.handles.append(handle)
            Worker.objects.filter(pk=row.pk).update(
                pid=handle.pid, port=port,
                started_at=datetime.fromtimestamp(handle.create_time, tz=dt_timezone.utc))
            row.refresh_from_db()
        for row in (self.prefill, *self.decodes):
            wait_until(f"worker {row.pk} to be healthy", lambda r=row: _status(r.url + "/health") == 200,
                       timeout=180)
        self.control_plane = ControlPlane()
        self.control_plane.start()
        self.publish()
        self.gateway = start_gateway("gateway", ["--control-plane", self.control_plane.url, "--deployment", "demo",
                                                 "--token", TOKEN, "--membership-interval", "0.2"], tmp_path,
                                     wait_ready=False)
        self.wait_states("every worker ready", lambda states: len(states) == 3 and all(
            s["state"] == "ready" for s in states.values()))

    def publish(self) -> None:
        """What the control plane answers now (the agent moved a row: the gateway sees it at its next poll)."""
        self.control_plane.endpoints = deployment_endpoints(self.deployment)

    def states(self) -> dict[str, dict]:
        health = requests.get(self.gateway.url + "/health", timeout=10).json()
        return {w["url"]: w for group in health.get("groups", []) for role in ("prefill", "decode")
                for w in group.get(role, [])}

    def wait_states(self, what: str, condition, timeout: float = 30) -> dict:
        return wait_until(what, lambda: (lambda s: s if condition(s) else None)(self.states()), timeout=timeout)

    def close(self) -> None:
        self.gateway.stop()
        self.control_plane.stop()
        for handle in self.handles:
            processes.stop(handle, deadline_s=10)


def _status(url: str, timeout: float = 2) -> int | None:
    try:
        return requests.get(url, timeout=timeout).status_code
    except requests.RequestException:
        return None


def _counter(url: str, name: str, **labels) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture
def stack_of(deployment, make_worker, online_node, tmp_path, settings):
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    stacks = []

    def make(worker_args: list[str]) -> Stack:
        stacks.append(Stack(deployment, make_worker, tmp_path, worker_args))
        return stacks[-1]

    yield make
    for stack in stacks:
        stack.close()


def _texts(gateway_url: str) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        response = complete(gateway_url, {"model": "demo", "prompt": prompt, "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True}, timeout=120)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    return texts


@pytest.mark.django_db(transaction=True)
def test_a_corrupted_kv_push_is_retried_and_the_completion_equals_the_fault_free_one(stack_of, tiny_model_dir):
    stack = stack_of(["--model", str(tiny_model_dir), *WORKER_ARGS])
    fault_free = _texts(stack.gateway.url)
    faulted, other = stack.decodes
    retries_before = _counter(stack.gateway.url, "tandem_gateway_retries_total", kind="kv_transfer")
    refused_before = _counter(faulted.url, "tandem_request_errors_total", kind="invalid_request")

    assert faults.fault_inject(key="g-corrupt", kind="kv_corrupt", worker_id=faulted.pk, until=time.time() + 120,
                               audit=AUDIT, params={"ratio": 1, "bytes": 1}) == "proxied"
    stack.publish()
    kv_url = f"http://{faulted.host}:{Worker.objects.get(pk=faulted.pk).kv_port}"
    stack.wait_states("the gateway to hand out the KV address", lambda s: s[faulted.url].get("kv_url") == kv_url)
    # Twice over: the gateway alternates between the two decode workers, so the faulted one gets its share.
    assert _texts(stack.gateway.url) == fault_free
    assert _texts(stack.gateway.url) == fault_free
    retries = _counter(stack.gateway.url, "tandem_gateway_retries_total", kind="kv_transfer") - retries_before
    refused = _counter(faulted.url, "tandem_request_errors_total", kind="invalid_request") - refused_before
    print(f"kv_corrupt: {retries:g} requests retried on the other decode worker, {refused:g} pushes refused")
    assert retries >= 2
    # Each attempt on it: a push refused by its checksum and pushed once more (a flip in the framing is refused by
    # what it broke, and not pushed again).
    assert retries <= refused <= 2 * retries
    assert _counter(other.url, "tandem_request_errors_total", kind="invalid_request") == 0

    assert faults.fault_revert(key="g-corrupt", kind="kv_corrupt", worker_id=faulted.pk, audit=AUDIT) == "restored"
    stack.publish()
    stack.wait_states("the KV address to be gone", lambda s: "kv_url" not in s[faulted.url])
    wait_until("nothing left", lambda: not fault_leftovers(keys=["g-corrupt"], ports={faulted.pk: faulted.port}))
    assert _texts(stack.gateway.url) == fault_free


class Load(threading.Thread):
    """One client request of `max_tokens` after another until stopped: (status, completion tokens, seconds) of
    each."""

    def __init__(self, gateway_url: str, max_tokens: int):
        super().__init__(daemon=True)
        self.gateway_url, self.max_tokens = gateway_url, max_tokens
        self.results: list[tuple[int, int, float]] = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            began = time.monotonic()
            tokens = 0
            try:
                response = complete(self.gateway_url, {"model": "demo", "prompt": "a b c", "ignore_eos": True,
                                                       "max_tokens": self.max_tokens}, timeout=60)
                status = response.status_code
                if status == 200:
                    tokens = response.json()["usage"]["completion_tokens"]
            except requests.RequestException:
                status = 0
            self.results.append((status, tokens, time.monotonic() - began))


@pytest.mark.django_db(transaction=True)
def test_a_partitioned_decode_worker_is_ejected_its_streams_move_and_no_client_request_fails(stack_of):
    """The partition begins 5 s after the proxy takes the worker's place: by then the gateway streams through the
    proxy (requests of 3-7 s each), so the partition stalls streams in flight, which move to the other decode worker
    once the gateway's probes of the worker go unanswered, and holds KV pushes, whose requests are retried."""
    stack = stack_of(["--simulate", "tiny-cpu", "--model", "/m/sim"])
    partitioned, other = stack.decodes
    port = partitioned.port
    # Of different lengths, started apart: some are always mid-stream, whenever the partition falls.
    loads = [Load(stack.gateway.url, max_tokens=900 + 200 * number) for number in range(6)]
    for load in loads:
        load.start()
        time.sleep(0.5)
    try:
        wait_until("requests to flow", lambda: sum(len(load.results) for load in loads) >= 4, timeout=60)
        migrated_before = _counter(stack.gateway.url, "tandem_request_migrations_total")
        assert faults.fault_inject(key="g-part", kind="partition", worker_id=partitioned.pk,
                                   until=time.time() + 60, audit=AUDIT, params={"onset_s": 5}) == "proxied"
        stack.publish()
        proxy_url = Worker.objects.get(pk=partitioned.pk).url
        stack.wait_states("the gateway to route through the proxy", lambda s: partitioned.url not in s
                          and s.get(proxy_url, {}).get("state") == "ready")
        states = stack.wait_states("the gateway to eject the partitioned worker",
                                   lambda s: s.get(proxy_url, {}).get("state") == "down")
        assert "no answer" in states[proxy_url]["reason"], states
        wait_until("a stream to move", lambda: _counter(stack.gateway.url, "tandem_request_migrations_total")
                   > migrated_before)
        served_before = _counter(f"http://127.0.0.1:{port}", "tandem_request_success_total")

        assert faults.fault_revert(key="g-part", kind="partition", worker_id=partitioned.pk,
                                   audit=AUDIT) == "restored"
        stack.publish()
        stack.wait_states("the worker back in rotation", lambda s: s.get(partitioned.url, {}).get("state") == "ready")
        wait_until("the worker to serve again",
                   lambda: _counter(partitioned.url, "tandem_request_success_total") > served_before, timeout=60)
    finally:
        for load in loads:
            load.halt.set()
        for load in loads:
            load.join(timeout=90)
    results = [result for load in loads for result in load.results]
    migrated = _counter(stack.gateway.url, "tandem_request_migrations_total") - migrated_before
    slowest = max(seconds for _, _, seconds in results)
    print(f"partition: {len(results)} client requests, {sum(r[0] == 200 for r in results)} answered 200 with all "
          f"their tokens, {migrated:g} streams moved, slowest {slowest:.2f} s")
    assert all(status == 200 and tokens == load.max_tokens for load in loads for status, tokens, _ in load.results)
    wait_until("nothing left", lambda: not fault_leftovers(keys=["g-part"], ports={partitioned.pk: port}))
