"""The autoscaler's arithmetic (HPA's algorithm), one evaluation at a time."""
import pytest

from controlplane.autoscaling.hpa import Bounds, QueueWait, decide, recommend

WIDE = Bounds(min_replicas=1, max_replicas=20, max_step=20, step_base=2)


def evaluate(current, observed, *, history=(), now=1000.0, target=1.0, bounds=WIDE, up=0.0, down=300.0, queue=None):
    return decide(current=current, observed=observed, target=target, tolerance=0.1, metric="ttft_p99_seconds",
                  history=list(history), now=now, up_window_s=up, down_window_s=down, bounds=bounds, queue=queue)


def test_it_scales_by_the_ratio_of_observed_to_target_rounded_up():
    assert recommend(2, 3.0, 1.0, 0.1) == (6, 3.0)
    assert recommend(3, 1.5, 1.0, 0.1) == (5, 1.5)  # ceil(4.5)
    assert recommend(2, 1.5, 1.0, 0.1)[0] == 3  # ceil(3.0) stays 3 despite float error


def test_it_keeps_the_size_within_the_tolerance():
    decision, _ = evaluate(4, 1.09)
    assert (decision.raw, decision.desired) == (4, 4)
    assert "within tolerance" in decision.reason
    decision, _ = evaluate(4, 0.91)
    assert decision.desired == 4


def test_it_scales_up_at_once_and_writes_the_numbers_in_the_reason():
    decision, history = evaluate(2, 2.0)
    assert decision.desired == 4 and decision.changes
    assert "ttft_p99_seconds 2 vs target 1" in decision.reason and "ceil(2 × 2.000) = 4" in decision.reason
    assert history == [(1000.0, 2), (1000.0, 4)]  # the current size seeds an empty history


def test_a_scale_down_waits_for_the_highest_recommendation_of_the_down_window():
    # 200 s ago the pool needed 4; now it needs 1: it stays at 4 until that recommendation leaves the window.
    decision, history = evaluate(4, 0.25, history=[(800.0, 4)])
    assert decision.desired == 4 and not decision.changes
    decision, _ = evaluate(4, 0.25, history=history, now=1101.0)  # (800, 4) is now 301 s old
    assert decision.desired == 1


def test_a_scale_down_with_no_window_goes_straight_to_the_recommendation():
    decision, _ = evaluate(4, 0.5, history=[(999.0, 4)], down=0.0)
    assert decision.desired == 2


def test_the_step_bounds_the_change_per_period():
    bounds = Bounds(min_replicas=1, max_replicas=20, max_step=2, step_base=2)
    decision, _ = evaluate(2, 5.0, bounds=bounds)  # asks for 10
    assert decision.raw == 10 and decision.desired == 4
    decision, _ = evaluate(8, 0.1, bounds=Bounds(1, 20, 2, step_base=8), down=0.0)  # asks for 1
    assert decision.desired == 6


def test_it_stays_within_min_and_max():
    decision, _ = evaluate(3, 10.0, bounds=Bounds(min_replicas=1, max_replicas=5, max_step=20, step_base=3))
    assert decision.desired == 5
    decision, _ = evaluate(3, 0.01, bounds=Bounds(min_replicas=2, max_replicas=5, max_step=20, step_base=3),
                           down=0.0)
    assert decision.desired == 2


def test_no_data_keeps_the_size_and_records_no_recommendation():
    decision, history = evaluate(3, None, history=[(900.0, 3)])
    assert decision.desired == 3 and decision.raw is None and "no data" in decision.reason
    assert history == [(900.0, 3)]


def test_an_empty_pool_with_load_above_target_asks_for_one_worker():
    assert recommend(0, 2.0, 1.0, 0.1)[0] == 1


def test_old_recommendations_leave_the_history():
    _, history = evaluate(2, 1.0, history=[(100.0, 9), (900.0, 3)])
    assert history == [(900.0, 3), (1000.0, 2)]


def test_a_zero_target_is_refused():
    with pytest.raises(ValueError, match="target must be positive"):
        recommend(1, 1.0, 0.0, 0.1)


def test_a_queue_wait_over_target_wins_over_a_pool_metric_that_looks_fine():
    decision, history = evaluate(2, 0.5, queue=QueueWait(wait_p99=1.5, num_queued=3, target=0.5))
    assert (decision.raw, decision.desired) == (6, 6)  # ceil(2 × 3.0); the TTFT alone asks for 1
    assert "queue wait P99 1.5 s > target 0.5 s: ceil(2 × 3.000) = 6" in decision.reason
    assert history[-1] == (1000.0, 6)


def test_a_short_queue_wait_never_argues_for_shrinking():
    decision, _ = evaluate(4, 0.5, history=[(999.0, 4)], down=0.0,
                           queue=QueueWait(wait_p99=0.0, num_queued=0, target=0.5))
    assert decision.desired == 2  # the pool metric's ceil(4 × 0.5); the queue's 0 is not taken


def test_requests_in_the_queue_hold_a_scale_in_but_not_a_scale_out():
    queued = QueueWait(wait_p99=None, num_queued=2, target=0.5)
    decision, _ = evaluate(4, 0.5, history=[(999.0, 4)], down=0.0, queue=queued)
    assert decision.desired == 4 and "no scale-in while 2 requests wait" in decision.reason
    assert evaluate(4, 2.0, queue=queued)[0].desired == 8
