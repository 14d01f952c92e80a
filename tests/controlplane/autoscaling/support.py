"""Helpers for the autoscaling tests."""
from controlplane.models import Pool


def pool_of(deployment, role="decode"):
    return Pool.objects.select_related("deployment").get(deployment=deployment, role=role)


def observe(deployment, metric, value, *, role="decode", at=None):
    """One stored pool-aggregate sample, as the scrape writes it (one second old unless `at` says when)."""
    import time

    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Sample

    Sample.objects.create(ts=at or time.time() - 1, deployment_id=deployment.pk, role=role, worker_id=None,
                          metric=METRIC_IDS[metric], value=value)


def advisory(deployment, actor):
    """Put the deployment's autoscaler in advisory mode through the settings service (the API's PUT)."""
    from controlplane.autoscaling.services import autoscaling_update

    autoscaling_update(deployment=deployment, actor=actor, mode="advisory")
