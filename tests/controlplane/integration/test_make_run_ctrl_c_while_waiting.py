"""Ctrl-C while `make run` waits for the demo gateway stops everything and says nothing false: no "did not answer
within 600 s" for a wait that the user ended."""
from __future__ import annotations

import signal

import pytest

from tests.controlplane.integration.make_run import MakeRun

pytestmark = pytest.mark.integration


def test_ctrl_c_during_the_startup_wait_stops_cleanly_without_a_timeout_warning(tmp_path, tiny_model_dir):
    run = MakeRun(tmp_path, tiny_model_dir)
    try:
        run.start()
        run.wait_output("waiting for the demo gateway")
        # Workers need seconds to load even the tiny model: the wait is surely still on.
        assert "Tandem is ready" not in run.output()
        run.proc.send_signal(signal.SIGINT)
        assert run.wait_exit(timeout=120) == 0, run.output()
        output = run.output()
        assert "Tandem is ready" not in output, "the gateway was ready before Ctrl-C: this test tested nothing"
        assert "did not answer" not in output and "warning" not in output, output
        assert "stopped in" in output
    finally:
        run.stop()
