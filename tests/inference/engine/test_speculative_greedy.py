"""Greedy decoding with speculation (ngram and layers, several k) gives token for token what the engine without it
gives, on the tiny model in float32 on both sides: across KV block boundaries (block_size 4), with EOS and max_tokens
falling inside an accepted run, on a decode engine fed by a prefill engine, and (when it is prepared) on SmolLM2.

The tiny model's random weights rarely repeat themselves, so its n-gram drafts are nearly always rejected (the
verify path with rejections); accepted runs of several tokens come from layer drafts with 3 of its 4 layers
(min_acceptance 0 keeps them drafting), and n-gram acceptance from SmolLM2 on a copy-heavy prompt.
"""
from __future__ import annotations

import pytest

from inference.engine import Config, LLMEngine, SamplingParams
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import random_prompts
from tests.inference.engine.test_disaggregated import prefill, run_to_completion

SMOLLM2 = MODELS_DIR / "smollm2-135m"
# Prompts that repeat themselves give the n-gram proposer matches; the plain ones test the rest.
PROMPTS = [p + p for p in random_prompts([6, 13, 30])] + random_prompts([3, 17, 41], seed=1)
NUM_NEW_TOKENS = 40
SPECS = [
    {"method": "ngram", "num_tokens": 2},
    {"method": "ngram", "num_tokens": 5, "ngram_min": 1, "min_acceptance": 0},
    {"method": "layers", "num_tokens": 1, "layers": 1},
    {"method": "layers", "num_tokens": 4, "layers": 3, "min_acceptance": 0},
    {"method": "layers", "num_tokens": 7, "layers": 2, "min_acceptance": 0},
]
LAYERS_3 = {"method": "layers", "num_tokens": 4, "layers": 3, "min_acceptance": 0}


BLOCK_BYTES = 2 * 4 * 4 * 2 * 48 * 4  # K and V x 4 layers x 4 tokens x 2 KV heads x head_dim 48 x float32


def _engine(model_dir, speculative=None, **kw) -> LLMEngine:
    kw.setdefault("block_size", 4)
    kw.setdefault("kv_cache_bytes", 8 << 20)
    return LLMEngine(Config(model=model_dir, threads=1, dtype="float32", speculative=speculative, **kw))


def _greedy(max_tokens=NUM_NEW_TOKENS, ignore_eos=True):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


def _run(engine, prompts, params) -> tuple[dict[str, list[int]], dict[str, list[list[int]]]]:
    """Each request's tokens, and what each step delivered to it."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {}
    steps: dict[str, list[list[int]]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            steps.setdefault(out.request_id, []).append(out.new_token_ids)
    return tokens, steps


@pytest.fixture(scope="module")
def baseline(tiny_model_dir):
    return _run(_engine(tiny_model_dir), PROMPTS, _greedy())[0]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['method']}-k{s['num_tokens']}")
def test_speculation_gives_the_tokens_of_the_engine_without_it(tiny_model_dir, baseline, spec):
    engine = _engine(tiny_model_dir, spec)
    tokens, steps = _run(engine, PROMPTS, _greedy())
    assert tokens == baseline
    stats = engine.stats()
    if spec["method"] == "layers" or spec.get("ngram_min") == 1:  # bigrams (the default) rarely recur in the tiny model's output
        assert stats["num_spec_proposed_tokens"] > 0, "nothing was drafted: the verify path went untested"
    assert stats["num_generation_tokens"] == sum(map(len, baseline.values()))
    assert stats["num_kv_blocks_used"] == 0
    if spec.get("layers") == 3:
        assert stats["num_spec_accepted_tokens"] > 0
        assert max(len(step) for s in steps.values() for step in s) > 2, "no step kept several drafts"
    assert max(len(step) for s in steps.values() for step in s) <= spec["num_tokens"] + 1


def test_eos_inside_an_accepted_run_ends_the_request_there(tiny_model_dir):
    prompts = PROMPTS[:4]
    engine = _engine(tiny_model_dir, LAYERS_3)
    _, steps = _run(engine, prompts, _greedy())
    # A token in the middle of a step that kept several drafts, at its first place in that completion: made the
    # EOS token, it must end the request right there, although the verify accepted tokens after it.
    request_id, eos = None, None
    for rid, per_step in steps.items():
        completion = [t for step in per_step for t in step]
        for step in per_step:
            if len(step) >= 3 and completion.index(step[1]) == completion.index(step[0]) + 1:
                request_id, eos = rid, step[1]
                break
        if eos is not None:
            break
    assert eos is not None, "no accepted run of 3 tokens to put an EOS in"
    prompt = prompts[int(request_id[1:])]
    results = []
    for spec in (None, LAYERS_3):
        engine = _engine(tiny_model_dir, spec)
        engine.scheduler.eos_token_ids = frozenset({eos})
        engine.add_request("eos", prompt, _greedy(ignore_eos=False))
        tokens, finish = run_to_completion(engine)
        results.append((tokens["eos"], finish["eos"]))
        assert engine.stats()["num_generation_tokens"] == len(tokens["eos"])
    assert results[0] == results[1]
    assert results[1][0][-1] == eos and results[1][1] == "stop"


@pytest.mark.parametrize("max_tokens", [2, 3, 5, 6, 9, 14])
def test_max_tokens_ends_the_request_exactly_where_the_plain_engine_does(tiny_model_dir, max_tokens):
    prompts = PROMPTS[:3]
    plain = _run(_engine(tiny_model_dir), prompts, _greedy(max_tokens))[0]
    spec, steps = _run(_engine(tiny_model_dir, LAYERS_3), prompts, _greedy(max_tokens))
    assert spec == plain
    assert all(len(tokens) == max_tokens for tokens in spec.values())


def test_a_decode_engine_drafts_from_the_tokens_it_has_inside_its_reservation(tiny_model_dir, baseline):
    prefill_engine = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=8 << 20))
    # Just enough blocks for the reservations (prompt + max_tokens - 1 slots each): a write past one would land in
    # another sequence's blocks and change its tokens.
    for spec in (LAYERS_3, {"method": "ngram", "num_tokens": 6, "ngram_min": 1, "min_acceptance": 0}):
        num_blocks = sum(-(-(len(p) + NUM_NEW_TOKENS - 1) // 4) for p in PROMPTS)
        decode = _engine(tiny_model_dir, spec, role="decode", kv_cache_bytes=num_blocks * BLOCK_BYTES)
        handed = prefill(prefill_engine, {f"r{i}": (p, _greedy()) for i, p in enumerate(PROMPTS)})
        for request_id, out in handed.items():
            prompt = PROMPTS[int(request_id[1:])]
            decode.add_prefilled(request_id, prompt, out.new_token_ids[0], _greedy(), *out.kv)
        tokens, finish = run_to_completion(decode)
        assert decode.block_manager.num_blocks == num_blocks
        assert {rid: handed[rid].new_token_ids + t for rid, t in tokens.items()} == baseline
        assert set(finish.values()) == {"length"}
        assert decode.stats()["num_spec_proposed_tokens"] > 0


def test_a_colocated_engine_short_of_blocks_drafts_less_and_still_matches(tiny_model_dir, baseline):
    # 30 blocks of 4 tokens for three sequences that need 13, 17 and 25: drafts take free blocks only,
    # and the engine preempts as it does without speculation.
    engine = _engine(tiny_model_dir, LAYERS_3, kv_cache_bytes=30 * BLOCK_BYTES)
    assert engine.block_manager.num_blocks == 30
    tokens, _ = _run(engine, PROMPTS[:3], _greedy())
    assert tokens == {rid: baseline[rid] for rid in tokens}
    assert engine.stats()["num_preemptions"] > 0 and engine.stats()["num_spec_accepted_tokens"] > 0


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="SmolLM2 is not prepared (make smollm2)")
def test_smollm2_copying_a_passage_accepts_ngram_drafts_and_keeps_its_greedy_tokens():
    # float32 on both sides (the config's own dtype is bfloat16).
    text = ("Repeat this sentence exactly: The harbour wakes before the town does, and the gulls follow the "
            "boats out past the breakwater.")
    outputs = []
    for spec in (None, {"method": "ngram", "num_tokens": 5}):
        engine = LLMEngine(Config(model=SMOLLM2, threads=1, dtype="float32", kv_cache_bytes=32 << 20,
                                  speculative=spec))
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        outputs.append(engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0.0))[0])
    assert outputs[0] == outputs[1]
    stats = engine.stats()
    assert stats["num_spec_accepted_tokens"] >= 10, stats
