"""An experiment whose faults kill every ready worker of a pool its hypothesis needs one of is refused at run start
with a 409 naming the pool's size (the decode-kill template on a one-worker decode pool broke every stream and
answered 503 for 26 s); a pool with a survivor runs it."""
from __future__ import annotations

import time

import pytest

from controlplane.chaos.services import experiment_create, run_start
from controlplane.errors import ControlPlaneError
from tests.controlplane.chaos.test_driver import steady_history

pytestmark = pytest.mark.django_db


@pytest.fixture
def decode_kill(world, admin):
    return experiment_create(
        deployment=world["deployment"], actor=admin, name="decode-kill", target={"role": "decode", "count": 1},
        faults=[{"kind": "kill"}], duration_s=5,
        hypothesis=[{"metric": "server_error_ratio", "max": 0.005, "window_s": 5},
                    {"metric": "ready_workers", "role": "decode", "min": 1}],
        recovery_timeout_s=30)


def test_a_kill_that_leaves_no_survivor_is_a_409_naming_the_pools_size(decode_kill, world, gateway, operator):
    steady_history(gateway, time.time())
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=decode_kill, actor=operator)
    error = refused.value
    assert error.status == 409 and error.code == "no_survivor"
    assert "the decode pool of 'demo' has 1 ready worker(s) and the experiment takes 1" in error.message
    assert "scale the decode pool to 2 or more first" in error.message


def test_with_a_survivor_the_kill_runs(decode_kill, world, gateway, operator, make_worker,
                                       django_capture_on_commit_callbacks):
    make_worker(world["deployment"], "decode")
    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=False):  # the run starts; no agent carries the kill out here
        run = run_start(experiment=decode_kill, actor=operator)
    assert run.targets and run.targets[0]["role"] == "decode"
