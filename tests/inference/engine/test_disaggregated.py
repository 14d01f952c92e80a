"""Prefill engine -> exported K/V -> decode engine gives the same tokens as Hugging Face's generate."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import hf_greedy, random_prompts

PROMPT_LENGTHS = [3, 9, 16, 17, 31, 64, 120, 200]
NUM_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def prefill_engine(tiny_model_dir):
    return LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=8 << 20))


@pytest.fixture(scope="module")
def decode_engine(tiny_model_dir):
    # A different block size than the prefill side: the K/V payload is per token, not per block.
    return LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=8 << 20, block_size=8))


def prefill(engine, requests):
    """requests: {id: (prompt, params)} -> {id: StepOutput} once every prompt is prefilled (in chunks of the
    engine's prefill_chunk_size_alone, a prefill engine's steps having no decodes, so over several steps when they
    add up to more)."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    outputs = {}
    for _ in range(100):
        for out in engine.step():
            assert out.request_id not in outputs, "the prefill role reports each request once"
            outputs[out.request_id] = out
        if not engine.has_unfinished():
            break
    assert outputs.keys() == requests.keys(), "the prefill role finishes every request after its prefill"
    return outputs


def run_to_completion(engine, max_steps=1000):
    tokens: dict[str, list[int]] = {}
    finish: dict[str, str] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return tokens, finish
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finish[out.request_id] = out.finish_reason
    raise AssertionError("the decode engine did not finish")


def test_prefill_then_decode_matches_hugging_face_for_eight_concurrent_prompts(prefill_engine, decode_engine,
                                                                             tiny_model_dir):
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = random_prompts(PROMPT_LENGTHS)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS)
    handed = prefill(prefill_engine, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        out = handed[f"r{i}"]
        k, v = out.kv
        assert k.shape == (4, len(prompt), 2, 48) and k.device.type == "cpu" and k.is_contiguous()
        if not out.finished:
            decode_engine.add_prefilled(f"r{i}", prompt, out.new_token_ids[0], params, k, v)
    tokens, _ = run_to_completion(decode_engine)
    for i, prompt in enumerate(prompts):
        first = handed[f"r{i}"].new_token_ids
        assert first + tokens.get(f"r{i}", []) == hf_greedy(hf, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)}"
    assert decode_engine.stats()["num_prefill_tokens_computed"] == 0
    assert decode_engine.stats()["num_kv_blocks_used"] == 0
    assert prefill_engine.stats()["num_kv_blocks_used"] == 0


def test_the_prefill_role_reports_a_request_finished_by_its_first_token(prefill_engine):
    out = prefill(prefill_engine, {"one": ([5, 6, 7], SamplingParams(max_tokens=1))})["one"]
    assert (out.finished, out.finish_reason, len(out.new_token_ids)) == (True, "length", 1)


def test_the_exported_kv_has_the_engines_layout_and_counts_prefill_tokens(prefill_engine):
    before = prefill_engine.stats()["num_prefill_tokens_computed"]
    out = prefill(prefill_engine, {"layout": (list(range(10, 30)), SamplingParams(max_tokens=4))})["layout"]
    layout = prefill_engine.kv_layout
    k, v = out.kv
    assert k.shape == v.shape == (layout["num_layers"], 20, layout["num_kv_heads"], layout["head_dim"])
    assert k.dtype == v.dtype == torch.float32
    assert prefill_engine.stats()["num_prefill_tokens_computed"] == before + 20


def test_a_decode_engine_refuses_kv_of_the_wrong_shape_or_dtype(prefill_engine, decode_engine):
    prompt = list(range(40, 52))
    out = prefill(prefill_engine, {"bad": (prompt, SamplingParams(max_tokens=4))})["bad"]
    k, v = out.kv
    params = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match="k has shape"):
        decode_engine.add_prefilled("bad", prompt[:-1], out.new_token_ids[0], params, k, v)
    with pytest.raises(ValueError, match="dtype"):
        decode_engine.add_prefilled("bad", prompt, out.new_token_ids[0], params, k.half(), v.half())
    with pytest.raises(ValueError, match="first_token_id"):
        decode_engine.add_prefilled("bad", prompt, 10**6, params, k, v)
    assert not decode_engine.has_unfinished()


def test_each_role_refuses_the_other_roles_entry_point(prefill_engine, decode_engine):
    with pytest.raises(ValueError, match="add_prefilled"):
        decode_engine.add_request("x", [1, 2, 3], SamplingParams())
    k = torch.zeros(4, 3, 2, 48)
    with pytest.raises(ValueError, match="role decode"):
        prefill_engine.add_prefilled("x", [1, 2, 3], 4, SamplingParams(), k, k)
