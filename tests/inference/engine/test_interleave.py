"""A request's prefill between a decode step's layers (inference/engine/interleave.py): the step pauses mid-way when
the arrivals flag is raised, the new request's first token comes out before the step ends, every token is the same
as when the request waits for the step's end, an abort of a sequence of the paused step takes effect when the step
ends while its place goes to the new request at once, a prompt longer than the chunk beside decodes waits for the
step's end, a request arriving during such a prefill is prefilled between that prefill's layers, and /info says
when it is off and why."""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.kernels import matvec
from inference.engine.config import ConfigError
from tests.inference.engine.support import prefilled, random_prompts

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def engine(model_dir, **settings) -> LLMEngine:
    settings = {"chunked_prefill": False, **settings}
    return LLMEngine(Config(model=model_dir, dtype="float32", threads=1, kv_cache_bytes=4 << 20,
                            prefix_caching=False, **settings))


def k_at(eng: LLMEngine, layer: int, seq, pos: int) -> torch.Tensor:
    """`seq`'s K at position `pos` in `layer` (its slot in the paged cache)."""
    runner = eng.model_runner
    slot = seq.block_table[pos // runner.pool.block_size] * runner.pool.block_size + pos % runner.pool.block_size
    return runner.k_cache[layer].reshape(-1, runner.shape.num_kv_heads, runner.shape.head_dim)[slot].clone()


def run_out(eng: LLMEngine, tokens: dict[str, list[int]]) -> dict[str, list[int]]:
    while eng.has_unfinished():
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def step_with_arrival(eng: LLMEngine, request_id: str, prompt: list[int], *, interleave: bool) -> tuple[list, list]:
    """One step during which `request_id` arrives: prefilled between the step's layers (`interleave`), or added after
    the step. Returns (the step's outputs, what the between-layers prefill returned)."""
    early: list = []

    def between():
        eng.add_request(request_id, prompt, PARAMS)
        early.extend(eng.prefill_between())

    if interleave:
        eng.arrivals.raise_()
        outputs = eng.step(between)
        assert not eng.arrivals, "the pause lowers the flag"
    else:
        outputs = eng.step()
        eng.add_request(request_id, prompt, PARAMS)
    return outputs, early


def with_late_request(eng: LLMEngine, prompts, *, interleave: bool) -> tuple[dict, list]:
    """r0 and r1 decoding; `late` arrives during their next decode step, between its layers (`interleave`) or after
    it. Returns every request's tokens and what the between-layers prefill returned."""
    running = prefilled(eng, prompts[:2])
    tokens = {seq.request_id: seq.completion_token_ids for seq in running}
    outputs, early = step_with_arrival(eng, "late", prompts[2], interleave=interleave)
    assert {out.request_id for out in outputs} == {"r0", "r1"}
    for out in [*early, *outputs]:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return run_out(eng, tokens), early


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "lean"])
def test_a_request_arriving_mid_step_gets_its_first_token_before_the_step_ends(tiny_model_dir, fused):
    prompts = random_prompts([12, 20, 7])
    eng = engine(tiny_model_dir, fused_decode=fused)
    assert eng.interleave_prefill, eng.interleave_reason
    tokens, early = with_late_request(eng, prompts, interleave=True)
    assert [(out.request_id, len(out.new_token_ids)) for out in early] == [("late", 1)]
    reference, _ = with_late_request(engine(tiny_model_dir, fused_decode=fused), prompts, interleave=False)
    assert tokens == reference
    assert all(len(t) == PARAMS.max_tokens for t in tokens.values())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "lean"])
def test_a_request_arriving_after_the_last_layer_is_prefilled_during_the_lm_head(tiny_model_dir, monkeypatch, fused):
    """The step's tail (LM head, sampling) looks at the flag too: after the last layer, between the head's parts and
    before sampling. The flag raised as the layers end and kept up, a decode step pauses 1 + (parts - 1) + 1 times; a
    request taken at the second (inside the head) gets its first token before the step's, and every token is the same
    as when it comes after the step (a prefill that disturbed the paused head's input or output would change r0's or
    r1's)."""
    monkeypatch.setattr(matvec, "PAUSE_ROWS", 1020)  # the tiny model's 4,096-token head: 5 parts (PAUSE_ROWS: 8,190)
    prompts = random_prompts([12, 20, 7])
    eng = engine(tiny_model_dir, fused_decode=fused)
    lean = eng.model_runner.lean_decoder
    layers = lean.forward

    def forward(*args, **kwargs):
        hidden = layers(*args, **kwargs)
        if not calls:
            eng.arrivals.raise_()  # an arrival during the step's last layer (not the prefill's, below)
        return hidden

    monkeypatch.setattr(lean, "forward", forward)
    calls, early = [None], []
    running = prefilled(eng, prompts[:2])
    tokens = {seq.request_id: list(seq.completion_token_ids) for seq in running}
    calls.clear()

    def between():
        calls.append(len(calls))
        if len(calls) == 2:
            eng.add_request("late", prompts[2], PARAMS)
            early.extend(eng.prefill_between())
        eng.arrivals.raise_()  # kept up after the prefill: every look of the step at the flag pauses

    outputs = eng.step(between)
    assert len(calls) == 1 + 4 + 1, calls
    assert [(out.request_id, len(out.new_token_ids)) for out in early] == [("late", 1)]
    assert {out.request_id for out in outputs} == {"r0", "r1"}
    monkeypatch.setattr(lean, "forward", layers)
    eng.arrivals.lower()
    for out in [*early, *outputs]:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    reference, _ = with_late_request(engine(tiny_model_dir, fused_decode=fused), prompts, interleave=False)
    assert run_out(eng, tokens) == reference


def test_a_prefill_step_pauses_too_and_every_token_is_the_same(tiny_model_dir):
    """A long prompt's prefill step (whole, without chunks) takes a short arrival between its layers: the short one's
    first token comes before the long one's."""
    prompts = random_prompts([12, 60, 7])

    def serve(interleave: bool) -> tuple[dict, list]:
        eng = engine(tiny_model_dir)
        prefilled(eng, prompts[:1])
        eng.add_request("long", prompts[1], PARAMS)
        outputs, early = step_with_arrival(eng, "short", prompts[2], interleave=interleave)
        assert [out.request_id for out in outputs] == ["long"], "a prefill step"
        tokens = {"r0": list(eng._seqs["r0"].completion_token_ids)}
        for out in [*early, *outputs]:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        return run_out(eng, tokens), early

    tokens, early = serve(interleave=True)
    assert [out.request_id for out in early] == ["short"]
    assert tokens == serve(interleave=False)[0]


def test_the_paused_step_stops_after_its_first_layer_and_finishes_the_rest(tiny_model_dir):
    eng = engine(tiny_model_dir)
    running = prefilled(eng, random_prompts([12, 20]))
    positions = [seq.num_tokens - 1 for seq in running]  # the tokens the next step feeds
    seen = []

    def between():
        seen.append([(k_at(eng, 0, seq, pos), k_at(eng, -1, seq, pos)) for seq, pos in zip(running, positions)])
        assert eng.prefill_between() == [] and eng.num_step_tokens == 0, "nothing waits: nothing prefilled"

    eng.arrivals.raise_()
    eng.step(between)
    assert len(seen) == 1, "one pause for one raise of the flag"
    assert eng.num_step_tokens == 2, "the paused step's tokens, nothing counted twice"
    with pytest.raises(RuntimeError, match="paused"):
        eng.prefill_between()
    for seq, pos, (k_first, k_last) in zip(running, positions, seen[0]):
        assert torch.equal(k_at(eng, 0, seq, pos), k_first), "layer 0 ran before the pause"
        assert not torch.equal(k_at(eng, -1, seq, pos), k_last), "the last layer ran after it"


def test_an_abort_of_the_paused_steps_sequence_frees_its_place_now_and_its_blocks_when_the_step_ends(
        tiny_model_dir):
    prompts = random_prompts([12, 20, 7])
    eng = engine(tiny_model_dir, max_num_seqs=2)
    prefilled(eng, prompts[:2])
    used_before = eng.block_manager.num_used_blocks
    early = []

    def between():
        eng.abort("r0")
        eng.add_request("late", prompts[2], PARAMS)
        assert eng.scheduler.running[0].request_id == "r0", "r0's slots are being written: it stays for the step"
        early.extend(eng.prefill_between())

    eng.arrivals.raise_()
    outputs = eng.step(between)
    assert [out.request_id for out in early] == ["late"], "r0's place went to late (max_num_seqs 2)"
    assert [seq.request_id for seq in eng.scheduler.running] == ["r1", "late"]
    assert {out.request_id for out in outputs} == {"r0", "r1"}
    aborted = [out for out in eng.step() if out.request_id == "r0"]
    assert [(out.finished, out.finish_reason) for out in aborted] == [(True, "abort")]
    r0_blocks = 1  # 12 prompt tokens + 1 in blocks of 16
    assert eng.block_manager.num_used_blocks <= used_before - r0_blocks + 1  # late's one block, r0's freed
    with pytest.raises(RuntimeError, match="paused"):
        eng.prefill_between()


def test_with_chunked_prefill_only_a_prompt_that_fits_the_chunk_beside_decodes_is_prefilled_between(
        tiny_model_dir):
    eng = engine(tiny_model_dir, chunked_prefill=True, prefill_chunk_size=16)
    prompts = random_prompts([12, 20, 30, 9])
    prefilled(eng, prompts[:2])
    early = []

    def between():
        eng.add_request("long", prompts[2], PARAMS)  # 30 tokens: more than the chunk of 16
        eng.add_request("short", prompts[3], PARAMS)
        early.extend(eng.prefill_between())

    eng.arrivals.raise_()
    eng.step(between)
    assert [out.request_id for out in early] == ["short"]
    assert [seq.request_id for seq in eng.scheduler.waiting] == ["long"]
    tokens = run_out(eng, {})
    assert len(tokens["long"]) == PARAMS.max_tokens


def test_info_says_when_it_is_off_and_why(tiny_model_dir):
    assert "on: a prompt of up to 64 tokens" in engine(tiny_model_dir, chunked_prefill=True).interleave_reason
    off = engine(tiny_model_dir, interleave_prefill=False)
    assert not off.interleave_prefill and off.interleave_reason.startswith("off: interleave_prefill is false")
    spec = engine(tiny_model_dir, speculative={"method": "ngram", "num_tokens": 2})
    assert not spec.interleave_prefill and "speculative" in spec.interleave_reason
    prefill = engine(tiny_model_dir, role="prefill")
    assert not prefill.interleave_prefill and "prefill engine" in prefill.interleave_reason
    with pytest.raises(ConfigError, match="interleave_prefill"):
        engine(tiny_model_dir, interleave_prefill="yes")


def test_the_budget_is_the_paused_steps_whatever_the_number_of_pauses(tiny_model_dir):
    """In chunked mode the streams of a paused step wait for at most one chunk's worth of prompt tokens in it."""
    eng = engine(tiny_model_dir, chunked_prefill=True, prefill_chunk_size=16)
    prompts = random_prompts([12, 20, 9, 9])
    prefilled(eng, prompts[:2])
    early, num_pauses = [], 0

    def between():
        nonlocal num_pauses
        num_pauses += 1
        if num_pauses <= 2:
            eng.add_request(f"a{num_pauses}", prompts[1 + num_pauses], PARAMS)
            eng.arrivals.raise_()  # the next one arrives during this pause: the step pauses again
        early.extend(eng.prefill_between())

    eng.arrivals.raise_()
    eng.step(between)
    assert num_pauses == 3
    assert [out.request_id for out in early] == ["a1"], "9 + 9 tokens are more than the chunk of 16"
    assert [seq.request_id for seq in eng.scheduler.waiting] == ["a2"]


def test_a_request_arriving_during_a_prefill_between_layers_is_prefilled_between_that_prefills_layers(
        tiny_model_dir):
    """The pause nests: `late`, of a tenant holding no sequence, arrives while `mid`'s prefill (of the tenant holding
    the running ones) runs between the decode step's layers, and its first token comes before mid's; an abort of mid
    (in flight, its slots being written) takes effect when the step ends; every other token is the same as when both
    wait for the step's end. A request of mid's own tenant (and band) arriving then waits for mid's prefill."""
    prompts = random_prompts([12, 20, 60, 7])

    def serve(interleave: bool, abort_mid: bool = False, late_salt: bytes = b"quiet") -> tuple[dict, list, int]:
        eng = engine(tiny_model_dir)
        running = prefilled(eng, prompts[:2])
        tokens = {seq.request_id: list(seq.completion_token_ids) for seq in running}
        early, calls = [], 0

        def between():
            nonlocal calls
            calls += 1
            if calls == 1:
                eng.add_request("mid", prompts[2], PARAMS)
                eng.arrivals.raise_()  # late arrives while mid's prefill runs
                early.extend(eng.prefill_between())
            elif calls == 2:
                eng.add_request("late", prompts[3], PARAMS, cache_salt=late_salt)
                if abort_mid:
                    eng.abort("mid")
                    assert "mid" in {seq.request_id for seq in eng.scheduler.running}, "mid's slots are in use"
                early.extend(eng.prefill_between())
            else:
                early.extend(eng.prefill_between())

        if interleave:
            eng.arrivals.raise_()
            outputs = eng.step(between)
        else:
            outputs = eng.step()
            eng.add_request("mid", prompts[2], PARAMS)
            eng.add_request("late", prompts[3], PARAMS, cache_salt=late_salt)
        for out in [*early, *outputs]:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if abort_mid:
            assert "mid" not in {seq.request_id for seq in eng.scheduler.running}, "mid left when the step ended"
            outputs = eng.step()
            assert [(out.finished, out.finish_reason) for out in outputs if out.request_id == "mid"] == \
                [(True, "abort")]
            for out in outputs:
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        return run_out(eng, tokens), early, calls

    tokens, early, calls = serve(interleave=True)
    assert [(out.request_id, len(out.new_token_ids)) for out in early] == [("late", 1), ("mid", 1)]
    assert calls >= 2
    assert tokens == serve(interleave=False)[0]

    tokens, early, _ = serve(interleave=True, abort_mid=True)
    assert [out.request_id for out in early] == ["late", "mid"], "mid's prefill ran to its end"
    assert len(tokens["mid"]) == 1 and len(tokens["late"]) == PARAMS.max_tokens

    tokens, early, _ = serve(interleave=True, late_salt=b"")
    assert [out.request_id for out in early][:1] == ["mid"], "late does not outrank mid: it waits for mid's prefill"
    assert tokens == serve(interleave=False, late_salt=b"")[0]


def test_in_chunked_mode_a_request_queued_at_a_steps_start_is_prefilled_alone_before_it(tiny_model_dir):
    """A request that came in the step's tail (after its last layer) is prefilled as a step of its own before the
    decodes, as a pause would have, not in the next mixed step beside them; a prompt longer than the chunk beside
    decodes still rides the mixed steps; every token is the same as in mixed steps (no between: LLMEngine.step())."""
    prompts = random_prompts([12, 20, 9, 30])

    def serve(interleave: bool) -> tuple[dict, list]:
        eng = engine(tiny_model_dir, chunked_prefill=True, prefill_chunk_size=16)
        running = prefilled(eng, prompts[:2])
        tokens = {seq.request_id: list(seq.completion_token_ids) for seq in running}
        eng.add_request("short", prompts[2], PARAMS)
        eng.add_request("long", prompts[3], PARAMS)  # 30 tokens: more than the chunk of 16
        first = eng.step(eng.prefill_between if interleave else None)
        for out in first:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        return run_out(eng, tokens), first

    tokens, first = serve(interleave=True)
    assert [(out.request_id, len(out.new_token_ids)) for out in first] == [("short", 1)]
    mixed_tokens, mixed_first = serve(interleave=False)
    assert {out.request_id for out in mixed_first} == {"short", "r0", "r1"}, "without pauses: one mixed step"
    assert tokens == mixed_tokens
    assert all(len(tokens[request_id]) == PARAMS.max_tokens for request_id in ("short", "long"))
