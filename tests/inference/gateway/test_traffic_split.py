"""Which revision group serves a request under a traffic split (traffic_split.py, docs/contracts.md): by weight at
random, sticky per variant key, falling back when the chosen group is not complete. One choice at a time, through
the router, no processes."""
from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from inference.gateway.config import Config, Mode
from inference.gateway.openai_protocol import ApiError
from inference.gateway.routing import Router, WorkerState
from inference.gateway.traffic_split import NUM_SLOTS, sticky_group, sticky_slot

NUM_DRAWS = 20_000


def _router(groups: list[dict], *, seed: int = 7, down: set[int] = frozenset()) -> Router:
    """A router over colocated groups {"revision", "traffic_weight"?, "variant"?}, one worker each, all ready but the
    revisions in `down`."""
    router = Router(Config(port=0, colocated_urls=["http://127.0.0.1:1"]), rng=random.Random(seed))
    router.set_groups(Mode.COLOCATED, [{**g, "colocated": [f"http://127.0.0.1:{9000 + g['revision']}"]}
                                       for g in groups])
    for group in router.groups:
        for worker in group.colocated:
            worker.state = WorkerState.DOWN if group.revision in down else WorkerState.READY
    return router


def _shares(router: Router, num: int = NUM_DRAWS, key=lambda i: None) -> dict[int, float]:
    counts = Counter(router.pick_group(key(i)).revision for i in range(num))
    return {revision: count / num for revision, count in counts.items()}


def test_without_traffic_weights_the_newest_complete_group_serves_everything():
    router = _router([{"revision": 1}, {"revision": 2}])
    assert _shares(router, 200) == {2: 1.0}
    router = _router([{"revision": 1}, {"revision": 2}], down={2})
    assert _shares(router, 200) == {1: 1.0}


def test_groups_are_drawn_in_proportion_to_their_traffic_weights():
    router = _router([{"revision": 4, "traffic_weight": 90, "variant": "stable"},
                      {"revision": 5, "traffic_weight": 10, "variant": "canary"}])
    shares = _shares(router)
    assert shares[4] == pytest.approx(0.9, abs=0.01) and shares[5] == pytest.approx(0.1, abs=0.01), shares
    router = _router([{"revision": 1, "traffic_weight": 50}, {"revision": 2, "traffic_weight": 30},
                      {"revision": 3, "traffic_weight": 20}])
    shares = _shares(router)
    assert shares == pytest.approx({1: 0.5, 2: 0.3, 3: 0.2}, abs=0.015), shares


def test_a_group_of_weight_0_or_without_a_weight_is_never_drawn_while_a_weighted_one_is_complete():
    router = _router([{"revision": 1, "traffic_weight": 0}, {"revision": 2, "traffic_weight": 100},
                      {"revision": 3}])
    assert _shares(router, 2000) == {2: 1.0}
    assert _shares(router, 2000, key=lambda i: f"user-{i}") == {2: 1.0}


def test_when_a_weighted_group_is_incomplete_the_other_weighted_groups_take_its_share():
    router = _router([{"revision": 1, "traffic_weight": 50}, {"revision": 2, "traffic_weight": 25},
                      {"revision": 3, "traffic_weight": 25}], down={3})
    shares = _shares(router)
    assert set(shares) == {1, 2}
    assert shares[1] == pytest.approx(2 / 3, abs=0.015), shares


def test_when_no_weighted_group_is_complete_the_newest_complete_group_serves():
    router = _router([{"revision": 1, "traffic_weight": 0}, {"revision": 2, "traffic_weight": 0},
                      {"revision": 3, "traffic_weight": 100}], down={3})
    assert _shares(router, 200) == {2: 1.0}
    assert _shares(router, 200, key=lambda i: f"user-{i}") == {2: 1.0}


def test_with_no_complete_group_at_all_it_answers_503_naming_what_is_missing():
    router = _router([{"revision": 1, "traffic_weight": 50}, {"revision": 2, "traffic_weight": 50}], down={1, 2})
    with pytest.raises(ApiError) as raised:
        router.pick_group("alice")
    assert raised.value.status == 503 and "revision 2: no ready colocated worker" in raised.value.message


def test_the_sticky_slot_is_the_first_8_bytes_of_sha256_big_endian_mod_10000():
    for key in ("alice", "user-17", "ünïcode ✓", ""):
        digest = hashlib.sha256(key.encode()).digest()
        assert sticky_slot(key) == int.from_bytes(digest[:8], "big") % NUM_SLOTS
    assert 0 <= sticky_slot("alice") < NUM_SLOTS


def test_a_key_always_lands_on_the_same_group_whatever_the_random_draws():
    groups = [{"revision": 1, "traffic_weight": 50, "variant": "a"}, {"revision": 2, "traffic_weight": 50,
                                                                      "variant": "b"}]
    one, other = _router(groups, seed=1), _router(groups, seed=2)  # two gateways with the same membership
    for i in range(200):
        key = f"user-{i}"
        revisions = {one.pick_group(key).revision for _ in range(20)} | {other.pick_group(key).revision
                                                                        for _ in range(20)}
        assert len(revisions) == 1, (key, revisions)


def test_keys_spread_over_the_groups_by_their_weights_in_ranges_ordered_by_revision():
    router = _router([{"revision": 9, "traffic_weight": 25}, {"revision": 3, "traffic_weight": 75}])
    for i in range(2000):
        key = f"k{i}"
        # Revision 3 comes first: slots 0..7499 are its, 7500..9999 revision 9's.
        assert router.pick_group(key).revision == (3 if sticky_slot(key) < 7500 else 9), key
    shares = _shares(router, 8000, key=lambda i: f"k{i}")
    assert shares[3] == pytest.approx(0.75, abs=0.02), shares


def test_ranges_are_cut_in_exact_integers_at_weights_that_do_not_divide_10000():
    router = _router([{"revision": 1, "traffic_weight": 1}, {"revision": 2, "traffic_weight": 2}])
    groups = router.groups
    for i in range(3000):
        key = f"u{i}"
        # 10000 / 3 = 3333.33...: slot 3333 is still revision 1's (3333 * 3 < 10000), 3334 is revision 2's.
        expected = 1 if sticky_slot(key) * 3 < NUM_SLOTS else 2
        assert sticky_group(groups, key).revision == expected


def test_a_sticky_key_whose_group_is_incomplete_falls_back_to_a_weighted_draw():
    groups = [{"revision": 1, "traffic_weight": 50}, {"revision": 2, "traffic_weight": 50}]
    keys = [f"user-{i}" for i in range(400)]
    on_2 = [k for k in keys if _router(groups).pick_group(k).revision == 2]
    assert on_2
    router = _router(groups, down={2})
    assert {router.pick_group(k).revision for k in on_2} == {1}
