"""Alerting fixtures: stored samples written through observability's storage model, a fixed clock, one-pass
evaluation, rules made through the service, and a real local HTTP receiver for webhooks."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def t0():
    return T0


@pytest.fixture
def at():
    """at(seconds) → T0 + seconds."""
    return lambda seconds: T0 + timedelta(seconds=seconds)


@pytest.fixture(autouse=True)
def _receivers_on_loopback(settings):
    # The test receivers listen on 127.0.0.1, which production refuses (test_webhook_destinations.py covers that).
    settings.TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS = True


@pytest.fixture(autouse=True)
def _recent_raw_retention(settings):
    # T0 is a fixed instant; the selectors pick raw samples vs rollups by age against the wall clock, so keep the
    # raw window wide enough that T0 always reads raw samples.
    settings.TANDEM_METRICS_RAW_RETENTION_S = 10 * 365 * 86400
    settings.TANDEM_WEBHOOK_BACKOFF_MS = 10
    settings.TANDEM_WEBHOOK_TIMEOUT_S = 2


@pytest.fixture
def write_sample(db):
    """write_sample(deployment, role, metric, value, when, worker=None): one stored sample (pool aggregate when
    worker is None), as the scraper stores it."""
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Sample

    def write(deployment, role: str, metric: str, value: float, when: datetime, worker=None):
        return Sample.objects.create(ts=when.timestamp(), deployment_id=deployment.pk, role=role,
                                     worker_id=getattr(worker, "pk", worker), metric=METRIC_IDS[metric],
                                     value=value)

    return write


@pytest.fixture
def evaluate(db):
    from controlplane.alerting.services.evaluation import evaluate_rules

    return lambda when: evaluate_rules(now=when)


@pytest.fixture
def make_rule(db):
    """make_rule(deployment, **fields) through the rule service (validation included). Defaults: the decode pool's
    kv_cache_usage_ratio, last value in 60 s, > 0.9, no `for`, no actions, no cooldown."""
    from controlplane.alerting.services.rules import rule_create

    def make(deployment, **fields):
        fields.setdefault("name", f"test-rule-{fields.get('metric', 'kv')}-{len(fields)}")
        fields.setdefault("role", "decode")
        fields.setdefault("metric", "kv_cache_usage_ratio")
        fields.setdefault("aggregation", "last")
        fields.setdefault("window_s", 60)
        fields.setdefault("comparison", ">")
        fields.setdefault("threshold", 0.9)
        fields.setdefault("cooldown_s", 0)
        return rule_create(deployment=deployment, **fields)

    return make


@pytest.fixture
def quiet_deployment(deployment):
    """`demo` without its default rules, so that a test's own rule is the only one evaluated."""
    from controlplane.alerting.models import AlertRule

    AlertRule.objects.filter(deployment=deployment).delete()
    return deployment


def states(rule) -> list[tuple[str, str]]:
    from controlplane.alerting.models import AlertTransition

    return [(t.from_state, t.to_state) for t in AlertTransition.objects.filter(alert__rule=rule).order_by("at", "id")]


class Receiver:
    """A real HTTP server on a free port that records each POST and answers `status`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.status = 200
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps({"ok": receiver.status < 300}).encode())
                receiver.got.set()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()
