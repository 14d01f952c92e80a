"""The deployment page's workers table shows the dtype each worker runs, as it reported it, next to what its
revision asked for."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _dtype_cell(html: str, worker) -> str:
    match = re.search(rf'<td data-testid="dtype-{worker.pk}">(.*?)</td>', html, re.S)
    assert match, f"no dtype cell for worker #{worker.pk}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def test_each_worker_shows_the_dtype_it_runs(client_for, viewer, deployment, make_worker):
    reported = make_worker(deployment, "decode", dtype="bfloat16")
    starting = make_worker(deployment, "prefill", status="starting")
    gateway = make_worker(deployment, "gateway")
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert deployment.current_revision.dtype == "auto"
    assert _dtype_cell(html, reported) == "bfloat16 (auto)"  # runs bfloat16; its revision asked for auto
    assert _dtype_cell(html, starting) == "auto?"  # not reported yet: what was asked
    assert _dtype_cell(html, gateway) == "–"


def test_a_worker_running_what_was_asked_shows_it_once(client_for, viewer, make_deployment, make_worker):
    pinned = make_deployment("pinned", dtype="float32")
    worker = make_worker(pinned, "decode", dtype="float32")
    html = client_for(viewer).get("/deployments/pinned/").content.decode()
    assert _dtype_cell(html, worker) == "float32"
