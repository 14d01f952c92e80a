"""The gateway sends each tenant's requests with its class as the worker body's `priority`, so that the worker
admits a quiet interactive tenant's request before a noisy batch tenant's queued streams (the worker's side:
tests/inference/worker/test_priority.py). An anonymous caller of an open deployment sends none (standard)."""
from __future__ import annotations

import hashlib

from inference.engine.sequence import PRIORITY_BANDS
from inference.gateway.fair_queue import BANDS
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy

KEYS = {"quiet": "tk-quiet-prio-0123456", "noisy": "tk-noisy-prio-0123456", "plain": "tk-plain-prio-0123456"}
CLASSES = {"quiet": "interactive", "noisy": "batch", "plain": "standard"}


def test_a_tenants_worker_body_carries_its_class_and_an_anonymous_one_none():
    policy = parse_tenancy({"requires_key": False, "tenants": {
        name: {"class": CLASSES[name], "limits": {}, "allowed": True,
               "keys": [{"hash": hashlib.sha256(key.encode()).hexdigest(), "expires_at": None}]}
        for name, key in KEYS.items()}})
    gate = TenantGate(lambda: policy)
    for name, key in KEYS.items():
        worker_body = {"max_tokens": 4}
        gate.admit(gate.identify(f"Bearer {key}", "demo"), {}, worker_body).release()
        assert worker_body["priority"] == CLASSES[name]
    anonymous = {"max_tokens": 4}
    gate.admit(gate.identify(None, "demo"), {}, anonymous).release()
    assert "priority" not in anonymous


def test_the_worker_bands_are_the_gateway_classes_in_the_same_order():
    assert PRIORITY_BANDS == BANDS
