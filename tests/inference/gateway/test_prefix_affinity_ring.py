"""The bounded-load consistent hash, one pick at a time (no processes): keys, homes, the load bound, weights, and
what moves when a worker leaves."""
from dataclasses import dataclass

from inference.gateway.prefix_affinity import HashRing, affinity_key, bounded_pick


@dataclass(eq=False)
class W:
    url: str
    weight: float = 1.0
    num_outstanding: int = 0


def fleet(n, **weights):
    return [W(f"http://10.0.0.{i}:8000", weights.get(f"w{i}", 1.0)) for i in range(n)]


def pick(workers, key, candidates=None, max_outstanding=256):
    ring = HashRing([(w.url, w.weight) for w in workers])
    return bounded_pick(ring, workers, key, candidates if candidates is not None else workers, max_outstanding)


def test_a_chats_key_is_its_head_up_to_the_first_user_message():
    turn1 = {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "Hello"},
                          {"role": "user", "content": "More"}]}
    assert affinity_key(turn1) == affinity_key(turn2)
    assert affinity_key({"prompt": "x" * 300}, 256) == "x" * 256
    assert affinity_key({"prompt": "x" * 300}) != affinity_key({"prompt": "y" + "x" * 299})
    assert affinity_key({"messages": [{"role": "system", "content": "s" * 500}, {"role": "user", "content": "a"}]},
                        100) == affinity_key({"messages": [{"role": "system", "content": "s" * 500}]}, 100)


def test_the_same_key_has_the_same_home_and_keys_spread():
    workers = fleet(4)
    homes = [pick(workers, f"prompt {i}")[0] for i in range(400)]
    assert all(pick(workers, f"prompt {i}")[0] is homes[i] for i in range(400))
    counts = [sum(h is w for h in homes) for w in workers]
    assert min(counts) > 50, counts  # 100 each on average


def test_a_home_over_the_bound_spills_to_the_next_worker_on_the_ring():
    workers = fleet(4)
    home, is_home = pick(workers, "k")
    assert is_home
    home.num_outstanding = 3  # with the others idle: 4 <= ceil(1.25 x 4 / 4) + 2 = 4
    assert pick(workers, "k") == (home, True)
    home.num_outstanding = 4  # 5 > ceil(1.25 x 5 / 4) + 2 = 4
    other, is_home = pick(workers, "k")
    assert other is not home and not is_home
    assert pick(workers, "k")[0] is other  # the spill goes to the same next worker each time
    for w in workers:
        w.num_outstanding = 4  # all alike: the home is back within the bound
    assert pick(workers, "k") == (home, True)


def test_weights_scale_both_the_share_of_keys_and_the_bound():
    workers = fleet(2, w0=3.0)
    homes = [pick(workers, f"p{i}")[0] for i in range(400)]
    share = sum(h is workers[0] for h in homes) / 400
    assert 0.65 < share < 0.85  # 3/4 of the ring
    heavy, light = workers
    heavy_key = next(f"p{i}" for i in range(400) if homes[i] is heavy)
    light_key = next(f"p{i}" for i in range(400) if homes[i] is light)
    # With the other idle, the bound is ceil(1.25 x (h + 1) x weight / 4) + 2 for a home holding h.
    heavy.num_outstanding = 46  # 47 <= ceil(44.06) + 2
    assert pick(workers, heavy_key) == (heavy, True)
    heavy.num_outstanding = 47  # 48 > ceil(45.0) + 2
    assert pick(workers, heavy_key) == (light, False)
    heavy.num_outstanding = 0
    light.num_outstanding = 3  # 4 <= ceil(1.25) + 2
    assert pick(workers, light_key) == (light, True)
    light.num_outstanding = 4  # 5 > ceil(1.5625) + 2: the light worker spills at its fifth request
    assert pick(workers, light_key) == (heavy, False)


def test_when_a_worker_leaves_only_its_keys_move():
    workers = fleet(4)
    before = {f"p{i}": pick(workers, f"p{i}")[0] for i in range(300)}
    gone = workers[2]
    remaining = [w for w in workers if w is not gone]
    for key, home in before.items():
        after = pick(workers, key, candidates=remaining)[0]  # the ring is unchanged; the worker is not a candidate
        if home is not gone:
            assert after is home


def test_no_worker_under_max_outstanding_gives_none():
    workers = fleet(2)
    for w in workers:
        w.num_outstanding = 3
    assert pick(workers, "k", max_outstanding=3) == (None, False)
