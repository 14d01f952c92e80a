"""The registry of fault kinds: each kind declared once is one the agent can carry out and the chaos app accepts
with its defaults; a held kind with a process, a file or a freeze of its own names how to start and stop it."""
from __future__ import annotations

import pytest

from controlplane.agent.fault_kinds import KINDS, REQUIRED, Family, kinds_of
from controlplane.chaos.fault_checks import validate_faults
from controlplane.errors import ControlPlaneError


def test_every_kind_but_a_signal_names_its_start_and_stop():
    for kind in KINDS.values():
        signalled = kind.family == Family.PROCESS or kind.name == "agent_kill"
        assert (kind.start is None) == signalled, kind.name
        assert (kind.stop is None) == signalled, kind.name
        assert (kind.proxy_flags is not None) == (kind.family == Family.PROXY), kind.name


def test_the_chaos_app_accepts_each_kind_with_its_required_settings_only():
    for kind in KINDS.values():
        required = {key: param.low for key, param in kind.params.items() if param.default is REQUIRED}
        fault = {"kind": kind.name, **required}
        assert validate_faults([fault], 30, "decode")[0]["kind"] == kind.name


def test_a_kv_fault_needs_a_decode_target_and_the_others_do_not():
    assert kinds_of(on_kv=True) == ("kv_latency", "kv_reset", "kv_corrupt")
    with pytest.raises(ControlPlaneError, match="target.role must be decode"):
        validate_faults([{"kind": "kv_reset"}], 30, "prefill")


def test_a_kinds_own_check_names_its_field():
    with pytest.raises(ControlPlaneError) as refused:
        validate_faults([{"kind": "partition", "onset_s": 10, "duration_s": 5}], 30, "decode")
    assert refused.value.extra["field"] == "faults[0].onset_s"


def test_a_proxy_kinds_flags_come_from_its_declaration():
    assert KINDS["kv_corrupt"].proxy_flags({"ratio": 0.5, "bytes": 3}) == ["--corrupt-ratio", "0.5",
                                                                          "--corrupt-bytes", "3"]
    assert KINDS["latency"].proxy_flags({"ms": 20, "line_ms": 5}) == ["--latency-ms", "20", "--line-latency-ms", "5"]
