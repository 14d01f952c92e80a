"""A revision's `speculative` reaches its decode and colocated workers as --speculative JSON, which the worker's own
parser reads back to the same setting; prefill workers of a revision with it in common are started without it."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.models import Revision, Worker
from inference.worker.config import parse_args

SPEC = {"method": "layers", "num_tokens": 3, "layers": 2}


def _argv(worker) -> list[str]:
    argv = launch.argv_for(worker, 1234)
    return argv[argv.index("inference.worker") + 1:]


def test_the_revisions_speculative_setting_becomes_the_worker_flag(deployment, online_node):
    current = deployment.current_revision
    revision = Revision.objects.create(deployment=deployment, number=2, model_path=current.model_path,
                                       engine_settings={"common": {"speculative": SPEC}})
    decode = _argv(Worker(deployment=deployment, role="decode", node=online_node, id=99, revision=revision))
    assert parse_args(decode).engine.speculative == {**SPEC, "min_acceptance": 0.5}
    prefill = _argv(Worker(deployment=deployment, role="prefill", node=online_node, id=98, revision=revision))
    assert "--speculative" not in prefill
    assert parse_args(prefill).engine.speculative is None
