"""Migration 0005 makes `auto` the default dtype of new revisions; revisions stored before keep their float32."""
from __future__ import annotations

import pytest

from tests.controlplane.migrations import migrations_restored

BEFORE = [("controlplane", "0004_action_request_fingerprint")]
AFTER = [("controlplane", "0005_revision_dtype_auto_worker_dtype")]


@pytest.mark.django_db(transaction=True)
def test_stored_float32_revisions_stay_float32_and_new_ones_default_to_auto():
    with migrations_restored() as migrate:
        old = migrate(BEFORE)
        deployment = old.get_model("controlplane", "Deployment").objects.create(name="old", mode="colocated",
                                                                                gateway_port=18001)
        revision = old.get_model("controlplane", "Revision").objects.create(deployment=deployment, number=1,
                                                                            model_path="/m")
        assert revision.dtype == "float32"  # the default before 0005, stored in the row

        new = migrate(AFTER)
        Revision = new.get_model("controlplane", "Revision")
        assert Revision.objects.get(pk=revision.pk).dtype == "float32"
        added = Revision.objects.create(deployment_id=deployment.pk, number=2, model_path="/m")
        assert Revision.objects.get(pk=added.pk).dtype == "auto"
