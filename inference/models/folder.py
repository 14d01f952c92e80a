"""Build a model folder once, atomically, safely against concurrent builders.

Several pytest processes (and `make test`) may ask for the same folder at the same moment. The rules:
1. A folder is complete exactly when its marker file exists and equals the expected marker; the marker is written
   last, inside a temporary sibling folder, which is then renamed into place, so no reader ever sees half a folder.
2. Builders serialise on an flock'd lock file next to the folder; the one that gets the lock second finds the
   marker and returns at once.
3. A folder with a stale or missing marker (an older recipe, an interrupted copy) is moved aside and replaced.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MARKER_NAME = ".tandem-model.json"
LOCK_TIMEOUT_S = 600.0


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_complete(folder: Path, marker: dict) -> bool:
    return read_marker(folder) == marker


def build_once(out_dir: Path, marker: dict, build: Callable[[Path], None]) -> Path:
    """Return out_dir, calling build(tmp_dir) to fill it first unless a complete folder with `marker` is there."""
    out_dir = Path(out_dir).resolve()
    if is_complete(out_dir, marker):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out_dir.parent / f".{out_dir.name}.lock"):
        if is_complete(out_dir, marker):  # another process built it while we waited for the lock
            return out_dir
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            build(tmp_dir)
            (tmp_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            _make_readable(tmp_dir)
            if out_dir.exists():
                stale = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.stale-", dir=out_dir.parent))
                os.rename(out_dir, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp_dir, out_dir)
        finally:
            if tmp_dir.exists():
                shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def _make_readable(folder: Path) -> None:
    """mkdtemp (and some writers) create private files; a model folder is shared by every worker on the host."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


class _locked:
    """An exclusive flock with a deadline (every wait has a timeout)."""

    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_S):
        self.path, self.timeout = path, timeout
        self.fd: int | None = None

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise TimeoutError(f"another process held {self.path} for more than {self.timeout:.0f}s")
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        assert self.fd is not None
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
