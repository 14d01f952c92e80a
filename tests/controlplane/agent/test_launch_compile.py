"""`compile`, a boolean engine setting of a revision, is checked by the API's rules and reaches the worker as
--compile (left out when false: the worker's default is off)."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.errors import ControlPlaneError
from controlplane.models import Revision, Worker
from controlplane.services.validation import validate_engine_settings
from inference.worker.config import parse_args


def _argv(deployment, node, engine_settings) -> list[str]:
    revision = Revision.objects.create(deployment=deployment, number=deployment.revisions.count() + 1,
                                       model_path=deployment.current_revision.model_path,
                                       engine_settings=engine_settings)
    argv = launch.argv_for(Worker(deployment=deployment, role="decode", node=node, id=99, revision=revision), 1234)
    return argv[argv.index("inference.worker") + 1:]


def test_compile_is_an_engine_setting_per_role():
    assert validate_engine_settings({"decode": {"compile": True}}, roles=("prefill", "decode")) == {
        "common": {}, "decode": {"compile": True}}


def test_compile_must_be_a_boolean():
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({"compile": "yes"})
    assert err.value.extra["field"] == "engine_settings.common.compile"
    assert "must be true or false" in err.value.message


def test_compile_true_reaches_the_worker_as_its_flag(deployment, online_node):
    argv = _argv(deployment, online_node, {"compile": True})
    assert "--compile" in argv
    assert parse_args(argv).engine.compile is True


def test_compile_false_is_left_out(deployment, online_node):
    argv = _argv(deployment, online_node, {"compile": False})
    assert "--compile" not in argv and "--no-compile" not in argv
    assert parse_args(argv).engine.compile is False
