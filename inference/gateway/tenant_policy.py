"""The tenant part of the control plane's endpoints answer (docs/contracts.md, "Tenants"), parsed: whether the
deployment requires a key, and for every tenant with an active key its class, limits, whether it may use this
deployment and its keys' hashes and expiry.

`parse_tenancy` checks it like the rest of the answer: a bad one raises TenancyError and the membership keeps its last
good Tenancy, which the gate (tenancy.py) enforces.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inference.gateway.fair_queue import BANDS
from inference.gateway.tenant_limits import NAMES as LIMITS

PRIORITY_CLASSES = BANDS  # the admission queue dispatches them in this order
# A tenant's name is a label value and a log word: the control plane's name rule (a DNS label).
TENANT_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
HASH_RE = re.compile(r"[0-9a-f]{64}")


class TenancyError(ValueError):
    """The answer's tenant part is malformed (the membership keeps its last good answer)."""


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    name: str
    priority_class: str
    limits: Mapping[str, int]
    allowed: bool  # may use this deployment: a key of a tenant that may not gets 404 model_not_found


@dataclass(frozen=True, slots=True)
class Tenancy:
    requires_key: bool = False
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    # sha256 hex of a key → (its tenant, when it expires in Unix seconds or None)
    keys: Mapping[str, tuple[str, float | None]] = field(default_factory=dict)


OPEN = Tenancy()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_tenancy(body: dict) -> Tenancy:
    """`requires_key` (absent or null: false) and `tenants` (absent or null: none) of an endpoints answer."""
    requires_key = body.get("requires_key")
    if requires_key is None:
        requires_key = False
    if not isinstance(requires_key, bool):
        raise TenancyError(f"'requires_key' must be true or false, not {requires_key!r}")
    tenants_in = body.get("tenants") or {}
    if not isinstance(tenants_in, dict):
        raise TenancyError("'tenants' is not an object of tenant name → tenant")
    tenants, keys = {}, {}
    for name, entry in tenants_in.items():
        if not TENANT_RE.fullmatch(name):
            raise TenancyError(f"tenant name {name[:80]!r} is not 1-63 lowercase letters, digits and dashes")
        if not isinstance(entry, dict):
            raise TenancyError(f"tenant {name} is not an object")
        priority_class = entry.get("class")
        if priority_class not in PRIORITY_CLASSES:
            raise TenancyError(f"the class of tenant {name} must be one of {', '.join(PRIORITY_CLASSES)}, "
                               f"not {priority_class!r}")
        limits = entry.get("limits") or {}
        if not isinstance(limits, dict):
            raise TenancyError(f"the limits of tenant {name} are not an object")
        # A limit this gateway does not know (a newer control plane's) is left to gateways that do.
        known = {limit: limits[limit] for limit in LIMITS if limits.get(limit) is not None}
        for limit, value in known.items():
            if not _is_int(value) or value < 1:
                raise TenancyError(f"{limit} of tenant {name} must be a whole number >= 1, not {value!r}")
        allowed = entry.get("allowed")
        if not isinstance(allowed, bool):
            raise TenancyError(f"'allowed' of tenant {name} must be true or false, not {allowed!r}")
        key_list = entry.get("keys") or []
        if not isinstance(key_list, list):
            raise TenancyError(f"the keys of tenant {name} are not a list")
        for key in key_list:
            if not isinstance(key, dict) or not isinstance(key.get("hash"), str) or not HASH_RE.fullmatch(key["hash"]):
                raise TenancyError(f"a key of tenant {name} has no 'hash' of 64 lowercase hex digits (sha256)")
            expires_at = key.get("expires_at")
            if expires_at is not None and (isinstance(expires_at, bool) or not isinstance(expires_at, (int, float))
                                           or not math.isfinite(expires_at)):
                raise TenancyError(f"'expires_at' of a key of tenant {name} must be Unix seconds or null, "
                                   f"not {expires_at!r}")
            if key["hash"] in keys:
                raise TenancyError(f"a key hash is listed twice (tenants {keys[key['hash']][0]} and {name})")
            keys[key["hash"]] = (name, None if expires_at is None else float(expires_at))
        tenants[name] = TenantPolicy(name, priority_class, MappingProxyType(known), allowed)
    return Tenancy(requires_key, MappingProxyType(tenants), MappingProxyType(keys))
