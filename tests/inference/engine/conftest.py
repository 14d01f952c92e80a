"""The engine tests' shared fixture: Hugging Face's own model of the tiny test model, the reference they are held to."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
