"""chunked_prefill, on by default in the worker, reaches it both ways: false becomes --no-chunked-prefill (leaving
a false setting out, as for other booleans, would leave it on), true --chunked-prefill; the chunk size as a number."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.models import Revision, Worker
from inference.worker.config import parse_args


def _argv(deployment, node, engine_settings) -> list[str]:
    number = deployment.revisions.count() + 1
    revision = Revision.objects.create(deployment=deployment, number=number,
                                       model_path=deployment.current_revision.model_path,
                                       engine_settings=engine_settings)
    argv = launch.argv_for(Worker(deployment=deployment, role="colocated", node=node, id=99, revision=revision), 1234)
    return argv[argv.index("inference.worker") + 1:]


def test_chunked_prefill_false_turns_the_workers_default_off(deployment, online_node):
    argv = _argv(deployment, online_node, {"chunked_prefill": False})
    assert "--no-chunked-prefill" in argv and "--chunked-prefill" not in argv
    assert parse_args(argv).engine.chunked_prefill is False


def test_chunked_prefill_true_and_a_chunk_size_are_passed_as_flags(deployment, online_node):
    argv = _argv(deployment, online_node, {"chunked_prefill": True, "prefill_chunk_size": 128})
    assert "--chunked-prefill" in argv and "--no-chunked-prefill" not in argv
    engine = parse_args(argv).engine
    assert (engine.chunked_prefill, engine.prefill_chunk_size) == (True, 128)


def test_a_false_setting_without_a_negative_flag_is_still_left_out(deployment, online_node):
    argv = _argv(deployment, online_node, {"allow_slow_float16": False})
    assert not any("slow-float16" in arg for arg in argv)
