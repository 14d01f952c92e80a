"""What a worker says of its weights reaches its row: a real int8 worker process answers /health, one health pass
keeps its quantization and weight bytes on the row, and the API shows them. Malformed values are not kept."""
from __future__ import annotations

import pytest
import requests
from django.utils import timezone

from controlplane.models import WorkerStatus
from controlplane.models.workers import health_answer_weights
from controlplane.supervision.health import check_health
from tests.inference.worker.support import start_worker

pytestmark = pytest.mark.integration


@pytest.fixture
def int8_worker(tiny_model_dir, tmp_path):
    proc = start_worker("int8", "decode", tiny_model_dir, tmp_path / "logs", "--quantization", "int8")
    yield proc
    proc.stop()


@pytest.mark.django_db
def test_a_health_pass_keeps_the_workers_quantization_and_weight_bytes(int8_worker, deployment, make_worker,
                                                                      viewer_api):
    port = int(int8_worker.url.rsplit(":", 1)[1])
    worker = make_worker(deployment, "decode", status=WorkerStatus.STARTING, port=port, started_at=timezone.now())
    assert (worker.quantization, worker.weight_bytes) == ("", None)
    info = requests.get(f"{int8_worker.url}/info", timeout=30).json()
    assert check_health(deployment.id)["ready"] == [worker.id]
    worker.refresh_from_db()
    assert (worker.status, worker.dtype, worker.quantization) == (WorkerStatus.READY, "float32", "int8")
    assert worker.weight_bytes == info["weight_bytes"] > 0
    listed = viewer_api.get(f"/api/v1/workers/{worker.id}/").json()
    assert (listed["quantization"], listed["weight_bytes"]) == ("int8", info["weight_bytes"])


class _Answer:
    def __init__(self, body):
        self.body = body

    def json(self):
        if isinstance(self.body, Exception):
            raise self.body
        return self.body


@pytest.mark.parametrize("body, expected", [
    ({"quantization": "int8", "weight_bytes": 1234}, {"quantization": "int8", "weight_bytes": 1234}),
    ({"quantization": "<b>x</b>", "weight_bytes": "1234"}, {}),
    ({"quantization": "int8" * 5, "weight_bytes": True}, {}),
    ({"weight_bytes": -5}, {}),
    ({"status": "ok"}, {}),  # an older worker, or a gateway
    (["not", "an", "object"], {}),
    (ValueError("not JSON"), {}),
])
def test_only_well_formed_weights_are_taken_from_an_answer(body, expected):
    assert health_answer_weights(_Answer(body)) == expected
