"""deployment_create and deployment_delete."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import Deployment, Pool
from controlplane.services import deployment_create, deployment_delete

pytestmark = pytest.mark.django_db


def test_zero_replicas_asked_means_min_zero(admin, model_dir):
    action = deployment_create(name="idle", mode="colocated", model_path=str(model_dir), replicas={"colocated": 0},
                               actor=admin)
    pool = Pool.objects.get(deployment=action.deployment)
    assert (pool.min_replicas, pool.desired_replicas, pool.max_replicas) == (0, 0, 8)


def test_max_replicas_above_the_limit_is_refused(admin, model_dir, settings):
    settings.TANDEM_MAX_REPLICAS_LIMIT = 16
    with pytest.raises(ControlPlaneError) as err:
        deployment_create(name="big", mode="colocated", model_path=str(model_dir), max_replicas={"colocated": 17},
                          actor=admin)
    assert "above the limit of 16" in err.value.message
    assert not Deployment.objects.exists()


def test_a_relative_model_path_is_resolved_from_the_repository(admin, settings, tmp_path):
    settings.BASE_DIR = tmp_path
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    action = deployment_create(name="rel", mode="colocated", model_path="models/m", actor=admin)
    assert action.deployment.current_revision.model_path == str((tmp_path / "models" / "m").resolve())


def test_the_gateway_port_must_not_be_the_web_port(admin, model_dir, settings):
    with pytest.raises(ControlPlaneError) as err:
        deployment_create(name="x", mode="colocated", model_path=str(model_dir), gateway_port=settings.TANDEM_WEB_PORT,
                          actor=admin)
    assert "web port" in err.value.message


def test_a_gateway_port_in_use_on_this_host_is_skipped(admin, model_dir, settings):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings.TANDEM_GATEWAY_PORT = busy.getsockname()[1]
        action = deployment_create(name="x", mode="colocated", model_path=str(model_dir), actor=admin)
    assert action.deployment.gateway_port > settings.TANDEM_GATEWAY_PORT


def test_delete_keeps_the_row_until_reconcile_removes_it(deployment, admin):
    action = deployment_delete(deployment=deployment, actor=admin, reason="retired")
    assert action.kind == "delete" and action.status == "pending"
    assert Deployment.objects.filter(pk=deployment.pk).exists()
    assert list(Pool.objects.filter(deployment=deployment).values_list("min_replicas", "desired_replicas")) == [
        (0, 0), (0, 0)]
