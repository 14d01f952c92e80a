"""A revision's `test_fault` engine setting reaches its workers as `--test-fault VALUE`; other revisions' workers
get no such flag."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.services import revision_create


def test_a_test_fault_is_passed_as_its_flag_and_only_to_its_revision(deployment, admin, make_worker, settings):
    settings.TANDEM_ALLOW_TEST_FAULTS = True
    plain = make_worker(deployment, "decode")
    revision_create(deployment=deployment, actor=admin, engine_settings={"common": {"test_fault": "slow:0.2"}})
    deployment.refresh_from_db()
    faulty = make_worker(deployment, "decode", revision=deployment.current_revision)
    argv = launch.argv_for(faulty, 41234)
    assert argv[argv.index("--test-fault") + 1] == "slow:0.2"
    assert "--test-fault" not in launch.argv_for(plain, 41235)
