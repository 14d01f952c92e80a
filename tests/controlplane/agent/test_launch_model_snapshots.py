"""The node agent starts Tandem's workers on a private snapshot of their model folder under var/ (a rewrite of the
folder under load then kills none of them), unless TANDEM_MODEL_SNAPSHOTS=0; a simulated worker has no model."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.models import Worker

pytestmark = pytest.mark.django_db


def _argv(deployment, node) -> list[str]:
    worker = Worker(deployment=deployment, role="decode", node=node, id=81, revision=deployment.current_revision)
    return launch.argv_for(worker, 8300)


def test_workers_load_a_snapshot_under_var_unless_turned_off(deployment, online_node, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    argv = _argv(deployment, online_node)
    assert argv[argv.index("--model-snapshots") + 1] == str(tmp_path / "model-snapshots")
    settings.TANDEM_MODEL_SNAPSHOTS = False
    assert "--model-snapshots" not in _argv(deployment, online_node)
