"""A revision may turn `prefix_caching` off (or on) for all workers or one role, e.g. to canary it; a value that is
not a boolean is a 400 naming the setting, and no revision is made. The flag reaches the worker both ways."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.models import Deployment, Worker
from inference.worker.config import parse_args

pytestmark = pytest.mark.django_db


def test_a_revision_that_turns_prefix_caching_off_starts_workers_with_no_prefix_caching(admin_api, deployment,
                                                                                         online_node):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"prefix_caching": False}, "comment": "canary: no prefix cache"},
                              format="json")
    assert response.status_code == 202, response.content
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision.engine_settings == {"common": {"prefix_caching": False}}
    argv = launch.argv_for(Worker(deployment=deployment, role="colocated", node=online_node, id=99,
                                  revision=revision), 1234)
    argv = argv[argv.index("inference.worker") + 1:]
    assert "--no-prefix-caching" in argv and parse_args(argv).engine.prefix_caching is False


def test_prefix_caching_on_for_the_prefill_workers_only(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"common": {"prefix_caching": False},
                                                   "prefill": {"prefix_caching": True}}}, format="json")
    assert response.status_code == 202, response.content
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision.settings_for("prefill")["prefix_caching"] is True
    assert revision.settings_for("decode")["prefix_caching"] is False


@pytest.mark.parametrize("value", ["yes", 1, None, {"on": True}])
def test_a_prefix_caching_that_is_not_a_boolean_is_400_and_makes_no_revision(admin_api, deployment, value):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"prefix_caching": value}}, format="json")
    assert response.status_code == 400, response.content
    assert "engine_settings.common.prefix_caching" in str(response.json())
    assert deployment.revisions.count() == 1
