"""The chunked scheduler, one step at a time, with no model (no torch): the step budget (the chunk beside decodes,
the larger one of a step without any), mixed decode and prefill steps, and who gets the prefill budget (shortest
remaining first, with aging so that a long prompt never starves)."""
from inference.engine.block_manager import BlockManager
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import SamplingParams, Sequence, SequenceStatus

EOS = 2


def make(role="colocated", num_blocks=200, block_size=4, max_num_seqs=8, budget=16, max_num_batched_tokens=2048,
         budget_alone=None):
    return Scheduler(role=role, block_manager=BlockManager(num_blocks, block_size), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, max_model_len=4096,
                     eos_token_ids=frozenset([EOS]), chunked_prefill=True, prefill_chunk_size=budget,
                     prefill_chunk_size_alone=budget_alone)


def seq_of(request_id, num_tokens, max_tokens=50):
    return Sequence(request_id, [10 + i for i in range(num_tokens)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def step(sched, token=7):
    """One step: {request_id: tokens it was fed}, sampling only for the sequences whose tokens reach their end."""
    seqs, is_prefill = sched.schedule()
    fed = {seq.request_id: seq.num_scheduled_tokens for seq in seqs}
    sched.postprocess(seqs, [token if seq.samples_next_token else None for seq in seqs], is_prefill)
    return fed


def test_a_long_prompt_is_fed_in_chunks_of_the_step_budget():
    sched = make(budget=16)
    sched.add(seq_of("long", 40))
    assert [step(sched) for _ in range(3)] == [{"long": 16}, {"long": 16}, {"long": 8}]
    (seq,) = sched.running
    assert seq.num_cached_tokens == 40 and seq.num_tokens == 41 and not seq.is_prefilling
    assert sched.block_manager.num_used_blocks == 10  # blocks for the whole prompt from its first chunk on
    assert sched.num_prefill_tokens_computed == 40


def test_running_streams_decode_in_every_step_and_the_long_prompt_gets_the_rest_of_the_budget():
    sched = make(budget=16)
    for i in range(3):
        sched.add(seq_of(f"s{i}", 2))
    step(sched)
    sched.add(seq_of("long", 40))
    assert step(sched) == {"long": 13, "s0": 1, "s1": 1, "s2": 1}
    assert sched.num_batched_tokens == 16
    assert step(sched) == {"long": 13, "s0": 1, "s1": 1, "s2": 1}
    assert step(sched) == {"long": 13, "s0": 1, "s1": 1, "s2": 1}
    assert step(sched) == {"long": 1, "s0": 1, "s1": 1, "s2": 1}
    assert step(sched) == {"s0": 1, "s1": 1, "s2": 1, "long": 1}  # now a decode like the others


def test_a_short_prompt_goes_before_the_rest_of_a_long_one():
    sched = make(role="prefill", budget=16)
    sched.add(seq_of("long", 100))
    assert step(sched) == {"long": 16}
    sched.add(seq_of("short", 5))
    # It arrived later, and still waits for no chunk of the long one: a step of its own size.
    assert step(sched) == {"short": 5}
    assert [s.request_id for s in sched.running] == ["long"]  # the prefill role hands the short one over at once
    assert step(sched) == {"long": 16}


def test_shortest_remaining_first_orders_the_candidates():
    sched = make(role="prefill", budget=10)
    for request_id, n in (("c", 9), ("a", 3), ("b", 6)):
        sched.add(seq_of(request_id, n))
    assert step(sched) == {"a": 3, "b": 6}  # c would only get 1 token and make a and b wait for it
    assert step(sched) == {"c": 9}


def test_a_long_prompt_that_short_ones_keep_outbidding_ages_until_it_leads():
    sched = make(role="prefill", budget=8)
    sched.add(seq_of("long", 30))
    starved = 0
    for i in range(20):
        sched.add(seq_of(f"short{i}", 8))  # a short prompt every step fills the whole budget
        fed = step(sched)
        if "long" in fed:
            break
        starved += 1
    # Its key falls by one budget (8) per step in vain: 30 - 8k <= 8 (the newcomer's) after 3 such steps.
    assert starved == 3 and fed["long"] == 8
    assert sched.running[0].num_steps_starved == 0


def test_a_prompt_that_leads_on_age_is_not_overtaken_while_it_waits_for_blocks():
    sched = make(num_blocks=8, block_size=4, budget=16)
    sched.add(seq_of("stream", 12))
    step(sched)  # 3 blocks
    sched.add(seq_of("big", 24))  # 6 blocks: more than the 5 free
    sched.add(seq_of("small", 3))
    assert step(sched) == {"small": 3, "stream": 1}  # the shorter first; "big" cannot get blocks and waits
    assert step(sched) == {"stream": 1, "small": 1}
    assert sched.waiting[0].request_id == "big" and sched.waiting[0].num_steps_starved == 2
    sched.add(seq_of("late", 3))
    # "big" now leads on age (24 - 2 x 16 < 3): "late" would fit, but is not admitted past it.
    assert step(sched) == {"stream": 1, "small": 1}
    assert [s.request_id for s in sched.waiting] == ["big", "late"]


def test_a_partly_prefilled_sequence_is_preempted_and_starts_over():
    sched = make(num_blocks=4, block_size=4, budget=6)
    sched.add(seq_of("stream", 3))
    step(sched)  # 3 prompt tokens and one sampled: 4 tokens in 1 block
    sched.add(seq_of("long", 12))  # 3 blocks: the rest of the pool
    assert step(sched) == {"long": 5, "stream": 1}  # the stream's 4th token still fits its block
    long_seq = sched.running[-1]
    assert long_seq.num_cached_tokens == 5 and long_seq.is_prefilling
    assert step(sched) == {"stream": 1}  # its 5th token needs a block: the newest, the long prompt, is preempted
    assert long_seq.status is SequenceStatus.WAITING and not long_seq.block_table
    assert long_seq.num_cached_tokens == 0 and long_seq.is_prefilling and sched.num_preemptions == 1


def test_a_prompt_that_fits_still_joins_after_a_partial_chunk_is_left_out():
    sched = make(role="prefill", budget=10)
    for request_id, n in (("x", 2), ("p", 25), ("q", 7)):
        sched.add(seq_of(request_id, n))
    sched.waiting[1].num_steps_starved = 2  # p's key: 25 - 2 x 10 = 5, between x's (2) and q's (7)
    assert step(sched) == {"x": 2, "q": 7}  # p would be cut to 8 tokens behind x: it waits, q still fits
    assert step(sched) == {"p": 10}


def test_the_step_budget_is_at_most_max_num_batched_tokens():
    sched = make(role="prefill", budget=256, max_num_batched_tokens=10)
    sched.add(seq_of("long", 25))
    assert step(sched) == {"long": 10}


def test_a_prefill_worker_feeds_the_larger_budget_of_a_step_without_decodes():
    sched = make(role="prefill", budget=16, budget_alone=64)
    sched.add(seq_of("long", 100))
    assert [step(sched) for _ in range(2)] == [{"long": 64}, {"long": 36}]


def test_a_colocated_worker_takes_the_small_chunk_again_once_a_stream_decodes():
    sched = make(budget=16, budget_alone=48)
    sched.add(seq_of("long", 120))
    assert step(sched) == {"long": 48}  # no stream past its prefill: no one's next token waits on this step
    sched.add(seq_of("short", 5))
    assert step(sched) == {"short": 5}  # shortest first, in a step of its own size
    # "short" now decodes in every step: each step is back to the chunk beside decodes.
    assert step(sched) == {"long": 15, "short": 1}
    assert sched.num_batched_tokens == 16
    assert step(sched) == {"long": 15, "short": 1}


def test_without_a_larger_budget_alone_every_step_has_the_chunk_beside_decodes():
    sched = make(role="prefill", budget=16)
    assert sched.step_token_budget_alone == sched.step_token_budget == 16


def test_the_budget_alone_is_at_most_max_num_batched_tokens_and_at_least_the_chunk():
    assert make(budget=16, budget_alone=256, max_num_batched_tokens=100).step_token_budget_alone == 100
    assert make(budget=16, budget_alone=8).step_token_budget_alone == 16


def test_aging_stays_bounded_in_steps_of_the_larger_budget():
    sched = make(role="prefill", budget=8, budget_alone=16)
    sched.add(seq_of("long", 60))
    starved = 0
    for i in range(40):
        sched.add(seq_of(f"short{i}", 16))  # a short prompt every step fills the whole budget
        fed = step(sched)
        if "long" in fed:
            break
        starved += 1
    # Its key falls by this step's budget (16) per step in vain: 60 - 16k <= 16 (the newcomer's) after 3 steps.
    assert starved == 3 and fed["long"] == 16
