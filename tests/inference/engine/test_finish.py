"""Requests finish with "length" at max_tokens, "stop" at EOS (included), "abort" when aborted."""
import json
import shutil

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=4 << 20))


PROMPT = [11, 22, 33, 44, 55, 66, 77]


def drain(engine):
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    return outputs


def test_max_tokens_finishes_with_length(engine):
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
    outputs = drain(engine)
    assert [len(o.new_token_ids) for o in outputs] == [1] * 5
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert outputs[-1].finish_reason == "length"
    assert all(o.kv is None for o in outputs)  # K/V is only exported on the prefill role


def test_eos_finishes_with_stop_and_is_the_last_token(engine, tiny_model_dir, tmp_path):
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    eos = greedy[3]
    assert eos not in greedy[:3], "pick a prompt whose 4th greedy token is new"
    # The same weights, with the 4th greedy token declared as EOS in the generation config.
    model_dir = tmp_path / "tiny-eos"
    shutil.copytree(tiny_model_dir, model_dir)
    config_path = model_dir / "generation_config.json"
    generation_config = json.loads(config_path.read_text())
    generation_config["eos_token_id"] = eos
    config_path.write_text(json.dumps(generation_config))
    eos_engine = LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=4 << 20))
    eos_engine.add_request("r", PROMPT, SamplingParams(max_tokens=8))
    outputs = drain(eos_engine)
    assert [t for o in outputs for t in o.new_token_ids] == greedy[:4]
    assert (outputs[-1].finished, outputs[-1].finish_reason) == (True, "stop")
    eos_engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [t for o in drain(eos_engine) for t in o.new_token_ids] == greedy


def test_abort_frees_the_blocks_and_reports_abort_once(engine):
    engine.add_request("running", PROMPT, SamplingParams(max_tokens=50))
    engine.add_request("other", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    assert engine.stats()["num_kv_blocks_used"] > 0
    engine.abort("running")
    engine.abort("never-seen")
    outputs = drain(engine)
    aborted = [o for o in outputs if o.request_id == "running"]
    assert [(o.new_token_ids, o.finished, o.finish_reason) for o in aborted] == [([], True, "abort")]
    assert [o.finish_reason for o in outputs if o.finished and o.request_id == "other"] == ["length"]
    assert engine.stats()["num_kv_blocks_used"] == 0
    engine.add_request("running", PROMPT, SamplingParams(max_tokens=1))  # the id is free again
    assert drain(engine)[-1].finish_reason == "length"


def test_aborting_a_waiting_prefilled_request_drops_its_kv(tiny_model_dir):
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=4 << 20))
    k = torch.zeros(4, len(PROMPT), 2, 48)
    decode.add_prefilled("r", PROMPT, 5, SamplingParams(max_tokens=4), k, k)
    decode.abort("r")
    assert [(o.request_id, o.finish_reason) for o in decode.step()] == [("r", "abort")]
    assert not decode.has_unfinished() and decode.stats()["num_waiting"] == 0


def test_a_prefilled_request_already_ended_by_its_first_token_finishes_without_decoding(tiny_model_dir):
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=4 << 20))
    k = torch.zeros(4, len(PROMPT), 2, 48)
    decode.add_prefilled("r", PROMPT, 5, SamplingParams(max_tokens=1), k, k)
    assert [(o.new_token_ids, o.finish_reason) for o in decode.step()] == [([], "length")]
    assert decode.stats()["num_generation_tokens"] == 0
