"""Supervision unit tests: one reconcile / health / restart pass at a time, against the test database. The tasks
those passes send to the broker are recorded instead (integration tests run the real broker and agent)."""
from __future__ import annotations

import pytest
from django.utils import timezone


@pytest.fixture
def online_node(node):
    node.last_seen_at = timezone.now()
    node.save(update_fields=["last_seen_at"])
    return node


@pytest.fixture
def sent(monkeypatch):
    """Every task message sent, as (task short name, args, queue)."""
    from controlplane import tasks

    messages: list[tuple[str, tuple, str | None]] = []
    for name in ("agent_start_worker", "agent_stop_worker", "reconcile_deployment"):
        task = getattr(tasks, name)

        def apply_async(args=(), kwargs=None, queue=None, _name=name, **options):
            messages.append((_name, tuple(args), queue))

        monkeypatch.setattr(task, "apply_async", apply_async)
        monkeypatch.setattr(task, "delay", lambda *args, _name=name: messages.append((_name, args, None)))
    return messages


@pytest.fixture
def reconcile(django_capture_on_commit_callbacks):
    """reconcile(deployment) → one pass, its on-commit sends executed; returns the pass's summary."""
    from controlplane.supervision.reconcile import reconcile_deployment

    def run(deployment):
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile_deployment(deployment.id)

    return run
