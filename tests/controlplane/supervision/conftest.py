"""Supervision unit tests: one reconcile / health / restart pass at a time, against the test database. The tasks
those passes send to the broker are recorded instead (integration tests run the real broker and agent)."""
from __future__ import annotations

import pytest


@pytest.fixture
def reconcile(django_capture_on_commit_callbacks):
    """reconcile(deployment) → one pass, its on-commit sends executed; returns the pass's summary."""
    from controlplane.supervision.reconcile import reconcile_deployment

    def run(deployment):
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile_deployment(deployment.id)

    return run
