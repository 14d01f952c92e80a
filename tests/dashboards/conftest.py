"""Dashboard fixtures: the control plane's role users and deployment factories (tests/controlplane/conftest.py),
signed-in browser-like clients per role, and samples written into the observability tables."""
from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.controlplane.conftest import (  # noqa: E402,F401  (fixtures shared with the control plane's tests)
    admin, deployment, fresh_cache, make_deployment, make_user, make_worker, model_dir, node, operator, outsider,
    second_revision, viewer,
)


@pytest.fixture
def client_for(db):
    """client_for(user) → a Django test client signed in as that user (None: anonymous). CSRF checks are on, as
    in a real browser: POSTs send the token the page rendered."""
    from django.test import Client

    def make(user, *, enforce_csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=enforce_csrf)
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture
def seed_samples(db):
    """seed_samples(deployment, metric, values, role=..., worker=None, step_s=5, end=now) writes one sample per
    value into the observability app's Sample table (what the scraper stores), oldest first, ending at `end`."""
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Sample

    def seed(deployment, metric: str, values, *, role: str = "gateway", worker=None, step_s: float = 5.0,
             end: float | None = None) -> int:
        end = time.time() if end is None else end
        values = list(values)
        rows = [Sample(ts=end - (len(values) - 1 - i) * step_s, deployment_id=deployment.pk, role=role,
                       worker_id=getattr(worker, "pk", worker), metric=METRIC_IDS[metric], value=float(v))
                for i, v in enumerate(values)]
        Sample.objects.bulk_create(rows)
        return len(rows)

    return seed
