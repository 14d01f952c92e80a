"""Requests join a running batch between steps and still decode exactly as Hugging Face does."""

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import hf_greedy, random_prompts


def collect(outputs, tokens):
    for out in outputs:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return [out.request_id for out in outputs]


def test_a_request_added_mid_flight_joins_the_batch_and_matches_hugging_face(tiny_model_dir, hf_model):
    # Unchunked: a prefill step of its own, then decodes (chunked mixed steps: test_chunked_prefill.py).
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=4 << 20, chunked_prefill=False))
    early, late, later = random_prompts([10, 25, 5], seed=3)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    engine.add_request("early", early, params)
    for _ in range(4):
        collect(engine.step(), tokens)
    engine.add_request("late", late, params)
    assert collect(engine.step(), tokens) == ["late"]  # the newcomer is prefilled between decode steps
    assert collect(engine.step(), tokens) == ["early", "late"]  # then decodes in the same batch
    for _ in range(3):
        collect(engine.step(), tokens)
    engine.add_request("later", later, params)
    while engine.has_unfinished():
        collect(engine.step(), tokens)
    for request_id, prompt in (("early", early), ("late", late), ("later", later)):
        assert tokens[request_id] == hf_greedy(hf_model, prompt, 12), request_id


def test_a_prefilled_request_joins_a_running_decode_batch(tiny_model_dir, hf_model):
    prefill = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=4 << 20))
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=4 << 20))
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    prompts = dict(zip(("first", "second"), random_prompts([14, 33], seed=4)))
    tokens: dict[str, list[int]] = {}

    def hand_over(request_id):
        prefill.add_request(request_id, prompts[request_id], params)
        (out,) = prefill.step()
        tokens[request_id] = list(out.new_token_ids)
        decode.add_prefilled(request_id, prompts[request_id], out.new_token_ids[0], params, *out.kv)

    hand_over("first")
    for _ in range(3):
        collect(decode.step(), tokens)
    hand_over("second")
    assert collect(decode.step(), tokens) == ["first", "second"]
    while decode.has_unfinished():
        collect(decode.step(), tokens)
    for request_id, prompt in prompts.items():
        assert tokens[request_id] == hf_greedy(hf_model, prompt, 10), request_id
