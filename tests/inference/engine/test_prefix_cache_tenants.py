"""Tenant-salted prefix cache, one call at a time (no torch): a sequence with a cache salt finds only blocks of its
own salt, so one tenant's prompt never hits another's blocks; the blocks that hold only the deployment's shared
prompt are keyed unsalted and shared by all; unsalted sequences share with each other as before."""
from inference.engine.block_manager import BlockManager
from inference.engine.prefix_cache import num_shared_tokens
from inference.engine.sequence import SamplingParams, Sequence

BS = 4
PROMPT = list(range(1, 14))  # 13 tokens: three full blocks and one token to compute
SHARED = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # the shared prompt: two full blocks of PROMPT, and one token of its third


def seq_of(request_id: str, salt: bytes = b"", tokens=PROMPT, shared=()) -> Sequence:
    seq = Sequence(request_id, list(tokens), SamplingParams(), cache_salt=salt)
    seq.num_shared_tokens = num_shared_tokens(seq.token_ids, [list(shared)]) if salt else 0
    return seq


def served(bm: BlockManager, seq: Sequence) -> int:
    """Allocate `seq`, mark its prompt computed as a prefill step does, release it; the tokens it found cached."""
    bm.allocate(seq, seq.num_tokens)
    num_hit = seq.num_cached_tokens
    seq.num_cached_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    bm.deallocate(seq)
    return num_hit


def cache() -> BlockManager:
    return BlockManager(num_blocks=32, block_size=BS, enable_prefix_caching=True)


def test_the_same_prompt_from_two_tenants_does_not_hit_the_others_blocks():
    bm = cache()
    assert served(bm, seq_of("a1", b"tenant-a")) == 0
    assert served(bm, seq_of("b1", b"tenant-b")) == 0
    assert served(bm, seq_of("anonymous")) == 0  # nor does an unsalted request find a tenant's


def test_the_same_tenant_hits_its_own_blocks():
    bm = cache()
    served(bm, seq_of("a1", b"tenant-a"))
    assert served(bm, seq_of("a2", b"tenant-a")) == 3 * BS


def test_the_shared_prompts_blocks_are_reused_by_every_tenant_and_nothing_after_them():
    bm = cache()
    served(bm, seq_of("a1", b"tenant-a", shared=SHARED))
    # The first two blocks hold only shared tokens; the third also holds tenant a's own token 10.
    assert served(bm, seq_of("b1", b"tenant-b", shared=SHARED)) == 2 * BS
    assert served(bm, seq_of("a2", b"tenant-a", shared=SHARED)) == 3 * BS


def test_a_prompt_that_leaves_the_shared_prompt_early_shares_only_the_blocks_before():
    bm = cache()
    served(bm, seq_of("a1", b"tenant-a", shared=SHARED))
    diverging = [1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11, 12, 13]  # leaves it in the second block
    assert served(bm, seq_of("b1", b"tenant-b", tokens=diverging, shared=SHARED)) == BS


def test_unsalted_requests_share_as_before():
    bm = cache()
    served(bm, seq_of("x"))
    assert served(bm, seq_of("y")) == 3 * BS


def test_the_shared_length_is_the_longest_common_prefix_with_any_form():
    assert num_shared_tokens([1, 2, 3, 4], [[1, 2, 9], [1, 2, 3]]) == 3
    assert num_shared_tokens([5, 6], [[1, 2]]) == 0
    assert num_shared_tokens([1, 2], []) == 0
