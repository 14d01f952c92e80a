"""The worker's test-fault hook is gone (faults are injected from outside: docs/chaos.md): a revision stored before,
whose engine settings still carry `test_fault`, starts ordinary workers: the key is left out of their command line,
never passed as a flag (the worker would refuse an unknown flag and never start)."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.models import Revision


def test_a_stored_test_fault_setting_reaches_no_worker(deployment, make_worker):
    revision = deployment.current_revision
    Revision.objects.filter(pk=revision.pk).update(engine_settings={"common": {"test_fault": "error", "threads": 1}})
    deployment.refresh_from_db()
    argv = launch.argv_for(make_worker(deployment, "decode", revision=deployment.current_revision), 41234)
    assert not [arg for arg in argv if arg.startswith("--") and "fault" in arg]
    assert argv[argv.index("--threads") + 1] == "1"  # the revision's other settings still reach it
