"""SmolLM2-135M-Instruct: converted once from the wheel's GGUF file into a plain folder that answers a chat prompt.

The first conversion takes ~15 s (GGUF dequantization); later runs reuse var/models/smollm2-135m and are instant.
"""
from __future__ import annotations

import json
import time

import pytest
from transformers import AutoConfig, AutoTokenizer

from inference.models.folder import MARKER_NAME
from inference.models.smollm2 import SourceMissing, check_generation, gguf_path, prepare_smollm2
from tests.conftest import MODELS_DIR


@pytest.fixture(scope="module")
def smollm2_dir(monkeypatch_module):
    try:
        gguf_path()
    except SourceMissing as exc:
        pytest.skip(str(exc))  # the wheel is a `make setup` step; a bare venv without it cannot convert
    return prepare_smollm2(MODELS_DIR / "smollm2-135m", dtype="bfloat16")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield mp


def test_the_folder_is_a_plain_bfloat16_llama_without_gguf_quantization(smollm2_dir):
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.model_type == "llama"
    assert str(config.dtype).endswith("bfloat16")
    assert not hasattr(config, "quantization_config")
    assert (config.num_hidden_layers, config.num_key_value_heads, config.hidden_size) == (30, 3, 576)
    marker = json.loads((smollm2_dir / MARKER_NAME).read_text())
    assert marker["dtype"] == "bfloat16" and marker["source_size"] == gguf_path().stat().st_size


def test_the_saved_tokenizer_applies_the_chatml_template(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                             tokenize=False)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_it_answers_a_chat_prompt_greedily(smollm2_dir):
    assert "Paris" in check_generation(smollm2_dir)


def test_a_second_call_returns_at_once(smollm2_dir):
    start = time.monotonic()
    assert prepare_smollm2(smollm2_dir, dtype="bfloat16") == smollm2_dir
    assert time.monotonic() - start < 10  # room for a loaded host: the unchanged mtime below proves no rebuild


def test_an_unknown_dtype_is_refused(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        prepare_smollm2(tmp_path / "m", dtype="int4")
