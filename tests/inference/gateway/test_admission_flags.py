"""The admission flags: defaults per class, a class's deadline set on its own, and bad values refused at start-up
with a message that names the flag."""
from __future__ import annotations

import pytest

from inference.gateway.admission import DEFAULT_DEADLINES, DEFAULT_MAX_QUEUED
from inference.gateway.config import parse_args

BASE = ["--port", "8080", "--colocated", "http://127.0.0.1:9000"]


def test_the_defaults_queue_1024_and_wait_longer_for_lower_classes():
    config = parse_args(BASE)
    assert config.max_queued == DEFAULT_MAX_QUEUED == 1024
    assert config.queue_deadlines == DEFAULT_DEADLINES
    assert DEFAULT_DEADLINES["interactive"] < DEFAULT_DEADLINES["standard"] < DEFAULT_DEADLINES["batch"]


def test_one_class_deadline_keeps_the_others_defaults():
    config = parse_args([*BASE, "--queue-deadline", "batch=600", "--admission-queue", "0"])
    assert config.queue_deadlines == {**DEFAULT_DEADLINES, "batch": 600.0}
    assert config.max_queued == 0


@pytest.mark.parametrize(("flags", "named"), [
    (["--admission-queue", "-1"], "--admission-queue"),
    (["--queue-deadline", "batch=0"], "--queue-deadline"),
    (["--queue-deadline", "batch=nan"], "--queue-deadline"),
    (["--queue-deadline", "premium=5"], "--queue-deadline"),
    (["--queue-deadline", "batch"], "--queue-deadline"),
])
def test_a_bad_value_exits_2_naming_the_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args([*BASE, *flags])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
