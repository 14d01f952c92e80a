"""A KV push that reaches a decode worker still loading its model is told to come back (503 `starting`), as any
other request is: its body limit depends on the model's KV layout, which it does not have yet."""
from __future__ import annotations

import requests

from tests.inference.worker.inprocess import InProcessWorker, wait_for_status
from tests.inference.worker.support import HTTP_TIMEOUT_S


def test_a_kv_push_to_a_decode_worker_still_loading_is_a_503_starting(tiny_model_dir):
    worker = InProcessWorker("--role", "decode", "--model", str(tiny_model_dir), "--threads", "1",
                             "--kv-cache-bytes", "8M", hold_load=True).start()
    try:
        wait_for_status(worker.url, "starting")
        response = requests.post(f"{worker.url}/v1/kv", data=b"\x00" * 64, timeout=HTTP_TIMEOUT_S)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "starting"
    finally:
        worker.stop()
