"""A revision serves the model files its first worker loaded: that worker's node agent records their checksum on the
revision, and passes it to every later start of the revision's workers (`--model-checksum`), which serve those
files or refuse to start (tests/inference/worker/test_model_snapshot.py); a folder that is not on this node records
nothing."""
from __future__ import annotations

import shutil

import pytest

from controlplane.agent import launch
from controlplane.models import Revision, Worker
from inference.model_snapshot import checksum

pytestmark = pytest.mark.django_db


def _flag(argv: list[str]) -> str | None:
    return argv[argv.index("--model-checksum") + 1] if "--model-checksum" in argv else None


def test_the_first_start_records_the_files_and_later_starts_pass_them(deployment, online_node, tiny_model_dir,
                                                                      tmp_path):
    model = tmp_path / "served-model"
    shutil.copytree(tiny_model_dir, model)
    current = deployment.current_revision
    revision = Revision.objects.create(deployment=deployment, number=current.number + 1, model_path=str(model))
    worker = Worker(deployment=deployment, role="decode", node=online_node, id=98, revision=revision)
    first = checksum(model)
    assert _flag(launch.argv_for(worker, 1234)) == first
    assert Revision.objects.get(pk=revision.pk).model_checksum == first
    (model / "config.json").write_text((model / "config.json").read_text() + " ")  # the folder changes
    worker.revision = Revision.objects.get(pk=revision.pk)
    assert _flag(launch.argv_for(worker, 1234)) == first  # what the revision was first served from, not the folder


def test_a_folder_not_on_this_node_records_nothing(deployment, online_node, tmp_path):
    current = deployment.current_revision
    revision = Revision.objects.create(deployment=deployment, number=current.number + 1,
                                       model_path=str(tmp_path / "elsewhere"))
    worker = Worker(deployment=deployment, role="decode", node=online_node, id=97, revision=revision)
    assert _flag(launch.argv_for(worker, 1234)) is None
    assert Revision.objects.get(pk=revision.pk).model_checksum == ""
