"""The tiny random-weight Llama: deterministic, loadable offline, chat-ready, instant once built."""
from __future__ import annotations

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.models import tiny
from inference.models.folder import MARKER_NAME
from inference.models.tiny import prepare_tiny


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


def test_two_builds_have_byte_identical_weights_and_tokenizer(fresh_build, tiny_model_dir):
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (fresh_build / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_it_loads_offline_as_a_small_gqa_llama(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "llama"
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 10_000_000
    assert next(model.parameters()).dtype == torch.float32
    assert len(tokenizer) == tiny.VOCAB_SIZE
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.config.eos_token_id == tokenizer.eos_token_id
    text = "def spam(eggs):\n    return 'ünïcode' + eggs  # ok"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_chat_template_renders_chatml_with_a_generation_prompt(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    # The special tokens are single tokens with fixed ids, never split into bytes by BPE.
    assert [tokenizer.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS] == [0, 1, 2]
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert ids[-1] != tokenizer.eos_token_id


def test_greedy_generation_is_varied_with_clear_top1_margins(tiny_model_dir):
    """Equality tests elsewhere compare batched and unbatched greedy runs; they need non-degenerate, stable argmaxes."""
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    inputs = tokenizer("The quick brown fox", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=48, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    new_ids = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(set(new_ids)) > len(new_ids) // 2, tokenizer.decode(new_ids)
    scores = torch.stack(out.scores)[:, 0]  # [steps, vocab]
    top2 = scores.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median() > 0.5


def test_a_second_call_returns_at_once_without_rebuilding(fresh_build):
    mtime = (fresh_build / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    assert prepare_tiny(fresh_build) == fresh_build
    assert time.monotonic() - start < 10  # room for a loaded host: the unchanged mtime below proves no rebuild
    assert (fresh_build / "model.safetensors").stat().st_mtime_ns == mtime
    assert json.loads((fresh_build / MARKER_NAME).read_text()) == tiny.marker()
