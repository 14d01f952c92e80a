"""Browser tests: Debian's Chromium driven by Playwright against pytest-django's live_server (a real HTTP server
thread over the test database). Screenshots of each page go to tests/artifacts/ (git-ignored).

Reconcile runs for real and eagerly inside the web request (Celery's task_always_eager), so a scale-up creates the
new Worker row at once; the node agent's start message is recorded instead of sent (there is no agent process here:
starting tiny-model workers is what tests/controlplane/integration/ does)."""
from __future__ import annotations

import time

import pytest

from tests.browser_support import ARTIFACTS, CHROMIUM, chromium, page, screenshot  # noqa: F401
from tests.dashboards.conftest import (  # noqa: F401  (shared fixtures)
    admin, client_for, deployment, make_deployment, make_user, make_worker, model_dir, node, operator, outsider,
    second_revision, seed_samples, viewer,
)

PASSWORD = "browser-test-password"


@pytest.fixture
def eager_reconcile(monkeypatch):
    """Service calls enqueue reconcile_deployment, which then runs in the web request; agent messages are kept in
    the returned list instead of going to a broker."""
    from controlplane.agent import tasks
    from controlplane.celery import app

    sent: list[tuple[str, tuple]] = []
    for name in ("agent_start_worker", "agent_stop_worker"):
        monkeypatch.setattr(getattr(tasks, name), "apply_async",
                            lambda args=(), kwargs=None, _name=name, **options: sent.append((_name, tuple(args))))
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        yield sent
    finally:
        app.conf.task_always_eager = previous


@pytest.fixture
def fleet(transactional_db, deployment, second_revision, node, make_worker, seed_samples):
    """`demo` on revision 2 with a ready prefill, decode and gateway worker, its node agent online, and ten
    minutes of gateway latency, traffic and per-worker samples."""
    from datetime import timedelta

    from django.utils import timezone

    node.last_seen_at = timezone.now() + timedelta(minutes=10)  # online for the whole test
    node.save(update_fields=["last_seen_at"])
    workers = [make_worker(deployment, role) for role in ("prefill", "decode", "gateway")]
    n = 120
    wave = [0.5 + 0.4 * ((i % 24) / 24) for i in range(n)]
    seed_samples(deployment, "ttft_p99_seconds", [0.2 * w for w in wave])
    seed_samples(deployment, "ttft_p50_seconds", [0.08 * w for w in wave])
    for metric, scale in (("itl_p99_seconds", 0.05), ("itl_p50_seconds", 0.03), ("e2e_p99_seconds", 0.6),
                          ("e2e_p50_seconds", 0.3), ("qps", 2.0), ("error_ratio", 0.01)):
        seed_samples(deployment, metric, [scale * w for w in wave])
    seed_samples(deployment, "generation_tokens_per_second", [40 * w for w in wave], role="decode")
    seed_samples(deployment, "prompt_tokens_per_second", [90 * w for w in wave], role="prefill")
    seed_samples(deployment, "requests_running", [3 * w for w in wave], role="decode")
    seed_samples(deployment, "requests_waiting", [1 * w for w in wave], role="prefill")
    for load, worker in ((0.6, workers[0]), (1.0, workers[1])):
        seed_samples(deployment, "kv_cache_usage_ratio", [0.3 * load * w for w in wave], role=worker.role,
                     worker=worker)
        seed_samples(deployment, "cpu_usage_ratio", [0.9 * load * w for w in wave], role=worker.role,
                     worker=worker)
        seed_samples(deployment, "resident_memory_bytes", [6e8 * load * w for w in wave], role=worker.role,
                     worker=worker)
    return {"deployment": deployment, "workers": workers}


@pytest.fixture
def login(live_server):
    def sign_in(page, user) -> None:
        user.set_password(PASSWORD)
        user.save(update_fields=["password"])
        page.goto(f"{live_server.url}/accounts/login/")
        page.fill("input[name=username]", user.get_username())
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/")

    return sign_in


def wait_until(predicate, *, timeout: float = 10.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")
