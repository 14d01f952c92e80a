"""Helpers for the autoscaling tests."""
from controlplane.models import Pool


def pool_of(deployment, role="decode"):
    return Pool.objects.select_related("deployment").get(deployment=deployment, role=role)
