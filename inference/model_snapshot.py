"""A private snapshot of a model folder, which a worker loads instead of the folder itself; and the check that the
folder still holds the files its revision was first served from.

The weights are mapped from their files (safetensors), and the pages of a mapping whose file is truncated or
rewritten in place fault: a worker reading them dies of SIGBUS mid-step. So a worker started with
`--model-snapshots DIR` first copies the folder's files into DIR/<name>-<checksum>/ (once: workers of the same files
share the snapshot, and with it the page cache) and maps those, which nobody else writes: an operator rewriting the
model folder under load disturbs no running worker.

The checksum is of each file's name and size and of samples of its content (its first and last MiB and 16 blocks
spread between): hashing gigabytes of weights at every start would cost more than the copy, and new weights (another
training run, another quantization) differ in nearly every block. It tells a changed folder from the same files
copied elsewhere (where a fingerprint of modification times would not), not a flipped byte. A snapshot is made in
a temporary folder and renamed into place, so a reader never sees a partial one, and of two workers making the same
snapshot at once one rename wins.

A revision serves the files its first worker loaded (the node agent records their checksum and passes it to every
later start as `--model-checksum`): a worker whose folder holds other files now loads the snapshot of the recorded
ones where it is still there, and otherwise refuses to start, saying so (ModelChanged): weights changed under a
revision would otherwise serve a mix of models under one name, and new weights are a new revision.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

COMPLETE = ".tandem-snapshot-complete"
SAMPLE_BYTES = 1 << 20  # head and tail of each file
NUM_BLOCKS, BLOCK_BYTES = 16, 64 << 10  # spread between them


class ModelChanged(RuntimeError):
    """The folder no longer holds the files the revision was first served from, and no snapshot of them is left."""


def _sample(path: Path, digest) -> None:
    size = path.stat().st_size
    digest.update(f"{size}\n".encode())
    with open(path, "rb") as f:
        if size <= 2 * SAMPLE_BYTES + NUM_BLOCKS * BLOCK_BYTES:
            digest.update(f.read())
            return
        digest.update(f.read(SAMPLE_BYTES))
        span = size - 2 * SAMPLE_BYTES - BLOCK_BYTES
        for i in range(NUM_BLOCKS):
            f.seek(SAMPLE_BYTES + span * i // (NUM_BLOCKS - 1))
            digest.update(f.read(BLOCK_BYTES))
        f.seek(size - SAMPLE_BYTES)
        digest.update(f.read(SAMPLE_BYTES))


def checksum(model_dir: str | Path) -> str:
    """The folder's files: names, sizes and sampled content (module docstring)."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != COMPLETE):
        digest.update(f"{path.relative_to(model_dir)}\0".encode())
        _sample(path, digest)
    return digest.hexdigest()[:24]


def snapshot(model_dir: str | Path, root: str | Path, *, expected: str | None = None) -> Path:
    """The snapshot of `model_dir` under `root` (made now where it does not exist yet). `expected`: the checksum the
    revision was first served from; where the folder's files differ now, its snapshot (ModelChanged if none)."""
    model_dir, root = Path(model_dir).resolve(), Path(root)
    found = checksum(model_dir)
    if expected is not None and found != expected:
        kept = root / f"{model_dir.name}-{expected}"
        if (kept / COMPLETE).is_file():
            return kept
        raise ModelChanged(changed_message(model_dir, expected, found, snapshots=True))
    target = root / f"{model_dir.name}-{found}"
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
    if checksum(target) != found:  # rewritten while it was copied: not the files checked
        shutil.rmtree(target, ignore_errors=True)
        raise ModelChanged(f"the files of {model_dir} changed while they were copied to a snapshot; start again "
                           "once they are written")
    return target


def check_unchanged(model_dir: str | Path, expected: str) -> None:
    """Without snapshots: ModelChanged unless the folder still holds the revision's files."""
    found = checksum(model_dir)
    if found != expected:
        raise ModelChanged(changed_message(Path(model_dir), expected, found, snapshots=False))


def changed_message(model_dir: Path, expected: str, found: str, *, snapshots: bool) -> str:
    kept = "no snapshot of them is left" if snapshots else "this worker keeps no snapshots (--model-snapshots)"
    return (f"the files of {model_dir} are not the ones this revision was first served from (checksum {expected}, "
            f"now {found}), and {kept}: serve the new files with a new revision, or put the old ones back")
