"""The core reads a deployment's rollout through controlplane.rollout_provider, never from the rollouts app itself:
the app fills the provider in when Django is ready; without a provider no deployment has a rollout."""
from __future__ import annotations

from controlplane import rollout_provider
from controlplane.rollouts import selectors


def test_the_rollouts_app_provides_the_reads_the_core_makes():
    provider = rollout_provider._provider
    assert (provider.rollout_active, provider.tried_replicas, provider.traffic_weights, provider.variant_names) == (
        selectors.rollout_active, selectors.tried_replicas, selectors.traffic_weights, selectors.variant_names)


def test_without_a_provider_there_is_no_rollout_no_tried_worker_and_no_split(monkeypatch):
    monkeypatch.setattr(rollout_provider, "_provider", rollout_provider.NO_ROLLOUTS)
    deployment, pool = object(), object()
    assert rollout_provider.rollout_active(deployment) is None
    assert rollout_provider.tried_replicas(pool, None) == 0
    assert rollout_provider.traffic_weights(deployment, {1, 2}) is None
    assert rollout_provider.variant_names(deployment) == {}
