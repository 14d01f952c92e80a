"""A revision may carry `quantization: int8`; a bad value is a 400 naming it, and no revision is made."""
from __future__ import annotations

import pytest

from controlplane.models import Deployment

pytestmark = pytest.mark.django_db


def test_a_revision_with_int8_weights_is_made_current(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"quantization": "int8"}, "comment": "int8 weights"}, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["revision"]["engine_settings"] == {"common": {"quantization": "int8"}}
    assert Deployment.objects.get(pk=deployment.pk).current_revision.engine_settings == {
        "common": {"quantization": "int8"}}


def test_int8_weights_for_the_decode_workers_only(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"decode": {"quantization": "int8"}}}, format="json")
    assert response.status_code == 202, response.content
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision.settings_for("decode")["quantization"] == "int8"
    assert "quantization" not in revision.settings_for("prefill")


def test_an_unknown_quantization_is_400_and_makes_no_revision(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"quantization": "fp4"}}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert "engine_settings.common.quantization" in str(body) and "'fp4'" in str(body) and "none, int8" in str(body)
    assert deployment.revisions.count() == 1
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 1
