"""Priority bands in the scheduler, one step at a time, with no model (no torch): waiting sequences are admitted best
band first (interactive, standard, batch), first come first served within a band, and a waiting sequence ages into
better bands so that none starves; in the plain, chunked and decode-role admissions alike."""
from inference.engine.block_manager import BlockManager
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import PRIORITY_BANDS, SamplingParams, Sequence

EOS = 2


class Clock:
    """The scheduler's clock in the tests: step() moves it on by a second."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(role="colocated", *, max_num_seqs=1, chunked=False, aging_s=1000.0, num_blocks=100):
    return Scheduler(role=role, block_manager=BlockManager(num_blocks, 4), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=64, max_model_len=256, eos_token_ids=frozenset([EOS]),
                     chunked_prefill=chunked, prefill_chunk_size=16 if chunked else None,
                     priority_aging_s=aging_s, clock=Clock())


def seq_of(request_id, band, num_tokens=5, max_tokens=1):
    seq = Sequence(request_id, [10 + i for i in range(num_tokens)], SamplingParams(max_tokens=max_tokens,
                                                                                  ignore_eos=True))
    seq.priority = PRIORITY_BANDS.index(band)
    return seq


def flood_running(sched) -> None:
    """Tenant `noisy`'s n1 and n2 running (standard, 50 tokens each)."""
    for request_id in ("n1", "n2"):
        seq = seq_of(request_id, "standard", max_tokens=50)
        seq.cache_salt = b"noisy"
        sched.add(seq)
    step(sched)


def step(sched):
    sched.clock.now += 1.0
    seqs, is_prefill = sched.schedule()
    sched.postprocess(seqs, [7 if seq.num_cached_tokens + seq.num_scheduled_tokens == seq.num_tokens else None
                             for seq in seqs], is_prefill)
    return [seq.request_id for seq in seqs]


def test_a_better_band_is_admitted_before_the_requests_queued_ahead_of_it():
    sched = make()
    for request_id, band in (("b1", "batch"), ("s1", "standard"), ("b2", "batch"), ("i1", "interactive")):
        sched.add(seq_of(request_id, band))
    assert [step(sched) for _ in range(4)] == [["i1"], ["s1"], ["b1"], ["b2"]]


def test_first_come_first_served_within_a_band():
    sched = make(max_num_seqs=8)
    for request_id in ("i1", "i2", "i3"):
        sched.add(seq_of(request_id, "interactive"))
    sched.add(seq_of("s1", "standard"))
    assert step(sched) == ["i1", "i2", "i3", "s1"]  # one prefill step, in that order


def test_the_head_of_the_best_band_is_not_overtaken_while_it_waits_for_blocks():
    sched = make(max_num_seqs=8, num_blocks=4)  # 16 tokens of KV
    sched.add(seq_of("running", "batch", num_tokens=8, max_tokens=50))
    step(sched)
    sched.add(seq_of("small", "batch", num_tokens=3))
    sched.add(seq_of("big", "interactive", num_tokens=12))  # needs 3 blocks; 2 are free
    assert step(sched) == ["running"]  # a decode: the small batch prompt that would fit does not jump the queue
    assert [s.request_id for s in sched.waiting] == ["small", "big"]


def test_a_batch_request_overtaken_without_end_ages_until_it_is_admitted():
    sched = make(aging_s=3.0)
    sched.add(seq_of("batch", "batch"))
    admitted = []
    for i in range(10):
        sched.add(seq_of(f"i{i}", "interactive"))  # a new interactive request every step
        admitted += step(sched)
    # Two bands up after 2 * 3 s (its 6th step): then it is the oldest interactive request and goes first.
    assert admitted.index("batch") == 5
    assert admitted[:5] == [f"i{i}" for i in range(5)]


def test_chunked_candidates_are_ordered_by_band_before_their_remaining_prefill():
    sched = make(max_num_seqs=8, chunked=True)
    sched.add(seq_of("short-batch", "batch", num_tokens=4))
    sched.add(seq_of("long-interactive", "interactive", num_tokens=40))
    assert step(sched) == ["long-interactive"]  # it takes the whole budget alone (16 < 40)
    assert sched.running[0].num_cached_tokens == 16 and sched.waiting[0].request_id == "short-batch"


def test_chunked_aging_lets_a_waiting_batch_prompt_in():
    sched = make(max_num_seqs=8, chunked=True, aging_s=2.0)
    sched.add(seq_of("batch", "batch", num_tokens=4))
    sched.add(seq_of("long", "interactive", num_tokens=200))
    fed = [step(sched) for _ in range(4)]
    # Interactive too after 4 s (its 4th step): then the shorter remaining prefill goes first (and alone: a partial chunk
    # behind a prompt that completes would only delay it).
    assert fed == [["long"], ["long"], ["long"], ["batch"]]


def test_the_decode_role_admits_by_band():
    sched = make(role="decode")
    for request_id, band in (("b", "batch"), ("s", "standard"), ("i", "interactive")):
        seq = seq_of(request_id, band, max_tokens=2)
        seq.append_token(7)  # the prefill worker's first token
        sched.add(seq)
    assert [step(sched) for _ in range(3)] == [["i"], ["s"], ["b"]]


def test_a_preempted_sequence_goes_back_to_the_front_of_its_band_not_before_a_better_one():
    sched = make(max_num_seqs=2, num_blocks=4)  # two 7-token prompts take every block by their 9th token
    sched.add(seq_of("a", "batch", num_tokens=7, max_tokens=50))
    sched.add(seq_of("b", "batch", num_tokens=7, max_tokens=50))
    assert step(sched) == ["a", "b"]  # prefill
    assert step(sched) == ["a", "b"]  # decode
    sched.add(seq_of("c", "interactive", num_tokens=3))
    assert step(sched) == ["a"]  # b preempted for a's next block
    assert [s.request_id for s in sched.waiting] == ["b", "c"] and sched.num_preemptions == 1
    # b (9 tokens, 3 blocks) does not fit in the 1 block left; c does, and its band goes first.
    assert step(sched) == ["c"]
    assert [s.request_id for s in sched.waiting] == ["b"]


def test_within_a_band_the_tenant_holding_fewest_sequences_goes_first():
    """A quiet tenant's request, for which the gateway preempted a flood's stream, takes the freed sequence before the
    flood's requests already waiting here; requests without a tenant keep first come first served."""
    for chunked in (False, True):
        sched = make(max_num_seqs=3, chunked=chunked)
        flood_running(sched)
        for request_id, salt in (("n3", b"noisy"), ("q1", b"quiet")):
            seq = seq_of(request_id, "standard")
            seq.cache_salt = salt
            sched.add(seq)
        assert step(sched)[0] == "q1", f"chunked={chunked}"
        assert [seq.request_id for seq in sched.waiting] == ["n3"]


def test_aging_lifts_a_request_past_other_classes_not_past_its_own_class_tenant_rule():
    """A flood's request that has waited here past `priority_aging_s` does not overtake a quiet tenant's fresh request
    of the same class (the tenant rule orders a class); a batch request still ages up to an interactive one."""
    for chunked in (False, True):
        sched = make(max_num_seqs=3, chunked=chunked, aging_s=2.0)
        flood_running(sched)
        waiting = seq_of("n3", "standard")
        waiting.cache_salt = b"noisy"
        sched.add(waiting)
        sched.clock.now += 5.0  # n3 has waited two aging spans and more
        quiet = seq_of("q1", "standard")
        quiet.cache_salt = b"quiet"
        sched.add(quiet)
        assert step(sched)[0] == "q1", f"chunked={chunked}"
        assert [seq.request_id for seq in sched.waiting] == ["n3"]
    sched = make(aging_s=2.0)
    sched.add(seq_of("old-batch", "batch"))
    sched.clock.now += 5.0
    sched.add(seq_of("i1", "interactive"))
    assert step(sched) == ["old-batch"], "aged to interactive, it is the older of the two there"


def test_a_prefill_between_layers_takes_one_tenants_requests_and_a_nested_one_only_those_that_outrank_it():
    """schedule_between: the first tenant's (and band's) requests only, so a quiet request's first token does not
    wait for a flood's prompts prefilled beside it; while a prefill runs (`outranking`), only a request of a better
    band or of a tenant holding fewer sequences."""
    sched = make(max_num_seqs=8, chunked=True)
    flood_running(sched)
    for request_id, salt in (("n3", b"noisy"), ("q1", b"quiet"), ("q2", b"quiet"), ("n4", b"noisy")):
        seq = seq_of(request_id, "standard", num_tokens=3)
        seq.cache_salt = salt
        sched.add(seq)
    quiet = sched.schedule_between(0)
    assert [seq.request_id for seq in quiet] == ["q1", "q2"]
    assert sched.schedule_between(0, outranking=quiet[0]) == [], "the flood's requests wait for quiet's prefill"
    flood = sched.schedule_between(0)
    assert [seq.request_id for seq in flood] == ["n3", "n4"]
    late = seq_of("q3", "standard", num_tokens=3)
    late.cache_salt = b"quiet"  # quiet holds 2 running sequences now, the flood 4
    sched.add(late)
    assert [seq.request_id for seq in sched.schedule_between(0, outranking=flood[0])] == ["q3"]
