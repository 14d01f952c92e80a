"""Fixed-size KV blocks, one step at a time (no torch)."""
import subprocess
import sys

from inference.engine.block_manager import BlockManager
from inference.engine.sequence import SamplingParams, Sequence


def seq_of(num_tokens: int, request_id: str = "r") -> Sequence:
    return Sequence(request_id, list(range(1, num_tokens + 1)), SamplingParams())


def test_allocate_takes_just_enough_blocks_for_the_tokens():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = seq_of(9)
    assert bm.can_allocate(9)
    bm.allocate(seq, 9)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 7)
    assert bm.usage == 0.3


def test_can_allocate_refuses_more_tokens_than_free_blocks_hold():
    bm = BlockManager(num_blocks=2, block_size=4)
    assert bm.can_allocate(8)
    assert not bm.can_allocate(9)
    bm.allocate(seq_of(5), 5)
    assert not bm.can_allocate(1)


def test_append_adds_a_block_only_when_the_last_token_starts_one():
    bm = BlockManager(num_blocks=3, block_size=4)
    seq = seq_of(4)
    bm.allocate(seq, 4)
    seq.append_token(99)  # token 5 does not fit the first block
    assert bm.can_append(seq)
    bm.may_append(seq)
    assert len(seq.block_table) == 2
    seq.append_token(100)  # token 6 fits the second block
    bm.may_append(seq)
    assert len(seq.block_table) == 2 and bm.num_used_blocks == 2


def test_can_append_is_false_when_a_block_is_needed_and_none_is_free():
    bm = BlockManager(num_blocks=1, block_size=2)
    seq = seq_of(2)
    bm.allocate(seq, 2)
    assert bm.can_append(seq)  # the last token still has a slot: the next step writes slot 1
    seq.append_token(7)
    assert not bm.can_append(seq)


def test_deallocate_returns_every_block_and_resets_the_cache_count():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = seq_of(3, "a"), seq_of(4, "b")
    bm.allocate(a, 3)
    bm.allocate(b, 4)
    a.num_cached_tokens = 3
    bm.deallocate(a)
    assert a.block_table == [] and a.num_cached_tokens == 0
    assert bm.num_free_blocks == 2
    bm.deallocate(b)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    assert sorted(bm.free_block_ids) == [0, 1, 2, 3]


def test_block_manager_and_scheduler_import_without_torch():
    code = ("import sys; import inference.engine.block_manager, inference.engine.scheduler, "
            "inference.engine.sequence, inference.engine.config; from inference.engine import Config, SamplingParams; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
