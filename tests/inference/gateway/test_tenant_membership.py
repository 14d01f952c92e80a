"""The tenant part of the endpoints answer (docs/contracts.md, "Tenants"), as the gateway checks it: absent means
open with no tenants; anything malformed rejects the whole answer (the last good membership stays). And the gate's
401 / 404 decisions on what it holds."""
from __future__ import annotations

import hashlib

import pytest

from inference.gateway.membership import MembershipError, parse_tenants
from inference.gateway.openai_protocol import ApiError
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import OPEN, parse_tenancy

KEY, OTHER = "tk-acme", "tk-bulk"


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _answer(**tenant) -> dict:
    entry = {"class": "interactive", "limits": {"requests_per_minute": 5}, "allowed": True,
             "keys": [{"hash": _hash(KEY), "expires_at": None}], **tenant}
    return {"mode": "colocated", "groups": [], "requires_key": True, "tenants": {"acme": entry}}


def test_an_answer_without_tenants_is_open():
    assert parse_tenants({"mode": "colocated", "groups": []}) == OPEN
    assert parse_tenants({"requires_key": None, "tenants": None}) == OPEN


def test_a_good_answer_maps_each_hash_to_its_tenant():
    tenancy = parse_tenants(_answer(keys=[{"hash": _hash(KEY), "expires_at": 1.9e9}]))
    assert tenancy.requires_key is True
    assert dict(tenancy.keys) == {_hash(KEY): ("acme", 1.9e9)}
    assert tenancy.tenants["acme"].priority_class == "interactive"
    assert dict(tenancy.tenants["acme"].limits) == {"requests_per_minute": 5}


def test_a_limit_this_gateway_does_not_know_is_ignored():
    tenancy = parse_tenants(_answer(limits={"requests_per_day": 5, "max_tokens": 9}))
    assert dict(tenancy.tenants["acme"].limits) == {"max_tokens": 9}


@pytest.mark.parametrize("change,message", [
    ({"requires_key": "yes"}, "'requires_key' must be true or false"),
    ({"tenants": [1]}, "'tenants' is not an object"),
    ({"tenants": {"Not Ok": {}}}, "tenant name 'Not Ok'"),
    ({"tenants": {"acme": {"class": "urgent"}}}, "the class of tenant acme must be one of"),
])
def test_a_malformed_answer_is_refused(change, message):
    with pytest.raises(MembershipError) as raised:
        parse_tenants({**_answer(), **change})
    assert message in str(raised.value)


@pytest.mark.parametrize("tenant,message", [
    ({"limits": {"requests_per_minute": 0}}, "requests_per_minute of tenant acme must be a whole number >= 1"),
    ({"limits": {"tokens_per_minute": 2.5}}, "tokens_per_minute of tenant acme"),
    ({"limits": {"max_tokens": True}}, "max_tokens of tenant acme"),
    ({"limits": [1]}, "the limits of tenant acme are not an object"),
    ({"allowed": "yes"}, "'allowed' of tenant acme must be true or false"),
    ({"keys": {"hash": "x"}}, "the keys of tenant acme are not a list"),
    ({"keys": [{"hash": "abc"}]}, "64 lowercase hex digits"),
    ({"keys": [{"hash": _hash(KEY).upper()}]}, "64 lowercase hex digits"),
    ({"keys": [{"hash": _hash(KEY), "expires_at": "tomorrow"}]}, "'expires_at' of a key of tenant acme"),
    ({"keys": [{"hash": _hash(KEY)}, {"hash": _hash(KEY)}]}, "listed twice"),
])
def test_a_malformed_tenant_is_refused(tenant, message):
    with pytest.raises(MembershipError) as raised:
        parse_tenants(_answer(**tenant))
    assert message in str(raised.value)


def _gate(answer: dict, wall: float = 1.0e9) -> TenantGate:
    policy = parse_tenancy(answer)
    return TenantGate(lambda: policy, wall=lambda: wall)


def _status(gate: TenantGate, authorization: str | None) -> tuple[int, str | None]:
    try:
        return (200, gate.identify(authorization, "demo").policy.name)
    except ApiError as error:
        return (error.status, error.code)


def test_a_deployment_that_requires_a_key_refuses_none_unknown_and_expired_keys():
    answer = _answer()
    answer["tenants"]["bulk"] = {"class": "batch", "allowed": False, "keys": [{"hash": _hash(OTHER)}]}
    answer["tenants"]["old"] = {"class": "batch", "allowed": True, "keys": [{"hash": _hash("tk-old"),
                                                                            "expires_at": 1.0e9 - 1}]}
    gate = _gate(answer)
    assert _status(gate, f"Bearer {KEY}") == (200, "acme")
    assert _status(gate, f"bearer  {KEY} ") == (200, "acme")
    assert _status(gate, None) == (401, "missing_api_key")
    assert _status(gate, f"Token {KEY}") == (401, "missing_api_key")
    assert _status(gate, "Bearer tk-guessed") == (401, "invalid_api_key")
    assert _status(gate, "Bearer tk-old") == (401, "invalid_api_key")
    assert _status(gate, f"Bearer {OTHER}") == (404, "model_not_found")


def test_an_open_deployment_serves_anyone_and_still_knows_its_tenants():
    answer = {**_answer(), "requires_key": False}
    gate = _gate(answer)
    assert gate.identify(None, "demo") is None
    assert gate.identify("Bearer unused", "demo") is None  # the OpenAI client always sends some key
    assert gate.identify(f"Bearer {KEY}", "demo").policy.name == "acme"  # its limits apply


def test_a_tenant_gone_from_the_answer_loses_its_state_and_its_keys():
    answers = [parse_tenancy(_answer())]
    gate = TenantGate(lambda: answers[-1])
    assert gate.identify(f"Bearer {KEY}", "demo") is not None and set(gate.states) == {"acme"}
    answers.append(parse_tenancy({"requires_key": True}))
    assert _status(gate, f"Bearer {KEY}") == (401, "invalid_api_key")
    assert gate.states == {}
