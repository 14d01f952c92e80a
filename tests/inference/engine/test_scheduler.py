"""The scheduler, one step at a time, with no model: tokens are made up, blocks are counted (no torch)."""
from inference.engine.block_manager import BlockManager
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import SamplingParams, Sequence, SequenceStatus

EOS = 2


def make(role="colocated", num_blocks=100, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
         max_model_len=256):
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(role=role, block_manager=bm, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                     eos_token_ids=frozenset([EOS]))


def seq_of(request_id, num_tokens, max_tokens=8, ignore_eos=False):
    return Sequence(request_id, [10 + i for i in range(num_tokens)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


def step(sched, token=7):
    seqs, is_prefill = sched.schedule()
    sched.postprocess(seqs, [token] * len(seqs), is_prefill)
    return [s.request_id for s in seqs], is_prefill


def test_waiting_prompts_are_prefilled_together_then_decoded_together():
    sched = make()
    for i in range(3):
        sched.add(seq_of(f"r{i}", 5))
    assert step(sched) == (["r0", "r1", "r2"], True)
    assert all(s.status is SequenceStatus.RUNNING and s.num_cached_tokens == 5 for s in sched.running)
    assert step(sched) == (["r0", "r1", "r2"], False)
    assert sched.num_prefill_tokens_computed == 15
    assert sched.num_generation_tokens == 6


def test_prefill_respects_the_token_budget_in_arrival_order():
    sched = make(max_num_batched_tokens=10)
    for request_id, n in (("a", 4), ("b", 5), ("c", 2)):
        sched.add(seq_of(request_id, n))
    assert step(sched) == (["a", "b"], True)  # 9 tokens: c (2 more) would exceed the budget of 10
    assert step(sched) == (["c"], True)
    assert step(sched) == (["a", "b", "c"], False)


def test_a_prompt_longer_than_the_budget_runs_alone():
    sched = make(max_num_batched_tokens=8)
    sched.add(seq_of("long", 20))
    sched.add(seq_of("short", 2))
    assert step(sched) == (["long"], True)
    assert step(sched) == (["short"], True)


def test_prefill_respects_max_num_seqs():
    sched = make(max_num_seqs=2)
    for i in range(3):
        sched.add(seq_of(f"r{i}", 3))
    assert step(sched) == (["r0", "r1"], True)
    assert step(sched) == (["r0", "r1"], False)  # r2 waits: the batch is full
    assert [s.request_id for s in sched.waiting] == ["r2"]


def test_a_new_request_joins_the_running_batch_between_decode_steps():
    sched = make()
    sched.add(seq_of("a", 3))
    step(sched)
    assert step(sched) == (["a"], False)
    sched.add(seq_of("b", 3))
    assert step(sched) == (["b"], True)
    assert step(sched) == (["a", "b"], False)


def test_a_finished_sequence_leaves_the_batch_and_frees_its_blocks():
    sched = make()
    sched.add(seq_of("short", 3, max_tokens=2))
    sched.add(seq_of("long", 3, max_tokens=5))
    step(sched)
    used_before = sched.block_manager.num_used_blocks
    assert step(sched) == (["short", "long"], False)
    assert [s.request_id for s in sched.running] == ["long"]
    assert sched.block_manager.num_used_blocks == used_before - 1


def test_max_tokens_finishes_with_length_and_eos_with_stop():
    sched = make()
    by_length, by_eos = seq_of("len", 3, max_tokens=1), seq_of("eos", 3, max_tokens=5)
    sched.add(by_length)
    step(sched)
    assert (by_length.status, by_length.finish_reason) == (SequenceStatus.FINISHED, "length")
    sched.add(by_eos)
    step(sched, token=EOS)
    assert (by_eos.status, by_eos.finish_reason) == (SequenceStatus.FINISHED, "stop")
    assert by_eos.completion_token_ids == [EOS]
    assert sched.is_finished() and sched.block_manager.num_used_blocks == 0


def test_ignore_eos_keeps_going_until_max_tokens():
    sched = make()
    seq = seq_of("r", 3, max_tokens=3, ignore_eos=True)
    sched.add(seq)
    for _ in range(3):
        step(sched, token=EOS)
    assert seq.finish_reason == "length" and seq.num_completion_tokens == 3


def test_a_prompt_waits_while_its_blocks_are_not_free():
    sched = make(num_blocks=3, block_size=4)
    a, b = seq_of("a", 8, max_tokens=2), seq_of("b", 8, max_tokens=1)
    sched.add(a)
    sched.add(b)
    assert step(sched) == (["a"], True)  # a holds 2 blocks, b needs 2 and 1 is free
    assert list(sched.waiting) == [b] and b.status is SequenceStatus.WAITING
    with_a_done = step(sched)
    assert with_a_done == (["a"], False) and a.finish_reason == "length"
    assert step(sched) == (["b"], True)  # a's blocks are free again
    assert b.finish_reason == "length"


def test_decode_preempts_the_newest_sequence_when_blocks_run_out():
    sched = make(num_blocks=3, block_size=4, max_model_len=64)
    old, new = seq_of("old", 4, max_tokens=20), seq_of("new", 4, max_tokens=20)
    sched.add(old)
    sched.add(new)
    assert step(sched) == (["old", "new"], True)  # 2 blocks used
    assert step(sched) == (["old"], False)  # both need a 2nd block, 1 is free: "new" is preempted
    assert (new.status, new.block_table, new.num_cached_tokens) == (SequenceStatus.WAITING, [], 0)
    assert new.completion_token_ids == [7] and sched.num_preemptions == 1
    assert list(sched.waiting) == [new]


def test_a_preempted_sequence_is_prefilled_again_over_all_its_tokens():
    sched = make(num_blocks=3, block_size=4, max_model_len=64)
    a, b = seq_of("a", 4, max_tokens=3), seq_of("b", 4, max_tokens=20)
    sched.add(a)
    sched.add(b)
    step(sched)  # prefill both: 2 blocks, 1 free
    assert step(sched) == (["a"], False)  # a takes the last block; b, now the only other, preempts itself
    assert list(sched.waiting) == [b]
    assert step(sched) == (["a"], False)  # b cannot come back yet; a finishes (3 tokens), freeing 2 blocks
    assert a.finish_reason == "length"
    computed = sched.num_prefill_tokens_computed
    assert step(sched) == (["b"], True)  # b recomputes its prompt and its one token: 5 tokens, 2 blocks
    assert sched.num_prefill_tokens_computed == computed + 5
    assert b.num_cached_tokens == 5 and b.completion_token_ids == [7, 7]
    assert step(sched) == (["b"], False)


def test_prefill_role_finishes_every_sequence_after_its_prefill():
    sched = make(role="prefill")
    sched.add(seq_of("a", 5, max_tokens=8))
    sched.add(seq_of("b", 5, max_tokens=1))
    seqs, is_prefill = sched.schedule()
    assert is_prefill and [s.request_id for s in seqs] == ["a", "b"]
    sched.postprocess(seqs, [7, 7], is_prefill)
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)
    assert [s.finish_reason for s in seqs] == [None, "length"]  # a is handed off, b is done
    assert sched.is_finished() and sched.block_manager.num_used_blocks == 0
    assert sched.schedule() == ([], True)


def prefilled(request_id, num_prompt_tokens, max_tokens):
    seq = seq_of(request_id, num_prompt_tokens, max_tokens=max_tokens)
    seq.append_token(7)  # the first token, sampled by the prefill worker
    return seq


def test_decode_role_reserves_blocks_for_the_whole_request_up_front():
    sched = make(role="decode", num_blocks=10, block_size=4)
    seq = prefilled("r", 6, max_tokens=7)  # at most 6 + 7 - 1 = 12 tokens ever hold K/V: 3 blocks
    sched.add(seq)
    assert step(sched) == (["r"], False)
    assert len(seq.block_table) == 3 and seq.num_cached_tokens == 7
    for _ in range(5):
        step(sched)
    assert seq.finish_reason == "length" and seq.num_completion_tokens == 7
    assert sched.num_prefill_tokens_computed == 0 and sched.num_preemptions == 0


def test_decode_role_admits_a_request_only_when_its_reservation_fits():
    sched = make(role="decode", num_blocks=4, block_size=4)
    first, second = prefilled("first", 6, max_tokens=7), prefilled("second", 3, max_tokens=2)
    sched.add(first)  # needs 3 blocks
    sched.add(second)  # needs 1 block ... fits beside the first
    third = prefilled("third", 4, max_tokens=4)  # needs 2 blocks: must wait
    sched.add(third)
    assert step(sched)[0] == ["first", "second"]
    assert list(sched.waiting) == [third] and third.block_table == []
    step(sched)  # second finishes (2 tokens), its block is free again, still not enough for third
    assert list(sched.waiting) == [third]
    while first.status is not SequenceStatus.FINISHED:
        step(sched)
    assert step(sched) == (["third"], False)
    assert sched.num_preemptions == 0


def test_abort_removes_a_waiting_or_running_sequence_and_frees_its_blocks():
    sched = make(max_num_seqs=1)
    running, waiting = seq_of("running", 5), seq_of("waiting", 5)
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert sched.abort("waiting") is waiting
    assert sched.abort("running") is running
    assert running.finish_reason == "abort" and running.status is SequenceStatus.FINISHED
    assert sched.is_finished() and sched.block_manager.num_used_blocks == 0
    assert sched.abort("unknown") is None
    assert sched.schedule() == ([], False)
