"""Router.pick weighs workers as nginx's `weight=` does for least_conn: the ready worker with the least
(outstanding + 1) / weight, ties to the one picked longest ago. One pick at a time, no processes."""
from __future__ import annotations

from collections import Counter, deque

import pytest

from inference.gateway.config import Config, Mode
from inference.gateway.openai_protocol import ApiError
from inference.gateway.routing import Router, WorkerState
from inference.roles import Role

HEAVY, LIGHT = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def _router(weights: dict[str, float], *, max_outstanding: int = 256) -> Router:
    urls = list(weights)
    router = Router(Config(port=0, colocated_urls=urls, max_outstanding_per_worker=max_outstanding))
    router.set_groups(Mode.COLOCATED, [{"revision": None, "colocated": urls, "weights": weights}])
    for worker in router.workers:
        worker.state = WorkerState.READY
    return router


def _pick(router: Router) -> str:
    worker = router.pick(router.groups[0], Role.COLOCATED)
    worker.num_outstanding += 1
    return worker.url


def test_an_idle_fleet_prefers_the_heavier_worker():
    # Bare outstanding / weight would tie at 0 here; the + 1 for the request being placed breaks it by weight.
    router = _router({LIGHT: 1, HEAVY: 3})
    assert router.pick(router.groups[0], Role.COLOCATED).url == HEAVY


def test_while_requests_pile_up_a_weight_3_worker_takes_three_for_each_one_of_a_weight_1_worker():
    router = _router({HEAVY: 3, LIGHT: 1})
    picks = [_pick(router) for _ in range(12)]
    assert Counter(picks) == {HEAVY: 9, LIGHT: 3}
    # Interleaved, not nine in a row then three: the light worker's first turn comes once the loads meet.
    assert picks[:4].count(LIGHT) == 1


def test_under_steady_load_the_share_of_requests_follows_the_weights():
    """8 clients, each sending its next request when its last one finishes; requests take equal time, so they
    finish in the order they started."""
    router = _router({HEAVY: 3, LIGHT: 1})
    workers = {w.url: w for w in router.workers}
    in_flight = deque(_pick(router) for _ in range(8))
    served = Counter()
    for _ in range(400):
        url = in_flight.popleft()
        workers[url].num_outstanding -= 1
        served[url] += 1
        in_flight.append(_pick(router))
    assert served[HEAVY] / served[LIGHT] == pytest.approx(3, rel=0.1)


def test_equal_weights_alternate_by_least_recently_picked():
    router = _router({HEAVY: 1, LIGHT: 1})
    picks = []
    for _ in range(6):
        worker = router.pick(router.groups[0], Role.COLOCATED)  # nothing outstanding: every pick is a tie
        picks.append(worker.url)
    assert picks == [HEAVY, LIGHT] * 3


def test_a_fractional_weight_takes_less_than_a_worker_of_weight_1():
    router = _router({HEAVY: 1, LIGHT: 0.5})
    picks = [_pick(router) for _ in range(9)]
    assert Counter(picks) == {HEAVY: 6, LIGHT: 3}


def test_the_outstanding_cap_holds_for_each_worker_whatever_its_weight():
    router = _router({HEAVY: 3, LIGHT: 1}, max_outstanding=2)
    picks = [_pick(router) for _ in range(4)]
    assert Counter(picks) == {HEAVY: 2, LIGHT: 2}
    with pytest.raises(ApiError) as raised:
        _pick(router)
    assert raised.value.status == 429


def test_a_new_membership_changes_a_known_workers_weight_and_keeps_its_outstanding_count():
    router = _router({HEAVY: 3, LIGHT: 1})
    heavy = next(w for w in router.workers if w.url == HEAVY)
    heavy.num_outstanding = 5
    router.set_groups(Mode.COLOCATED, [{"revision": None, "colocated": [HEAVY, LIGHT + "/"],
                                        "weights": {HEAVY + "/": 2}}])
    weights = {w.url: (w.weight, w.num_outstanding, w.state) for w in router.workers}
    assert weights == {HEAVY: (2, 5, WorkerState.READY), LIGHT: (1, 0, WorkerState.READY)}
    described = router.groups[0].describe()["colocated"]
    assert [(w["url"], w["weight"]) for w in described] == [(HEAVY, 2), (LIGHT, 1)]
