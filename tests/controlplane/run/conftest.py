"""make run's supervisor as the tests drive it: stacks of real child processes, stopped after the test."""
from __future__ import annotations

import os

import pytest

from controlplane.run.stack import Stack


@pytest.fixture
def stack(tmp_path):
    """stack(specs) -> a Stack of those children (not started), logging under tmp_path; every one stopped after."""
    stacks = []

    def make(specs):
        s = Stack(specs, log_dir=tmp_path / "logs", env=dict(os.environ), cwd=tmp_path, on_event=lambda m: None)
        stacks.append(s)
        return s

    yield make
    for s in stacks:
        s.stop()
