"""Migration 0009 moves each stored flat engine-settings dict into `common`; reversing it flattens common back and
refuses while a revision has per-role parts (the flat shape cannot hold them)."""
from __future__ import annotations

import pytest

from tests.controlplane.migrations import migrations_restored

BEFORE = [("controlplane", "0008_node_labels_pool_placement")]
AFTER = [("controlplane", "0009_per_role_engine_settings")]


@pytest.mark.django_db(transaction=True)
def test_flat_settings_move_into_common_and_back():
    with migrations_restored() as _migrate:
        old = _migrate(BEFORE)
        deployment = old.get_model("controlplane", "Deployment").objects.create(name="old", mode="disaggregated",
                                                                                gateway_port=18001)
        Revision = old.get_model("controlplane", "Revision")
        flat = Revision.objects.create(deployment=deployment, number=1, model_path="/m",
                                       engine_settings={"threads": 2, "max_num_seqs": 8})
        empty = Revision.objects.create(deployment=deployment, number=2, model_path="/m", engine_settings={})

        new = _migrate(AFTER)
        Revision = new.get_model("controlplane", "Revision")
        assert Revision.objects.get(pk=flat.pk).engine_settings == {"common": {"threads": 2, "max_num_seqs": 8}}
        assert Revision.objects.get(pk=empty.pk).engine_settings == {"common": {}}
        assert new.get_model("controlplane", "Deployment").objects.get(pk=deployment.pk).sampling_defaults == {}

        old = _migrate(BEFORE)
        Revision = old.get_model("controlplane", "Revision")
        assert Revision.objects.get(pk=flat.pk).engine_settings == {"threads": 2, "max_num_seqs": 8}
        assert Revision.objects.get(pk=empty.pk).engine_settings == {}


@pytest.mark.django_db(transaction=True)
def test_reversing_refuses_while_a_revision_has_per_role_parts():
    with migrations_restored() as _migrate:
        new = _migrate(AFTER)
        deployment = new.get_model("controlplane", "Deployment").objects.create(name="split", mode="disaggregated",
                                                                                gateway_port=18002)
        new.get_model("controlplane", "Revision").objects.create(
            deployment=deployment, number=1, model_path="/m",
            engine_settings={"common": {}, "decode": {"max_num_seqs": 256}})
        with pytest.raises(RuntimeError, match=r"split#1"):
            _migrate(BEFORE)
