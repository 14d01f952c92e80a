"""/v1/models lists the served model in OpenAI's shape, with the dtype each worker behind it runs."""
from __future__ import annotations

import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, shared_workers, start_gateway

pytestmark = pytest.mark.integration


def test_it_shows_the_dtype_each_worker_runs(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    gateway = start_gateway("gateway", ["--prefill", workers["prefill"].url, "--decode", workers["decode"].url,
                                        "--served-model-name", "tiny-chat"], tmp_path_factory.mktemp("gateway-models"))
    try:
        body = requests.get(gateway.url + "/v1/models", timeout=10).json()
    finally:
        gateway.stop()
    (model,) = body["data"]
    assert (model["id"], model["object"], model["owned_by"]) == ("tiny-chat", "model", "tandem")
    # The tiny model is saved in float32, and the workers run the default dtype auto.
    assert model["dtype"] == "float32"
    assert sorted((w["role"], w["url"], w["state"], w["dtype"]) for w in model["workers"]) == [
        ("decode", workers["decode"].url, "ready", "float32"), ("prefill", workers["prefill"].url, "ready", "float32")]
