"""The deployment page's workers table shows the weight memory each worker reported and its quantization."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _weights_cell(html: str, worker) -> str:
    match = re.search(rf'<td class="num" data-testid="weights-{worker.pk}">(.*?)</td>', html, re.S)
    assert match, f"no weights cell for worker #{worker.pk}"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def test_each_worker_shows_its_weight_bytes_and_quantization(client_for, viewer, deployment, make_worker):
    int8 = make_worker(deployment, "decode", dtype="float32", quantization="int8", weight_bytes=136_995_520)
    plain = make_worker(deployment, "prefill", dtype="float32", quantization="none", weight_bytes=538_060_288)
    starting = make_worker(deployment, "prefill", status="starting")
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _weights_cell(html, int8) == "130.6 MiB int8"
    assert _weights_cell(html, plain) == "513.1 MiB"
    assert _weights_cell(html, starting) == "–"  # not reported yet
