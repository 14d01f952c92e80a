"""A worker started with --model-snapshots maps a private copy of its model folder: the folder truncated under it
(an operator rewriting the weights in place) kills no running worker, where a worker mapping the folder itself died
of SIGBUS at its next step; the next worker started snapshots the new files."""
from __future__ import annotations

import shutil

import pytest

from tests.inference.worker.support import generate, start_worker, token_ids

pytestmark = pytest.mark.integration


def test_a_model_file_truncated_under_a_running_worker_does_not_kill_it(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    snapshots = tmp_path / "snapshots"
    # as_loaded: the weights stay mapped from their file (the transposed float32 layout copies them).
    worker = start_worker("snap", "colocated", model, tmp_path / "logs", "--weight-layout", "as_loaded",
                          "--model-snapshots", str(snapshots))
    try:
        before = token_ids(generate(worker.url, prompt="Hello there", max_tokens=8))
        with open(model / "model.safetensors", "r+b") as weights:
            weights.truncate(1000)  # rewritten in place: every mapped page of the old file is gone
        after = token_ids(generate(worker.url, prompt="Hello there", max_tokens=8))
        assert after == before and len(after) == 8
        assert worker.alive()
    finally:
        worker.stop()
    made = [p.name for p in snapshots.iterdir() if not p.name.startswith(".")]
    assert len(made) == 1 and made[0].startswith("model-")


def _rewrite_weights(model) -> None:
    """New weights in place (another training run's, as it were): every tensor scaled."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    save_file({name: tensor * 1.5 for name, tensor in tensors.items()}, model / "model.safetensors",
              metadata={"format": "pt"})


def test_a_revision_keeps_serving_the_files_it_was_first_served_from(tiny_model_dir, tmp_path):
    """The folder rewritten with new weights: a worker started with the revision's checksum loads the snapshot of the
    old files (the same tokens as before); without a snapshot of them it refuses to start and says why."""
    from inference.model_snapshot import checksum

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    snapshots, recorded = tmp_path / "snapshots", checksum(model)
    first = start_worker("first", "colocated", model, tmp_path / "logs", "--model-snapshots", str(snapshots),
                         "--model-checksum", recorded)
    try:
        before = token_ids(generate(first.url, prompt="Hello there", max_tokens=8, temperature=0))
    finally:
        first.stop()
    _rewrite_weights(model)
    assert checksum(model) != recorded
    again = start_worker("again", "colocated", model, tmp_path / "logs", "--model-snapshots", str(snapshots),
                         "--model-checksum", recorded)
    try:
        assert token_ids(generate(again.url, prompt="Hello there", max_tokens=8, temperature=0)) == before
    finally:
        again.stop()
    refused = start_worker("refused", "colocated", model, tmp_path / "logs", "--model-checksum", recorded,
                           wait=False)
    assert refused.popen.wait(timeout=120) != 0
    assert "not the ones this revision was first served from" in refused.log_path.read_text()
