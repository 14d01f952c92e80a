"""The block manager's prefix cache, one call at a time (no torch): keys chained over the prefix, reference counts,
the LRU of released cached blocks, eviction only when no never-used block is left, and blocks in use never evicted."""
from inference.engine.block_manager import BlockManager
from inference.engine.sequence import SamplingParams, Sequence

BS = 4


def seq_of(tokens, request_id="r") -> Sequence:
    return Sequence(request_id, list(tokens), SamplingParams())


def computed(bm: BlockManager, seq: Sequence) -> Sequence:
    """Allocate `seq` and mark its whole prompt computed, as a prefill step does."""
    bm.allocate(seq, seq.num_tokens)
    seq.num_cached_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return seq


def test_a_later_sequence_starts_after_the_shared_full_blocks_and_shares_them():
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 11), "a"))  # 10 tokens: blocks 0 and 1 full, block 2 partial
    b = seq_of([*range(1, 9), 50, 51, 52], "b")  # shares the first 8 tokens (two blocks)
    bm.allocate(b, b.num_tokens)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] not in a.block_table
    assert b.num_cached_tokens == 2 * BS
    assert [bm.ref_counts[i] for i in a.block_table[:2]] == [2, 2]
    assert bm.num_used_blocks == 4  # 3 of a's and 1 new: shared blocks are counted once


def test_a_block_matches_only_when_its_whole_prefix_matches():
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=True)
    computed(bm, seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    # Same second block (5..8) after a different first block: no match at all.
    assert bm.num_cached_prefix_tokens(seq_of([9, 9, 9, 9, 5, 6, 7, 8, 9], "b")) == 0


def test_at_least_the_last_token_is_left_to_compute():
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=True)
    computed(bm, seq_of(range(1, 9), "a"))  # exactly two full blocks
    assert bm.num_cached_prefix_tokens(seq_of(range(1, 9), "b")) == BS  # the second block is recomputed
    assert bm.num_cached_prefix_tokens(seq_of(range(1, 10), "c")) == 2 * BS


def test_released_cached_blocks_count_as_free_and_are_evicted_only_when_no_never_used_block_is_left():
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 9), "a"))  # 2 full blocks, keyed
    bm.deallocate(a)
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.usage, bm.num_cached_blocks) == (4, 0, 0.0, 2)
    b = seq_of(range(100, 108), "b")
    bm.allocate(b, 8)  # two never-used blocks are left: the cached ones are not touched
    assert bm.num_cached_blocks == 2 and not set(b.block_table) & set(a_blocks := [0, 1])
    c = seq_of(range(200, 204), "c")
    bm.allocate(c, 4)  # no never-used block left: the least recently released cached block goes
    assert bm.num_cached_blocks == 1
    # a released its last block first, so its tail (block 1) was evicted and its head (block 0) remains.
    assert c.block_table == [a_blocks[1]]
    assert bm.num_cached_prefix_tokens(seq_of(range(1, 10), "a2")) == BS


def test_blocks_in_use_are_never_evicted():
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 9), "a"))  # holds 2 keyed blocks
    assert not bm.can_allocate(2 * BS)  # one free block: the keyed ones are in use
    c = seq_of(range(300, 304), "c")
    bm.allocate(c, 4)
    assert not bm.can_allocate(1) and bm.num_free_blocks == 0
    assert bm.num_cached_blocks == 2 and all(bm.ref_counts[i] == 1 for i in a.block_table)


def test_a_sequence_sharing_blocks_in_use_needs_blocks_only_for_the_rest():
    bm = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    computed(bm, seq_of(range(1, 9), "a"))  # 2 blocks in use, 1 free
    b = seq_of([*range(1, 9), 70, 71], "b")  # 3 blocks, 2 of them a's
    assert bm.can_allocate(b.num_tokens, b) and not bm.can_allocate(b.num_tokens)
    bm.allocate(b, b.num_tokens)
    assert bm.num_free_blocks == 0


def test_releasing_references_frees_a_shared_block_only_after_the_last_one():
    bm = BlockManager(num_blocks=5, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 6), "a"))
    b = seq_of(range(1, 7), "b")
    bm.allocate(b, 6)
    shared = a.block_table[0]
    bm.deallocate(a)
    assert bm.ref_counts[shared] == 1 and shared not in bm.prefix_cache.evictable
    bm.deallocate(b)
    assert bm.ref_counts[shared] == 0 and shared in bm.prefix_cache.evictable
    assert bm.num_used_blocks == 0


def test_decoded_tokens_are_keyed_once_their_block_is_full():
    bm = BlockManager(num_blocks=5, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 4), "a"))  # 3 tokens: no full block
    assert bm.num_cached_blocks == 0
    a.append_token(40)  # the 4th token, fed by the next step
    bm.may_append(a)
    a.num_cached_tokens = 4
    bm.cache_full_blocks(a)
    assert bm.num_cached_blocks == 1
    assert bm.num_cached_prefix_tokens(seq_of([1, 2, 3, 40, 5], "b")) == BS


def test_flush_forgets_released_blocks_but_keeps_those_in_use():
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    a = computed(bm, seq_of(range(1, 9), "a"))
    b = computed(bm, seq_of(range(50, 55), "b"))
    bm.deallocate(a)
    assert bm.flush_prefix_cache() == 2
    assert bm.num_cached_blocks == 1 and bm.num_free_blocks == 6 - len(b.block_table)
    assert bm.num_cached_prefix_tokens(seq_of(range(1, 10), "a2")) == 0


def test_without_prefix_caching_nothing_is_shared():
    bm = BlockManager(num_blocks=6, block_size=BS)
    computed(bm, seq_of(range(1, 9), "a"))
    b = seq_of(range(1, 10), "b")
    bm.allocate(b, b.num_tokens)
    assert b.num_cached_tokens == 0 and bm.num_used_blocks == 5 and bm.num_cached_blocks == 0
