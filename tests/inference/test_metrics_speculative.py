"""The engine's speculative totals become the worker's counters (what is new since the last step) and its
acceptance ratio; the control plane derives per-second rates and the pooled ratio from the counters."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from controlplane.observability.derive import Increments, rate_series
from inference.metrics import TandemMetrics


def _samples(metrics: TandemMetrics) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(metrics.render().decode())
            for s in family.samples if s.name.startswith("tandem_spec_decode")}


def test_engine_totals_become_counters_and_a_ratio():
    metrics = TandemMetrics(role="decode", model="tiny", registry=CollectorRegistry(), process=False, gpu=False)
    assert _samples(metrics) == {"tandem_spec_decode_proposed_tokens_total": 0.0,
                                 "tandem_spec_decode_accepted_tokens_total": 0.0,
                                 "tandem_spec_decode_acceptance_ratio": 0.0}
    metrics.set_engine_stats({"num_spec_proposed_tokens": 8, "num_spec_accepted_tokens": 2})
    metrics.set_engine_stats({"num_spec_proposed_tokens": 8, "num_spec_accepted_tokens": 2})  # no new step
    metrics.set_engine_stats({"num_spec_proposed_tokens": 20, "num_spec_accepted_tokens": 11})
    assert _samples(metrics) == {"tandem_spec_decode_proposed_tokens_total": 20.0,
                                 "tandem_spec_decode_accepted_tokens_total": 11.0,
                                 "tandem_spec_decode_acceptance_ratio": pytest.approx(0.55)}


def test_rates_and_the_acceptance_ratio_come_from_the_counters():
    values = rate_series(Increments(span_s=10.0, counters={"spec_proposed": 40.0, "spec_accepted": 30.0}))
    assert values["spec_proposed_tokens_per_second"] == 4.0 and values["spec_accepted_tokens_per_second"] == 3.0
    assert values["spec_acceptance_ratio"] == 0.75
    idle = rate_series(Increments(span_s=10.0, counters={"spec_proposed": 0.0, "spec_accepted": 0.0}))
    assert "spec_acceptance_ratio" not in idle and idle["spec_proposed_tokens_per_second"] == 0.0
