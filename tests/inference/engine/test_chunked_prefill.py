"""Chunked prefill: a prompt prefilled in chunks (inside blocks, at block edges, beside running decodes, preempted
half way, on the prefill role) gives exactly Hugging Face's greedy tokens (float32 on both sides)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import hf_greedy, random_prompts

BLOCK_SIZE = 16
NUM_NEW_TOKENS = 12
SMOLLM2 = MODELS_DIR / "smollm2-135m"


def engine_of(model_dir, **settings):
    """An engine whose every step has the chunk given (prefill_chunk_size, also in steps without decodes), unless
    prefill_chunk_size_alone says otherwise."""
    settings = {"threads": 1, "kv_cache_bytes": 8 << 20, "block_size": BLOCK_SIZE, **settings}
    if "prefill_chunk_size" in settings:
        settings.setdefault("prefill_chunk_size_alone", settings["prefill_chunk_size"])
    return LLMEngine(Config(model=model_dir, **settings))


def step(engine, tokens):
    """One step; adds its tokens to `tokens` and returns the ids of the requests that got one."""
    outputs = engine.step()
    for out in outputs:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return [out.request_id for out in outputs]


def run(engine, max_steps=5000):
    """Step to completion: {request_id: the tokens produced from here on}."""
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("chunk, where", [
    (5, "inside a block: chunks end at 5, 10, 15, 20..."),
    (BLOCK_SIZE, "exactly at block edges"),
    (2 * BLOCK_SIZE, "at every other block edge"),
    (BLOCK_SIZE + 1, "one past a block edge, then drifting"),
])
def test_a_prompt_prefilled_in_chunks_matches_hugging_face(tiny_model_dir, hf_model, chunk, where):
    engine = engine_of(tiny_model_dir, prefill_chunk_size=chunk)
    prompts = random_prompts([1, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE, 90], seed=7)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)} tokens, {where}"
    assert engine.stats()["num_prefill_tokens_computed"] == sum(map(len, prompts))


def test_a_partial_chunk_reports_nothing_and_holds_blocks_for_the_whole_prompt(tiny_model_dir):
    engine = engine_of(tiny_model_dir, prefill_chunk_size=BLOCK_SIZE)
    (prompt,) = random_prompts([40], seed=8)
    engine.add_request("long", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    assert engine.step() == [] and engine.num_step_tokens == BLOCK_SIZE
    (seq,) = engine.scheduler.running
    assert seq.num_cached_tokens == BLOCK_SIZE and len(seq.block_table) == 3  # 40 tokens: 3 blocks from the start
    assert engine.step() == []
    (out,) = engine.step()  # the last 8 tokens: the chunk that ends the prompt samples
    assert out.request_id == "long" and len(out.new_token_ids) == 1 and engine.num_step_tokens == 8


def test_a_long_prompt_is_chunked_between_the_decodes_of_running_streams(tiny_model_dir, hf_model):
    engine = engine_of(tiny_model_dir, prefill_chunk_size=24)
    short_prompts = random_prompts([6, 9], seed=9)
    (long_prompt,) = random_prompts([150], seed=10)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(short_prompts):
        engine.add_request(f"short{i}", prompt, params)
    for out in engine.step():
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    # Every step while the long prompt is prefilled also decodes both short streams, inside the step budget.
    num_chunk_steps = 0
    while "long" not in tokens:
        outputs = engine.step()
        assert engine.num_step_tokens <= 24
        assert {out.request_id for out in outputs} >= {"short0", "short1"}
        num_chunk_steps += 1
        for out in outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert num_chunk_steps == -(-150 // (24 - 2))  # 22 prompt tokens a step beside the 2 decodes
    for request_id, out_tokens in run(engine).items():
        tokens[request_id] += out_tokens
    for i, prompt in enumerate(short_prompts):
        assert tokens[f"short{i}"] == hf_greedy(hf_model, prompt, 20), f"short{i}"
    assert tokens["long"] == hf_greedy(hf_model, long_prompt, 4)


def test_a_partly_prefilled_sequence_is_preempted_and_recomputed_from_scratch(tiny_model_dir, hf_model):
    probe = engine_of(tiny_model_dir, kv_cache_bytes=1 << 20)
    # 4 blocks of 16 tokens: the stream (15 prompt tokens) holds 1, the long prompt (48 tokens) takes the other 3,
    # so when the stream's 17th token needs a second block, the newest running sequence, the long prompt still
    # being prefilled in chunks of 8, is preempted.
    engine = engine_of(tiny_model_dir, kv_cache_bytes=4 * probe.model_runner.pool.num_bytes_per_block,
                       prefill_chunk_size=8)
    stream_prompt, long_prompt = random_prompts([15, 48], seed=11)
    engine.add_request("stream", stream_prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    assert step(engine, tokens) == []
    assert step(engine, tokens) == ["stream"]  # 8 + 7 prompt tokens, then its first token
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    step(engine, tokens)  # the stream decodes its 16th token (same block); the long prompt gets 3 blocks and 7 tokens
    (long_seq,) = [seq for seq in engine.scheduler.running if seq.request_id == "long"]
    assert long_seq.num_cached_tokens == 7 and engine.stats()["num_kv_blocks_used"] == 4
    step(engine, tokens)
    assert long_seq in engine.scheduler.waiting and not long_seq.block_table and long_seq.num_cached_tokens == 0
    assert engine.stats()["num_preemptions"] == 1
    for request_id, out_tokens in run(engine).items():
        tokens.setdefault(request_id, []).extend(out_tokens)
    assert engine.stats()["num_prefill_tokens_computed"] == len(stream_prompt) + 7 + len(long_prompt)
    assert tokens["stream"] == hf_greedy(hf_model, stream_prompt, 40)
    assert tokens["long"] == hf_greedy(hf_model, long_prompt, 6)
    assert engine.stats()["num_kv_blocks_used"] == 0


def test_the_prefill_role_exports_the_same_kv_and_first_token_chunked_as_whole(tiny_model_dir):
    prompts = random_prompts([5, 37, 100], seed=12)
    params = SamplingParams(max_tokens=4)
    exported = {}
    for chunked in (False, True):
        engine = engine_of(tiny_model_dir, role="prefill", chunked_prefill=chunked, prefill_chunk_size=BLOCK_SIZE)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, params)
        outputs, num_steps = {}, 0
        while engine.has_unfinished():
            num_steps += 1
            step_outputs = engine.step()
            assert engine.num_step_tokens <= (BLOCK_SIZE if chunked else sum(map(len, prompts)))
            for out in step_outputs:
                assert out.kv is not None, "K/V goes out only with the whole prompt, never with a chunk"
                outputs[out.request_id] = out
        exported[chunked] = outputs, num_steps
    (whole, whole_steps), (chunked, chunked_steps) = exported[False], exported[True]
    assert whole_steps == 1 and chunked_steps >= -(-sum(map(len, prompts)) // BLOCK_SIZE)
    for i, prompt in enumerate(prompts):
        assert chunked[f"r{i}"].new_token_ids == whole[f"r{i}"].new_token_ids
        for whole_kv, chunked_kv in zip(whole[f"r{i}"].kv, chunked[f"r{i}"].kv):
            assert chunked_kv.shape[1] == len(prompt)
            # A chunk past position 0 runs SDPA's masked kernel, not its causal one, and on an AVX2-only CPU a chunk
            # of <= 32 tokens runs the matvec kernel's tiles where the whole prompt runs oneDNN's GEMM: the same math
            # in another summation order, so float32 agrees to ~1e-5 of the values' scale (|K/V| up to ~20 here),
            # not bit for bit.
            torch.testing.assert_close(chunked_kv, whole_kv, rtol=1e-4, atol=1e-3)


def test_with_the_flag_off_a_long_prompt_is_prefilled_whole_in_its_own_step(tiny_model_dir, hf_model):
    engine = engine_of(tiny_model_dir, chunked_prefill=False, prefill_chunk_size=8)
    stream_prompt, long_prompt = random_prompts([6, 150], seed=13)
    engine.add_request("stream", stream_prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    engine.step()
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [out.request_id for out in engine.step()] == ["long"]  # the stream waits for the whole prefill
    assert engine.num_step_tokens == 150
    assert [out.request_id for out in engine.step()] == ["stream", "long"]
    tokens = run(engine)
    assert tokens["long"] == hf_greedy(hf_model, long_prompt, 6)[2:]


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason=f"SmolLM2 is not prepared at {SMOLLM2}")
def test_smollm2_in_float32_prefilled_in_chunks_matches_hugging_face():
    hf = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    engine = engine_of(SMOLLM2, dtype="float32", kv_cache_bytes=64 << 20, prefill_chunk_size=48)
    prompts = random_prompts([100, 20], seed=14)  # 100 = 48 + 48 + 4: the chunks end inside blocks 3 and 6
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf, prompt, 8), f"prompt of {len(prompt)} tokens"


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason=f"SmolLM2 is not prepared at {SMOLLM2}")
def test_smollm2_in_larger_chunks_alone_and_small_ones_beside_a_stream_gives_the_one_pass_tokens():
    long_prompt, short_prompt = random_prompts([300, 20], seed=15)
    runs = {}
    for chunked in (False, True):
        engine = engine_of(SMOLLM2, dtype="float32", kv_cache_bytes=64 << 20, chunked_prefill=chunked,
                           prefill_chunk_size=32, prefill_chunk_size_alone=128)
        tokens: dict[str, list[int]] = {}
        engine.add_request("long", long_prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        step(engine, tokens)
        step_sizes = [engine.num_step_tokens]
        engine.add_request("short", short_prompt, SamplingParams(max_tokens=16, ignore_eos=True))
        while engine.has_unfinished():
            step(engine, tokens)
            step_sizes.append(engine.num_step_tokens)
        runs[chunked] = tokens, step_sizes
    (whole, whole_sizes), (chunked, chunked_sizes) = runs[False], runs[True]
    assert whole_sizes[:2] == [300, 20]
    # A chunk of 128 while no stream decodes, the short prompt in a step of its own, then 31 prompt tokens a step
    # beside its decode until the long prompt is done (172 = 20 + 5 x 31 - 3: its last chunk is 17 tokens).
    assert chunked_sizes[:8] == [128, 20, 32, 32, 32, 32, 32, 18]
    assert chunked == whole
