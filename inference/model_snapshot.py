"""A private snapshot of a model folder, which a worker loads instead of the folder itself.

The weights are mapped from their files (safetensors), and the pages of a mapping whose file is truncated or
rewritten in place fault: a worker reading them dies of SIGBUS mid-step. So a worker started with
`--model-snapshots DIR` first copies the folder's files into DIR/<fingerprint>/ (once: workers of the same files
share the snapshot, and with it the page cache) and maps those, which nobody else writes: an operator rewriting the
model folder under load disturbs no running worker, and the next worker to start snapshots the new files.

The fingerprint is of each file's name, size and modification time (hashing gigabytes of weights at every start
would cost more than the copy); a snapshot is made in a temporary folder and renamed into place, so a reader never
sees a partial one, and of two workers making the same snapshot at once one rename wins.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

COMPLETE = ".tandem-snapshot-complete"


def fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(model_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def snapshot(model_dir: str | Path, root: str | Path) -> Path:
    """The snapshot of `model_dir` under `root` (made now where it does not exist yet)."""
    model_dir, root = Path(model_dir).resolve(), Path(root)
    target = root / f"{model_dir.name}-{fingerprint(model_dir)}"
    if (target / COMPLETE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}-", dir=root))
    try:
        shutil.copytree(model_dir, staging, dirs_exist_ok=True)
        (staging / COMPLETE).touch()
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / COMPLETE).is_file():
                raise
            # Another worker's rename won: its copy of the same files serves.
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
