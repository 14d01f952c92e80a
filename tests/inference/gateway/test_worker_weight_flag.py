"""Static mode takes routing weights on the command line: --worker-weight URL=WEIGHT (repeatable, default 1).
A bad one stops the gateway at start with a message naming the flag and what is wrong."""
from __future__ import annotations

import pytest

from inference.gateway.config import parse_args

A, B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def test_weights_are_given_per_worker_url_and_others_weigh_1():
    config = parse_args(["--port", "0", "--colocated", f"{A},{B}", "--worker-weight", f"{A}/=3",
                         "--worker-weight", f"{B}=0.5"])
    assert config.worker_weights == {A: 3, B: 0.5}
    assert parse_args(["--port", "0", "--colocated", A]).worker_weights == {}


@pytest.mark.parametrize("args,message", [
    (["--worker-weight", f"{A}=0"], "the weight must be above 0 and at most 100, not 0"),
    (["--worker-weight", f"{A}=101"], "the weight must be above 0 and at most 100, not 101"),
    (["--worker-weight", f"{A}=-1"], "the weight must be a decimal number"),
    (["--worker-weight", f"{A}=three"], "the weight must be a decimal number such as 3 or 0.5, not 'three'"),
    (["--worker-weight", f"{A}=nan"], "the weight must be a decimal number"),
    (["--worker-weight", "3"], "write URL=WEIGHT"),
    (["--worker-weight", f"{A}=2", "--worker-weight", f"{A}=3"], f"--worker-weight names {A} twice"),
    (["--worker-weight", "http://127.0.0.1:9999=2"], "--worker-weight http://127.0.0.1:9999: not a worker given"),
])
def test_a_bad_worker_weight_is_refused_with_what_is_wrong(capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        parse_args(["--port", "0", "--colocated", f"{A},{B}", *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_weights_on_the_command_line_are_refused_with_a_control_plane(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--control-plane", "http://127.0.0.1:8000", "--deployment", "demo",
                    "--token", "t", "--worker-weight", f"{A}=3"])
    assert "the weights come from the control plane" in capsys.readouterr().err
