"""A worker's log past its bound is rotated in place by its node agent: copied to `<log>.1` and emptied, and the
process, which appends, writes its next lines at the start of the new log (no hole the size of the old one)."""
from __future__ import annotations

import sys
import time

from controlplane.agent import processes

CHATTY = "import sys, time\nwhile True:\n    print('x' * 99, flush=True)\n    time.sleep(0.01)\n"


def test_a_log_past_its_bound_is_kept_once_and_the_process_goes_on_writing_at_its_start(tmp_path):
    log = tmp_path / "worker.log"
    handle = processes.spawn([sys.executable, "-c", CHATTY], log_path=log, marker="rotation-test")
    try:
        deadline = time.monotonic() + 30
        while log.stat().st_size < 20_000:  # ~10 KB a second
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert processes.log_rotate(log, 10_000)
        assert (tmp_path / "worker.log.1").stat().st_size >= 20_000
        deadline = time.monotonic() + 30
        while log.stat().st_size == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert log.stat().st_size < 20_000
        assert not log.read_bytes().startswith(b"\0")  # appended at the start, not after a hole
        assert not processes.log_rotate(log, 10_000_000)  # under its bound: left alone
    finally:
        processes.stop(handle, deadline_s=5)
