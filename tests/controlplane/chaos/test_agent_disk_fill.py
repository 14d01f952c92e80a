"""disk_fill on a real filesystem: the agent writes one file under its var/ folder, as large as leaves `free_mib` free
there but at most `max_mib` (and the setting's bound), records what it wrote and the free space before and after, and
deletes it on a revert, at its deadline (the agent's timer) and after an agent restart (from the injected row); bad
settings are 400s naming the field. Each fill here is a few MiB."""
from __future__ import annotations

import errno
import os
import shutil
import time

import pytest

from controlplane.agent import fault_holds, fault_resume, faults, resource_faults, runtime
from controlplane.chaos.services import experiment_create, run_abort, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionStatus
from tests.controlplane.chaos.conftest import fault_leftovers, wait_until

AUDIT = {"chaos_run": 1, "experiment": "t"}
MIB = 1024 * 1024


@pytest.fixture
def var(world, settings, monkeypatch, tmp_path):
    """This process as the decode worker's node agent, with a var/ folder of its own."""
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    monkeypatch.setattr(runtime, "node_name", world["decode"].node.name)
    return settings.VAR_DIR


def _inject(world, key: str, *, seconds: float = 60, **params) -> str:
    return faults.fault_inject(key=key, kind="disk_fill", worker_id=world["decode"].pk, until=time.time() + seconds,
                               audit=AUDIT, params={"free_mib": 0, "max_mib": 8, **params})


def _injected(key: str) -> dict:
    return Action.objects.get(idempotency_key=faults.injected_key(key)).result


def _reverted(key: str) -> dict:
    return Action.objects.get(idempotency_key=faults.reverted_key(key)).result


def _fill_files(var) -> list[str]:
    return sorted(path.name for path in var.iterdir())


@pytest.mark.django_db(transaction=True)
def test_the_file_is_at_most_max_mib_and_its_row_records_the_free_space(world, var):
    assert _inject(world, "chaos-7-0-w1") == "filled"
    state = _injected("chaos-7-0-w1")
    path = var / "chaos-disk-fill-7-0-w1.fill"
    assert state["fill_path"] == str(path) and _fill_files(var) == [path.name]
    assert state["fill_mib"] == 8 and path.stat().st_size == 8 * MIB
    assert path.stat().st_blocks * 512 >= 8 * MIB  # reserved on disk, not a sparse file
    assert state["method"] == "fallocate" and state["node"] == world["decode"].node.name
    # Other processes write and delete on this disk too: the figures are the free space around the write, roughly.
    assert 0 < state["free_mib_after"] <= state["free_mib_before"] + 256
    assert abs(state["free_mib_before"] - state["free_mib_after"] - 8) <= 256
    assert faults.fault_revert(key="chaos-7-0-w1", kind="disk_fill", worker_id=world["decode"].pk,
                               audit=AUDIT) == "removed"
    assert _fill_files(var) == [] and _reverted("chaos-7-0-w1")["by"] == "a revert"
    assert not fault_leftovers(keys=["chaos-7-0-w1"], ports={})


@pytest.mark.django_db(transaction=True)
def test_it_leaves_free_mib_free_and_writes_nothing_where_less_is_free(world, var):
    free_mib = shutil.disk_usage(var).free // MIB
    assert _inject(world, "d-nearly", free_mib=max(0, free_mib - 3)) == "filled"
    assert _injected("d-nearly")["fill_mib"] <= 8  # about 3 MiB, give or take what others wrote meanwhile
    assert _inject(world, "d-full", free_mib=free_mib + 1024) == "filled"
    state = _injected("d-full")
    assert state["fill_mib"] == 0 and state["method"] == "none"
    assert os.path.getsize(state["fill_path"]) == 0
    for key in ("d-nearly", "d-full"):
        assert faults.fault_revert(key=key, kind="disk_fill", worker_id=world["decode"].pk, audit=AUDIT) == "removed"
    assert _fill_files(var) == []


@pytest.mark.django_db(transaction=True)
def test_the_setting_bounds_max_mib(world, var, settings):
    settings.TANDEM_CHAOS_DISK_FILL_MAX_MIB = 2
    assert _inject(world, "d-bound", max_mib=8) == "filled"
    assert _injected("d-bound")["fill_mib"] == 2
    assert os.path.getsize(_injected("d-bound")["fill_path"]) == 2 * MIB


@pytest.mark.django_db(transaction=True)
def test_without_fallocate_it_writes_the_file(world, var, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    assert _inject(world, "d-write", max_mib=4) == "filled"
    state = _injected("d-write")
    assert state["method"] == "write" and state["fill_mib"] == 4
    assert os.path.getsize(state["fill_path"]) == 4 * MIB


@pytest.mark.django_db(transaction=True)
def test_a_file_that_cannot_be_written_fails_the_fault_and_leaves_nothing(world, var, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert _inject(world, "d-enospc") == "failed"
    injected = Action.objects.get(idempotency_key=faults.injected_key("d-enospc"))
    assert injected.status == ActionStatus.FAILED and "No space left" in injected.result["error"]
    assert _fill_files(var) == [] and fault_holds.paused_keys() == []


@pytest.mark.django_db(transaction=True)
def test_the_agents_deadline_deletes_the_file(world, var):
    assert _inject(world, "d-deadline", seconds=5) == "filled"  # room for a busy host's inject
    assert _fill_files(var) == ["chaos-disk-fill-d-deadline.fill"]
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("d-deadline")).first(), timeout=20)
    assert reverted.result["by"] == "the agent's deadline" and reverted.result["outcome"] == "removed"
    assert _fill_files(var) == [] and fault_holds.paused_keys() == []


def _agent_dies(key: str) -> None:
    """The agent process ends: its timers and what it held are gone."""
    with fault_holds.held_lock:
        fault_holds.held.pop(key).timer.cancel()


@pytest.mark.django_db(transaction=True)
def test_a_restarted_agent_holds_the_file_again_until_its_deadline(world, var):
    node = world["decode"].node.name
    assert _inject(world, "d-again", seconds=8) == "filled"  # room for a busy host's inject and restart
    _agent_dies("d-again")
    assert fault_resume.faults_resume_after_restart(node_name=node) == ["d-again"]
    assert fault_holds.paused_keys() == ["d-again"] and _fill_files(var) == ["chaos-disk-fill-d-again.fill"]
    assert fault_resume.faults_resume_after_restart(node_name=node) == []  # held already
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("d-again")).first(), timeout=20)
    assert reverted.result["by"] == "the agent's deadline" and reverted.result["outcome"] == "removed"
    assert _fill_files(var) == []


@pytest.mark.django_db(transaction=True)
def test_a_restarted_agent_deletes_a_file_whose_deadline_passed(world, var):
    assert _inject(world, "d-late") == "filled"
    _agent_dies("d-late")
    # The deadline passes while no agent runs: the injected row, the restarted agent's only memory, says it has
    # (a real minute's wait would prove nothing more; a deadline of a second can pass before a busy host injects).
    row = Action.objects.get(idempotency_key=faults.injected_key("d-late"))
    row.result = {**row.result, "until": time.time() - 1}
    row.save(update_fields=["result"])
    assert fault_resume.faults_resume_after_restart(node_name=world["decode"].node.name) == ["d-late"]
    reverted = _reverted("d-late")
    assert reverted["outcome"] == "removed" and reverted["by"] == "the agent's restart"
    assert _fill_files(var) == [] and fault_holds.paused_keys() == []


@pytest.mark.django_db(transaction=True)
def test_a_revert_that_reaches_a_restarted_agent_deletes_the_file_from_the_injected_row(world, var):
    assert _inject(world, "d-row") == "filled"
    _agent_dies("d-row")
    assert faults.fault_revert(key="d-row", kind="disk_fill", worker_id=world["decode"].pk, audit=AUDIT) == "removed"
    assert _fill_files(var) == []
    assert faults.fault_revert(key="d-row", kind="disk_fill", worker_id=world["decode"].pk,
                               audit=AUDIT) == "already-reverted"


def _experiment(world, admin, name, faults_):
    return experiment_create(deployment=world["deployment"], actor=admin, name=name,
                             target={"role": "decode", "count": 1}, faults=faults_, duration_s=30,
                             hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])


@pytest.mark.django_db(transaction=True)
def test_a_run_fills_and_its_abort_deletes_the_file(
        world, var, admin, operator, agent_inline, django_capture_on_commit_callbacks):
    experiment = _experiment(world, admin, "fill", [{"kind": "disk_fill", "max_mib": 4}])
    assert experiment.faults == [{"kind": "disk_fill", "free_mib": 64, "max_mib": 4}]
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    key, = [fault["key"] for fault in run.__class__.objects.get(pk=run.pk).faults]
    assert _injected(key)["fill_mib"] == 4 and _fill_files(var) == [resource_faults.fill_path(key).name]
    with django_capture_on_commit_callbacks(execute=True):
        run_abort(run=run, actor=operator)
    assert _reverted(key)["outcome"] == "removed" and _fill_files(var) == []


@pytest.mark.django_db
def test_max_mib_defaults_to_the_setting(world, admin, settings):
    settings.TANDEM_CHAOS_DISK_FILL_MAX_MIB = 100
    experiment = _experiment(world, admin, "fill", [{"kind": "disk_fill"}])
    assert experiment.faults == [{"kind": "disk_fill", "free_mib": 64, "max_mib": 100}]


@pytest.mark.django_db
@pytest.mark.parametrize("fault, field", [
    ({"kind": "disk_fill", "free_mib": -1}, "faults[0].free_mib"),
    ({"kind": "disk_fill", "free_mib": 1.5}, "faults[0].free_mib"),
    ({"kind": "disk_fill", "max_mib": 0}, "faults[0].max_mib"),
    ({"kind": "disk_fill", "max_mib": 4097}, "faults[0].max_mib"),  # past TANDEM_CHAOS_DISK_FILL_MAX_MIB
    ({"kind": "disk_fill", "max_mib": "8"}, "faults[0].max_mib"),
    ({"kind": "disk_fill", "mib": 8}, "faults[0].mib"),
])
def test_bad_disk_fills_are_400s_naming_the_field(world, admin, settings, fault, field):
    settings.TANDEM_CHAOS_DISK_FILL_MAX_MIB = 4096
    with pytest.raises(ControlPlaneError) as error:
        _experiment(world, admin, "bad", [fault])
    assert error.value.status == 400 and error.value.extra["field"] == field
