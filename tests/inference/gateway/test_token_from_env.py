"""The gateway reads its control-plane token from TANDEM_CONTROL_PLANE_TOKEN when --token is not given, so that a
node agent can start it without putting the secret on a command line (visible in `ps`)."""
from __future__ import annotations

import pytest

from inference.gateway.config import parse_args

ARGS = ["--port", "9000", "--control-plane", "http://127.0.0.1:8000", "--deployment", "demo"]


def test_it_takes_the_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("TANDEM_CONTROL_PLANE_TOKEN", "from-env")
    assert parse_args(ARGS).token == "from-env"


def test_a_token_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("TANDEM_CONTROL_PLANE_TOKEN", "from-env")
    assert parse_args([*ARGS, "--token", "from-flag"]).token == "from-flag"


def test_without_either_it_refuses_to_start(monkeypatch):
    monkeypatch.delenv("TANDEM_CONTROL_PLANE_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        parse_args(ARGS)
