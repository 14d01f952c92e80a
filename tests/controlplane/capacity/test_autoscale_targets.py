"""Capacity reads the autoscaler's policy targets through the seam the autoscaling app fills in
(controlplane.capacity.autoscale_targets), never by importing that app."""
import pytest

from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.capacity.autoscale_targets import policy_targets
from controlplane.models import Pool

pytestmark = pytest.mark.django_db


def test_it_reads_the_targets_of_the_deployments_policies(deployment):
    assert policy_targets(deployment) == []
    AutoscalingPolicy.objects.create(pool=Pool.objects.get(deployment=deployment, role="decode"),
                                     metric="itl_p99_seconds", target=0.05)
    assert policy_targets(deployment) == [("itl_p99_seconds", 0.05)]
