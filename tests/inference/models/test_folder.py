"""build_once: concurrent builders never see half a folder, build once, and replace stale folders."""
from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from inference.models.folder import MARKER_NAME, build_once, read_marker

MARKER = {"kind": "test", "recipe": "v1"}


def _slow_build(tmp_dir: Path) -> None:
    # Counts builds in a file next to the target, and is slow enough for the other builder to arrive meanwhile.
    with open(tmp_dir.parent / "builds.log", "a") as log:
        log.write("built\n")
    (tmp_dir / "weights.bin").write_bytes(b"x" * 1000)
    time.sleep(0.3)
    (tmp_dir / "config.json").write_text("{}")


def _builder(out_dir: str, queue) -> None:
    path = build_once(Path(out_dir), MARKER, _slow_build)
    queue.put(sorted(p.name for p in path.iterdir()))


def test_two_processes_building_at_once_build_once_and_both_see_a_complete_folder(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_builder, args=(str(tmp_path / "m"), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    listings = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert listings == [[MARKER_NAME, "config.json", "weights.bin"]] * 2
    assert (tmp_path / "builds.log").read_text() == "built\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "builds.log", "m"]  # no temp folders left


def test_a_folder_with_a_stale_marker_is_replaced(tmp_path):
    out = tmp_path / "m"
    build_once(out, {"kind": "test", "recipe": "v0"}, lambda d: (d / "old.bin").write_bytes(b"old"))
    build_once(out, MARKER, lambda d: (d / "new.bin").write_bytes(b"new"))
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "new.bin"]
    assert read_marker(out) == MARKER


def test_a_failed_build_leaves_no_folder_behind(tmp_path):
    def broken(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_once(tmp_path / "m", MARKER, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock"]
