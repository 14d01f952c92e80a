"""The ITL objective bounds the decode batch: the fit of recent decode steps gives the largest batch whose step stays
within a share of the objective, and the scheduler admits no more than that (colocated, chunked and decode role);
with no objective, max_num_seqs as before. No model, no torch: the step times are recorded by hand."""
import pytest

from inference.engine.batch_limit import STEP_SHARE, DecodeStepTimes
from inference.engine.block_manager import BlockManager
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import SamplingParams, Sequence

EOS = 2


def times_of(samples) -> DecodeStepTimes:
    times = DecodeStepTimes()
    for num_seqs, seconds in samples:
        times.record(num_seqs, seconds)
    return times


def test_the_limit_is_the_largest_batch_whose_fitted_step_fits_the_objective():
    # 10 ms fixed, 2 ms per sequence: 0.1 s * 0.8 = 80 ms holds 35 sequences.
    times = times_of([(n, 0.010 + 0.002 * n) for n in (1, 4, 8, 16, 32) for _ in range(3)])
    assert times.fit() == pytest.approx((0.010, 0.002))
    assert times.limit(0.1, 64) == int((0.1 * STEP_SHARE - 0.010) / 0.002) == 35
    assert times.limit(10.0, 64) == 64  # never above max_num_seqs
    assert times.limit(0.001, 64) == 1  # one step alone exceeds it: batching less cannot help, never 0
    assert times.limit(None, 64) == 64  # no objective


def test_one_batch_size_seen_is_taken_as_all_per_sequence():
    times = times_of([(8, 0.040)] * 4)  # 5 ms a sequence, pessimistically
    assert times.fit() == (0.0, pytest.approx(0.005))
    assert times.limit(0.1, 64) == 16


def test_nothing_recorded_means_no_limit_yet():
    assert DecodeStepTimes().limit(0.05, 32) == 32


def make(role="colocated", *, max_num_seqs=8, chunked=False):
    return Scheduler(role=role, block_manager=BlockManager(400, 4), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=256, max_model_len=256, eos_token_ids=frozenset([EOS]),
                     chunked_prefill=chunked, prefill_chunk_size=64 if chunked else None)


def seq_of(request_id, *, itl_target_s=None, prefilled=False):
    seq = Sequence(request_id, [10 + i for i in range(5)], SamplingParams(max_tokens=50, ignore_eos=True))
    seq.itl_target_s = itl_target_s
    if prefilled:  # decode role: arrives with its prompt's K/V and first token
        seq.append_token(7)
    return seq


def run_steps(sched, num_steps: int) -> None:
    for _ in range(num_steps):
        seqs, is_prefill = sched.schedule()
        sched.postprocess(seqs, [7 if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens else None
                                 for seq in seqs], is_prefill)


@pytest.mark.parametrize("role,chunked", [("colocated", False), ("colocated", True), ("decode", False)])
def test_the_scheduler_admits_up_to_the_limit_and_the_rest_wait(role, chunked):
    sched = make(role, chunked=chunked)
    # Recorded decode steps: 10 ms a sequence. An objective of 50 ms allows 4.
    for n in (1, 2, 4):
        sched.step_times.record(n, 0.010 * n)
    for i in range(6):
        sched.add(seq_of(f"r{i}", itl_target_s=0.05, prefilled=role == "decode"))
    run_steps(sched, 3)
    assert sched.seq_limit == 4
    assert [seq.request_id for seq in sched.running] == ["r0", "r1", "r2", "r3"]
    assert len(sched.waiting) == 2


def test_without_an_objective_max_num_seqs_holds_whatever_the_steps_cost():
    sched = make()
    sched.step_times.record(4, 4.0)  # a second a sequence
    for i in range(6):
        sched.add(seq_of(f"r{i}"))
    run_steps(sched, 2)
    assert sched.seq_limit == 8 and len(sched.running) == 6


def test_sequences_running_above_a_lowered_limit_finish_and_none_is_admitted_meanwhile():
    sched = make()
    for i in range(6):
        sched.add(seq_of(f"r{i}", itl_target_s=0.05))
    run_steps(sched, 2)
    assert len(sched.running) == 6  # nothing recorded yet: no limit
    for _ in range(4):
        sched.step_times.record(6, 0.060)  # 10 ms a sequence: 4 fit
    sched.add(seq_of("late", itl_target_s=0.05))
    run_steps(sched, 17)  # the fit is redone every 16 steps at most
    assert sched.seq_limit == 4
    assert len(sched.running) == 6 and [seq.request_id for seq in sched.waiting] == ["late"]  # none preempted


def test_a_bound_batch_keeps_the_last_fit_of_several_sizes():
    """Once the limit binds, every recent step has its size: the fit of several sizes seen before stands, so the
    limit neither locks where it is nor falls to what an all-per-sequence reading of one size would give."""
    times = times_of([(n, 0.036 + 0.003 * n) for n in (1, 2, 4, 8) for _ in range(4)])
    assert times.limit(0.1, 64) == int((0.08 - 0.036) / 0.003)  # 14
    for _ in range(300):  # the window now holds only batches of 14
        times.record(14, 0.036 + 0.003 * 14)
    assert times.fit() == pytest.approx((0.036, 0.003))
    assert times.limit(0.1, 64) == 14


def test_above_the_limit_a_tenant_below_its_fair_share_is_still_admitted_and_a_flood_is_not():
    """The flood's six sequences ran before the limit fell to 4: a quiet tenant's requests join up to its fair share
    of the limit (4 / 2 tenants), the flood's next one waits."""
    sched = make(max_num_seqs=16)
    for i in range(6):
        seq = seq_of(f"flood{i}", itl_target_s=0.05)
        seq.cache_salt = b"noisy"
        sched.add(seq)
    run_steps(sched, 2)
    for _ in range(4):
        sched.step_times.record(6, 0.060)  # 10 ms a sequence: 4 fit
    for request_id, salt in (("flood6", b"noisy"), ("q1", b"quiet"), ("q2", b"quiet"), ("q3", b"quiet")):
        seq = seq_of(request_id, itl_target_s=0.05)
        seq.cache_salt = salt
        sched.add(seq)
    run_steps(sched, 3)
    assert sched.seq_limit == 4
    assert [seq.request_id for seq in sched.running if seq.cache_salt == b"quiet"] == ["q1", "q2"]
    assert sorted(seq.request_id for seq in sched.waiting) == ["flood6", "q3"]


def test_the_prompt_tokens_beside_decodes_shrink_to_what_the_objective_leaves():
    # 10 ms fixed, 2 ms a sequence (a prompt token priced the same); objective 0.1 s: a step may fill 90 ms.
    times = times_of([(n, 0.010 + 0.002 * n) for n in (1, 4, 8, 16, 32) for _ in range(3)])
    times.limit(0.1, 64)  # the fit the scheduler reads, as after a step
    assert times.prefill_tokens(0.1, 20, 64) == 20  # 90 - 10 - 40 ms leave 40 ms: 20 tokens
    assert times.prefill_tokens(0.1, 20, 64, own_pass=True) == 15  # a pass of its own costs the fixed part again
    assert times.prefill_tokens(0.1, 40, 64) == 8  # nothing left: the fewest, so that a prompt still moves
    assert times.prefill_tokens(0.1, 2, 64) == 38 and times.prefill_tokens(0.1, 2, 16) == 16  # never above `most`
    assert times.prefill_tokens(None, 20, 64) == 64 and DecodeStepTimes().prefill_tokens(0.1, 20, 64) == 64


def test_a_resumed_streams_recompute_beside_decodes_comes_in_chunks_the_objective_leaves_room_for():
    """A preempted stream comes back with every token it had sent to recompute: beside running decodes, its chunks
    are what the objective leaves of the step, not the chunk size (64 here)."""
    sched = make(chunked=True)
    for n in (1, 2, 4):
        sched.step_times.record(n, 0.010 + 0.005 * n)  # 10 ms fixed, 5 ms a sequence
    for i in range(4):
        sched.add(seq_of(f"r{i}", itl_target_s=0.1))
    run_steps(sched, 2)
    resumed = Sequence("resumed", list(range(10, 130)), SamplingParams(max_tokens=50, ignore_eos=True))
    resumed.itl_target_s = 0.1
    sched.add(resumed)
    seqs, _ = sched.schedule()
    # 90 ms less 10 fixed and 4 decodes' 20 leave 60 ms: 12 tokens at 5 ms.
    assert resumed in seqs and resumed.num_scheduled_tokens == 12
    assert sum(seq.num_scheduled_tokens for seq in seqs) == 16
    # Without an objective, the chunk beside decodes as before: 64 tokens less the 4 decodes'.
    plain = make(chunked=True)
    for i in range(4):
        plain.add(seq_of(f"r{i}"))
    run_steps(plain, 2)
    plain.add(Sequence("resumed", list(range(10, 130)), SamplingParams(max_tokens=50, ignore_eos=True)))
    seqs, _ = plain.schedule()
    assert [seq.num_scheduled_tokens for seq in seqs if seq.request_id == "resumed"] == [60]
