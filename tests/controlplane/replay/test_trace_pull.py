"""The pull: a real gateway's request trace read through its scrape-token route into the deployment's recorded
trace, once each (a second pass stores nothing again), sampled as the operator asked, and a gateway that does not
answer costs only its own records. Real gateway and simulated worker processes."""
from __future__ import annotations

import time

import pytest
import requests

from inference.gateway.config import SCRAPE_TOKEN_ENV
from tests.inference.gateway.support import stop_all
from tests.procs import free_port, start, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker):
    from controlplane.lib.worker_keys import scrape_token

    with django_db_blocker.unblock():
        token = scrape_token()
    log_dir = tmp_path_factory.mktemp("trace-pull")
    port, gw_port = free_port(), free_port()
    worker = start("sim-worker", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated",
                                  "--model", "/models/sim-model", "--port", str(port)], log_dir)
    gateway = start("gateway", ["-m", "inference.gateway", "--port", str(gw_port), "--colocated",
                                f"http://127.0.0.1:{port}"], log_dir, env={SCRAPE_TOKEN_ENV: token})
    gateway.url, gateway.port = f"http://127.0.0.1:{gw_port}", gw_port
    try:
        wait_http(gateway, gateway.url + "/health", timeout=60)
        yield gateway
    finally:
        stop_all([gateway, worker])


def _send(gateway, n: int) -> None:
    for i in range(n):
        answer = requests.post(gateway.url + "/v1/completions", timeout=60,
                               json={"model": "tandem", "prompt": f"request {i} " * 80, "max_tokens": 3})
        assert answer.status_code == 200


def test_a_gateways_trace_lands_once_in_the_recorded_trace(gateway, deployment, make_worker):
    from controlplane.lib.worker_keys import scrape_headers
    from controlplane.replay.ingest import pull_all
    from controlplane.replay.models import Trace, TraceCursor, TraceRequest

    make_worker(deployment, "gateway", port=gateway.port)
    silent = make_worker(deployment, "gateway", port=free_port())  # a gateway that does not answer
    _send(gateway, 4)
    first = pull_all()
    assert first["gateways"] == 2 and first["failed"] == 1 and first["stored"] >= 4
    trace = Trace.objects.get(deployment=deployment, name="recorded")
    rows = list(TraceRequest.objects.filter(trace=trace).order_by("at_s"))
    assert len(rows) == first["stored"]
    last = rows[-1]
    assert last.outcome == "ok" and last.completion_tokens == 3 and last.prompt_tokens > 0
    assert 0 < last.ttft_s <= last.e2e_s and len(last.hashes) >= 2 and last.block_tokens >= 1
    assert abs(trace.start.timestamp() + last.at_s - time.time()) < 120
    assert pull_all()["stored"] == 0 and TraceRequest.objects.filter(trace=trace).count() == len(rows)

    trace.sample = 0.0
    trace.save()
    _send(gateway, 2)
    assert pull_all()["stored"] == 0
    # Not kept, but read: the cursor stands at the gateway's last record.
    cursor = TraceCursor.objects.exclude(gateway_id=silent.id).get()
    assert cursor.last == requests.get(gateway.url + "/trace", headers=scrape_headers(), timeout=10).json()["last"]
    assert TraceRequest.objects.filter(trace=trace).count() == len(rows)
