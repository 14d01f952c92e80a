"""The tenant gate, one decision at a time on a hand-driven clock: token buckets refill at their rate and hold a
minute's worth, requests per minute and concurrency refuse with 429 naming the limit and a Retry-After that is
right, tokens are counted from the finished request's real usage, and a max_tokens cap fills in or refuses."""
from __future__ import annotations

import hashlib

import pytest

from inference.gateway.openai_protocol import ApiError
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy
from inference.gateway.tenant_quota import TokenBucket
from inference.gateway.token_stream import Finish

KEY = "tk-acme-key"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FinishedStream:
    """What a Ticket reads of a TokenStream once it ended: its prompt tokens and its finish (or the tokens so far)."""

    def __init__(self, prompt_tokens: int, completion_tokens: int, finished: bool = True) -> None:
        self.prompt_tokens = prompt_tokens
        self.token_ids = list(range(completion_tokens))
        self.finish = Finish("length", prompt_tokens, completion_tokens) if finished else None


def _gate(limits: dict, clock: Clock) -> TenantGate:
    policy = parse_tenancy({"requires_key": True, "tenants": {"acme": {
        "class": "standard", "limits": limits, "allowed": True,
        "keys": [{"hash": hashlib.sha256(KEY.encode()).hexdigest(), "expires_at": None}]}}})
    return TenantGate(lambda: policy, clock=clock)


def _refused(gate: TenantGate, state, body=None) -> ApiError:
    with pytest.raises(ApiError) as raised:
        gate.admit(state, body or {}, {"max_tokens": 4})
    return raised.value


def test_a_bucket_refills_at_its_rate_and_holds_at_most_a_minute_of_it():
    bucket = TokenBucket(60, now=0.0)
    bucket.take(60, now=0.0)
    assert bucket.wait_s(1, now=0.0) == pytest.approx(1.0)
    assert bucket.wait_s(1, now=0.5) == pytest.approx(0.5)
    assert bucket.wait_s(1, now=1.0) == 0
    assert bucket.wait_s(61, now=3600.0) == pytest.approx(1.0)  # an hour idle still holds only 60


def test_a_bucket_taken_below_zero_waits_until_it_is_back():
    bucket = TokenBucket(600, now=0.0)
    bucket.take(900, now=0.0)  # a request's tokens, counted after it finished
    assert bucket.level == pytest.approx(-300)
    assert bucket.wait_s(0, now=0.0) == pytest.approx(30.0)
    assert bucket.wait_s(0, now=30.0) == 0


def test_a_smaller_limit_keeps_what_was_spent():
    bucket = TokenBucket(100, now=0.0)
    bucket.take(30, now=0.0)
    bucket.resize(50, now=0.0)
    assert bucket.level == 20
    bucket.resize(200, now=0.0)
    assert bucket.level == 170 and bucket.per_minute == 200


def test_requests_per_minute_refuses_with_429_naming_the_limit_and_retry_after():
    clock = Clock()
    gate = _gate({"requests_per_minute": 2}, clock)
    state = gate.identify(f"Bearer {KEY}", "demo")
    gate.admit(state, {}, {}).release()
    gate.admit(state, {}, {}).release()
    error = _refused(gate, state)
    assert error.status == 429 and error.type == "rate_limit_error" and error.param == "requests_per_minute"
    assert "requests_per_minute limit (2)" in error.message
    assert error.headers["Retry-After"] == "30"  # one request every 30 s
    clock.now += 30
    gate.admit(state, {}, {}).release()
    assert state.num_limited == {"requests_per_minute": 1} and state.num_requests == 3


def test_concurrency_counts_requests_in_flight():
    gate = _gate({"max_concurrent_requests": 1}, Clock())
    state = gate.identify(f"Bearer {KEY}", "demo")
    ticket = gate.admit(state, {}, {})
    error = _refused(gate, state)
    assert error.status == 429 and error.param == "max_concurrent_requests" and error.headers["Retry-After"] == "1"
    ticket.release()
    ticket.release()  # twice is once
    assert state.num_running == 0
    gate.admit(state, {}, {}).release()


def test_tokens_per_minute_counts_prompt_and_completion_of_finished_requests():
    clock = Clock()
    gate = _gate({"tokens_per_minute": 120}, clock)
    state = gate.identify(f"Bearer {KEY}", "demo")
    ticket = gate.admit(state, {}, {})
    ticket.stream = FinishedStream(prompt_tokens=100, completion_tokens=50)
    ticket.release()
    assert (state.num_prompt_tokens, state.num_completion_tokens) == (100, 50)
    # 120 - 150 = -30 tokens, and the next request reserves its max_tokens (4): 17 s at 2 tokens a second
    error = _refused(gate, state)
    assert error.param == "tokens_per_minute" and error.headers["Retry-After"] == "17"
    clock.now += 17.5
    gate.admit(state, {}, {"max_tokens": 4}).release()


def test_a_request_that_did_not_finish_counts_its_tokens_so_far_and_an_error():
    gate = _gate({"tokens_per_minute": 1000}, Clock())
    state = gate.identify(f"Bearer {KEY}", "demo")
    ticket = gate.admit(state, {}, {})
    ticket.stream = FinishedStream(prompt_tokens=10, completion_tokens=3, finished=False)
    ticket.release()
    assert (state.num_completion_tokens, state.num_errors) == (3, 1)
    assert state.buckets["tokens"].level == pytest.approx(1000 - 13, abs=0.1)


def test_the_max_tokens_cap_fills_in_a_default_and_refuses_a_larger_ask():
    gate = _gate({"max_tokens": 8}, Clock())
    state = gate.identify(f"Bearer {KEY}", "demo")
    for worker_body in ({"max_tokens": None}, {"max_tokens": 16}):  # none asked; a deployment default above it
        gate.admit(state, {}, worker_body).release()
        assert worker_body["max_tokens"] == 8
    worker_body = {"max_tokens": 4}
    gate.admit(state, {"max_tokens": 4}, worker_body).release()
    assert worker_body["max_tokens"] == 4
    with pytest.raises(ApiError) as raised:
        gate.admit(state, {"max_completion_tokens": 9}, {"max_tokens": 9})
    assert raised.value.status == 400 and raised.value.param == "max_completion_tokens"
    assert "max_tokens limit (8)" in raised.value.message


def test_a_changed_limit_applies_at_the_next_poll_and_keeps_the_spent_budget():
    clock = Clock()
    answers = []

    def answer(rpm: int):
        answers.append(parse_tenancy({"requires_key": True, "tenants": {"acme": {
            "class": "standard", "limits": {"requests_per_minute": rpm}, "allowed": True,
            "keys": [{"hash": hashlib.sha256(KEY.encode()).hexdigest()}]}}}))

    answer(10)
    gate = TenantGate(lambda: answers[-1], clock=clock)
    state = gate.identify(f"Bearer {KEY}", "demo")
    for _ in range(3):
        gate.admit(state, {}, {}).release()
    answer(4)
    state = gate.identify(f"Bearer {KEY}", "demo")
    gate.admit(state, {}, {}).release()  # 4 - 3 spent = 1 left
    assert _refused(gate, state).param == "requests_per_minute"


def test_a_burst_is_held_to_the_minute_by_reservations_settled_with_the_real_usage():
    """48 parallel requests under a 400-tokens-a-minute limit: each reserves its estimated prompt and max_tokens at
    admission, so those admitted together never reserve more than the minute; each settles with its real usage."""
    clock = Clock()
    gate = _gate({"tokens_per_minute": 400}, clock)
    state = gate.identify(f"Bearer {KEY}", "demo")
    admitted, refused = [], 0
    for _ in range(48):
        try:
            admitted.append(gate.admit(state, {}, {"prompt": "a" * 40, "max_tokens": 30}))  # 10 + 30 reserved
        except ApiError as error:
            assert error.param == "tokens_per_minute"
            refused += 1
    assert len(admitted) == 10 and refused == 38  # 10 x 40 = the minute
    for ticket in admitted:
        ticket.stream = FinishedStream(prompt_tokens=9, completion_tokens=30)
        ticket.release()
    used = (state.num_prompt_tokens + state.num_completion_tokens)
    assert used == 390 and state.buckets["tokens"].level == pytest.approx(400 - 390)  # settled: 1 token each came back


def test_a_request_without_max_tokens_reserves_at_most_the_minute():
    gate = _gate({"tokens_per_minute": 120}, Clock())
    state = gate.identify(f"Bearer {KEY}", "demo")
    ticket = gate.admit(state, {}, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": None})
    assert ticket.reserved == 120 and state.buckets["tokens"].level == pytest.approx(0)
    assert _refused(gate, state).param == "tokens_per_minute"  # the rest of the context: the whole minute held
