"""Profiles: built-ins load, a JSON file loads (in the stage-cost format, and in its first spelling), a bad one
names its field; the latency model is the one the docs describe."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inference.worker.sim_profile import BUILTIN, ProfileError, load_profile, parse_profile
from tests.procs import ROOT


def test_the_built_in_profiles_load():
    for name in BUILTIN:
        assert load_profile(name).name == name


def test_a_profile_file_loads_and_computes_latencies(tmp_path):
    data = json.loads(json.dumps(BUILTIN["tiny-cpu"]))
    data["name"] = "mine"
    data["roles"]["decode"]["decode"] = {"a": 0.01, "b": 0.001, "c": 0.0001}
    data["roles"]["prefill"]["prefill"] = {"a": 0.004, "b": 0.00002, "c": 1e-6}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    profile = load_profile(str(path))
    assert profile.name == "mine"
    # 4 sequences holding 100 tokens between them; one prompt of 100 tokens (its quadratic term included)
    assert profile.role("decode").decode_step_seconds(4, 100) == pytest.approx(0.01 + 0.004 + 0.01)
    assert profile.role("prefill").prefill_seconds(100) == pytest.approx(0.004 + 0.002 + 0.01)


def test_a_profile_in_the_first_spelling_still_loads_with_the_same_latencies(tmp_path):
    data = json.loads(json.dumps(BUILTIN["tiny-cpu"]))
    data["roles"] = {
        "prefill": {"prefill_s": {"base": 0.004, "per_token": 0.00002}, "kv_bytes_per_token": 2048},
        "decode": {"decode_step_s": {"base": 0.01, "per_seq": 0.001, "per_context_token": 0.0001},
                   "kv_bytes_per_token": 2048, "kv_cache_bytes": 64 << 20}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    profile = load_profile(str(path))
    assert profile.role("decode").decode_step_seconds(4, 100) == pytest.approx(0.01 + 0.004 + 0.01)
    assert profile.role("prefill").prefill_seconds(100) == pytest.approx(0.004 + 0.002)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["roles"]["decode"].pop("decode"), "roles.decode.decode is required"),
    (lambda d: d["roles"]["prefill"]["prefill"].update(a=-1), "roles.prefill.prefill.a"),
    (lambda d: d["roles"]["prefill"]["prefill"].update(base=1), "unknown keys"),
    (lambda d: d["roles"]["decode"].update(decode_step_s={"base": 0.01}), "both decode and decode_step_s"),
    (lambda d: d["roles"].update(prefill={"prefill_s": {"base": -1}, "kv_bytes_per_token": 8}),
     "roles.prefill.prefill_s.base"),
    (lambda d: d["kv_layout"].update(dtype="int8"), "kv_layout"),
    (lambda d: d["roles"].update(router={}), "roles.router"),
])
def test_a_bad_profile_names_what_is_wrong(mutate, field):
    data = json.loads(json.dumps(BUILTIN["tiny-cpu"]))
    mutate(data)
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        parse_profile(data)


def test_the_worker_refuses_an_unknown_profile_with_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "inference.worker", "--simulate", "nope", "--role", "decode",
                           "--model", "m", "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--simulate no profile 'nope'" in done.stderr


def test_a_simulated_worker_never_imports_torch():
    code = ("import sys; from inference.worker.server import WorkerServer; "
            "from inference.worker.sim_host import main; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
