"""Rollout tests: a deployment with revision 2 to try, a real HTTP server standing in for the gateway's /metrics
(the driver reads it over HTTP as it reads the real gateway), and one driver or reconcile pass at a time."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BOUNDS = (0.05, 0.1, 0.5, 1.0, 5.0)


def exposition(revisions: dict[int, dict]) -> str:
    """Gateway-style Prometheus text: per revision {"ok": n, "errors": n, "ttft": seconds, "itl": s, "e2e": s,
    "tokens": n}; every request of a revision observed at that revision's latencies."""
    lines = ["# TYPE tandem_request_success_total counter", "# TYPE tandem_request_errors_total counter",
             "# TYPE tandem_generation_tokens_total counter", "process_cpu_seconds_total 1.0"]
    for name in ("tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                 "tandem_e2e_request_latency_seconds"):
        lines.append(f"# TYPE {name} histogram")
    for revision, r in revisions.items():
        label = f'revision="{revision}"'
        lines.append(f'tandem_request_success_total{{finished_reason="length",{label}}} {r.get("ok", 0)}')
        lines.append(f'tandem_request_errors_total{{kind="upstream_error",{label}}} {r.get("errors", 0)}')
        lines.append(f'tandem_generation_tokens_total{{{label}}} {r.get("tokens", 0)}')
        total = r.get("ok", 0) + r.get("errors", 0)
        for key, name in (("ttft", "tandem_time_to_first_token_seconds"),
                          ("itl", "tandem_inter_token_latency_seconds"),
                          ("e2e", "tandem_e2e_request_latency_seconds")):
            for bound in BOUNDS:
                count = total if r.get(key, 0.01) <= bound else 0
                lines.append(f'{name}_bucket{{le="{bound}",{label}}} {count}')
            lines.append(f'{name}_bucket{{le="+Inf",{label}}} {total}')
            lines.append(f'{name}_count{{{label}}} {total}')
    return "\n".join(lines) + "\n"


class FakeGatewayMetrics:
    """A real HTTP server answering GET /metrics with `revisions` rendered as the gateway's exposition."""

    def __init__(self):
        self.revisions: dict[int, dict] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exposition(owner.revisions).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway_metrics():
    server = FakeGatewayMetrics()
    yield server
    server.close()


@pytest.fixture
def steady(deployment, online_node, make_worker, gateway_metrics):
    """`demo` serving revision 1 (a ready prefill and decode) behind a ready gateway whose /metrics is
    `gateway_metrics`; revision 2 exists (not current) to be tried."""
    from controlplane.models import Revision, WorkerRole
    from controlplane.services.revisions import revision_add

    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    make_worker(deployment, WorkerRole.GATEWAY, port=gateway_metrics.port)
    revision_add(deployment=deployment, actor=deployment.created_by, model_path=None, dtype=None,
                 engine_settings={"common": {"threads": 1}}, comment="try me")
    deployment.refresh_from_db()
    assert Revision.objects.filter(deployment=deployment).count() == 2
    return deployment


@pytest.fixture
def reconcile(django_capture_on_commit_callbacks):
    from controlplane.supervision.reconcile import reconcile_deployment

    def run(deployment):
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile_deployment(deployment.id)

    return run


@pytest.fixture
def make_tried_ready(make_worker):
    """Ready workers of the rollout's revision in each pool (as reconcile and the agent would make them)."""
    def make(rollout):
        from controlplane.models import Worker

        for role in ("prefill", "decode"):
            if not Worker.objects.filter(deployment=rollout.deployment, role=role,
                                         revision=rollout.revision).exists():
                make_worker(rollout.deployment, role, revision=rollout.revision)
    return make
