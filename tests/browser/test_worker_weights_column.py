"""The deployment page in a browser: the workers table shows each worker's weight memory and quantization as the
worker reported them, and a worker that reports later (a restart into an int8 revision) shows up on the next live
refresh without a reload."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_the_weights_column_shows_what_workers_report_and_follows_new_reports(page, live_server, login, viewer,
                                                                            fleet, screenshot):
    from controlplane.models import Worker

    prefill, decode, gateway = fleet["workers"]
    Worker.objects.filter(id=prefill.id).update(dtype="float32", quantization="int8", weight_bytes=136_995_520)
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    cell = page.locator(f"[data-testid='weights-{prefill.pk}']")
    assert " ".join(cell.inner_text().split()) == "130.6 MiB int8"
    assert page.locator(f"[data-testid='weights-{decode.pk}']").inner_text().strip() == "–"
    assert page.locator(f"[data-testid='weights-{gateway.pk}']").inner_text().strip() == "–"

    Worker.objects.filter(id=decode.id).update(dtype="float32", quantization="none", weight_bytes=538_060_288)
    page.wait_for_function(
        f"() => (document.querySelector(\"[data-testid='weights-{decode.pk}']\") || {{}}).innerText === '513.1 MiB'",
        timeout=30_000)
    screenshot(page, "deployment-worker-weights")
    assert page.js_errors == []
