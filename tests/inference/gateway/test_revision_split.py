"""A real gateway in front of two revisions of real tiny-model prefill/decode pairs, its membership polled from a
stand-in control plane that splits traffic between them (docs/contracts.md): the split holds over 200 requests as
counted from the response headers and from the workers' own metrics, each user stays on one variant, a weight set
to 0 moves all traffic within one poll, and a canary revision whose worker fails (a chaos `error` fault: the
fault proxy a node agent puts in front of it, which the membership names) before the
first token has the request answered by stable (the failure counted against the canary), or, with no stable group,
answers its errors under its own revision.

Each worker runs with its --revision, and a decode worker refuses a KV payload of another revision: a request that
crossed revisions would fail, so a 200 also says that the whole request stayed inside one revision."""
from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.gateway.support import TOKEN, ControlPlane, sse_events, start_gateway, start_workers, stop_all
from tests.procs import start_fault_proxy

pytestmark = pytest.mark.integration

NUM_REQUESTS = 200
# ignore_eos with 2 tokens: the prefill worker samples the first, hands the KV over, the decode worker the second.
BODY = {"model": "demo", "prompt": "The quick brown fox", "max_tokens": 2, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gateway-revision-split")
    workers = start_workers([
        ("prefill-1", "prefill", ["--revision", "1"]), ("decode-1", "decode", ["--revision", "1"]),
        ("prefill-2", "prefill", ["--revision", "2"]), ("decode-2", "decode", ["--revision", "2"]),
        ("prefill-3", "prefill", ["--revision", "3"]),
    ], tiny_model_dir, log_dir, timeout=600)  # five model loads at once on a shared two-core host
    control_plane = ControlPlane()
    control_plane.endpoints["mode"] = "disaggregated"
    control_plane.start()
    procs = list(workers)
    try:
        failing = start_fault_proxy("prefill-3-failing", workers[-1].url, log_dir, "--error-ratio", "1")
        procs.append(failing)
        workers.append(failing)
        gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                            "--token", TOKEN, "--membership-interval", "0.2"],
                                log_dir, wait_ready=False)
        procs.append(gateway)
        yield control_plane, gateway, {w.name: w for w in workers}
    finally:
        stop_all(procs)
        control_plane.stop()


def _group(workers: dict, revision: int, weight: int | None, variant: str | None, *, prefill: str = "") -> dict:
    group = {"revision": revision, "colocated": [], "prefill": [workers[prefill or f"prefill-{revision}"].url],
             "decode": [workers[f"decode-{revision if revision != 3 else 1}"].url]}
    if weight is not None:
        group["traffic_weight"] = weight
    if variant is not None:
        group["variant"] = variant
    return group


def _serve(fleet, *groups: dict) -> None:
    """Give the gateway this membership and wait until it applied it and every group is complete."""
    control_plane, gateway, _ = fleet
    control_plane.endpoints["groups"] = list(groups)
    control_plane.wait_polls(2)  # the second poll starts only once the gateway applied the first one's answer
    want = {(g["revision"], g.get("traffic_weight"), g.get("variant")) for g in groups}
    deadline = time.monotonic() + 60
    while True:
        health = requests.get(gateway.url + "/health", timeout=10).json()
        have = {(g["revision"], g["traffic_weight"], g["variant"]) for g in health["groups"]}
        ready = all(w["state"] == "ready" for g in health["groups"] for role in ("prefill", "decode")
                    for w in g[role])
        if have == want and ready:
            return
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def _split_50_50(fleet) -> None:
    workers = fleet[2]
    _serve(fleet, _group(workers, 2, 50, "b"), _group(workers, 1, 50, "a"))


def _samples(url: str, name: str) -> list[tuple[dict, float]]:
    text = requests.get(url + "/metrics", timeout=10).text
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def _sum(url: str, name: str, **labels) -> float:
    return sum(value for have, value in _samples(url, name) if all(have.get(k) == v for k, v in labels.items()))


def _worker_counts(workers: dict) -> dict[str, float]:
    """Requests each worker finished, from its own /metrics (prefill: handed off; decode: finished)."""
    return {name: _sum(w.url, "tandem_request_success_total") for name, w in workers.items()}


def _post(gateway, body: dict, headers: dict | None = None, path: str = "/v1/completions") -> requests.Response:
    return requests.post(gateway.url + path, json=body, headers=headers, timeout=120)


def _expected_revision(key: str, ranges: list[tuple[int, int]]) -> int:
    """The contract's sticky rule, computed here independently of the gateway's code: sha256, first 8 bytes
    big-endian, mod 10000, into cumulative weight ranges by revision ascending."""
    slot = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 10_000
    total, cumulative = sum(w for _, w in ranges), 0
    for revision, weight in sorted(ranges):
        cumulative += weight
        if slot * total < cumulative * 10_000:
            return revision
    raise AssertionError("unreachable")


def test_a_50_50_split_over_200_requests_lands_within_40_to_60_percent_by_headers_and_worker_metrics(fleet):
    _, gateway, workers = fleet
    _split_50_50(fleet)
    before_workers = _worker_counts(workers)
    before_gateway = {r: _sum(gateway.url, "tandem_request_success_total", revision=r) for r in ("1", "2")}

    def one(_: int) -> tuple[int, str, str]:
        resp = _post(gateway, BODY)
        return resp.status_code, resp.headers.get("X-Tandem-Revision"), resp.headers.get("X-Tandem-Variant")

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(NUM_REQUESTS)))
    assert Counter(status for status, _, _ in answers) == {200: NUM_REQUESTS}
    by_header = Counter((revision, variant) for _, revision, variant in answers)
    assert set(by_header) == {("1", "a"), ("2", "b")}, by_header
    assert 70 <= by_header[("1", "a")] <= 130, by_header  # 50 % of 200, ±4.2 standard deviations (1 in 40,000)

    served = {name: now - before_workers[name] for name, now in _worker_counts(workers).items()}
    # Each revision's prefill and decode worker served exactly the requests the headers gave that revision.
    assert served == {"prefill-1": by_header[("1", "a")], "decode-1": by_header[("1", "a")],
                      "prefill-2": by_header[("2", "b")], "decode-2": by_header[("2", "b")],
                      "prefill-3": 0, "prefill-3-failing": 0}, (served, by_header)
    # The gateway's own series say the same, by revision.
    for revision, variant in (("1", "a"), ("2", "b")):
        counted = _sum(gateway.url, "tandem_request_success_total", revision=revision) - before_gateway[revision]
        assert counted == by_header[(revision, variant)]
    assert _sum(gateway.url, "tandem_time_to_first_token_seconds_count", revision="1") > 0


def test_each_of_20_users_always_lands_on_one_variant_and_the_header_key_wins_over_user(fleet):
    _, gateway, _ = fleet
    _split_50_50(fleet)
    ranges = [(1, 50), (2, 50)]
    seen: dict[str, set] = defaultdict(set)
    for attempt in range(5):
        for i in range(20):
            user = f"user-{i}"
            resp = _post(gateway, {**BODY, "user": user})
            assert resp.status_code == 200, resp.text
            seen[user].add(int(resp.headers["X-Tandem-Revision"]))
    assert all(len(revisions) == 1 for revisions in seen.values()), seen
    assert {user: revisions.pop() for user, revisions in seen.items()} == {
        f"user-{i}": _expected_revision(f"user-{i}", ranges) for i in range(20)}

    keys = {_expected_revision(f"key-{i}", ranges): f"key-{i}" for i in range(50)}
    for user_revision in (1, 2):
        key_revision = 3 - user_revision
        user = next(f"user-{i}" for i in range(20) if _expected_revision(f"user-{i}", ranges) == user_revision)
        for path, body in (("/v1/completions", {**BODY, "user": user}),
                           ("/v1/chat/completions", {"model": "demo", "max_tokens": 2, "user": user,
                                                     "messages": [{"role": "user", "content": "hi"}]})):
            resp = _post(gateway, body, {"X-Tandem-Variant-Key": keys[key_revision]}, path)
            assert resp.status_code == 200, resp.text
            assert resp.headers["X-Tandem-Revision"] == str(key_revision)


def test_a_user_that_is_not_a_string_is_refused_naming_the_field(fleet):
    _, gateway, _ = fleet
    resp = _post(gateway, {**BODY, "user": 42})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "user" and "'user' must be a string" in error["message"]
    assert "X-Tandem-Revision" not in resp.headers  # refused before a group was picked


def test_streaming_and_non_streaming_answers_say_which_revision_served(fleet):
    _, gateway, _ = fleet
    _split_50_50(fleet)
    chat = {"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}
    for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", chat)):
        for stream in (False, True):
            with requests.post(gateway.url + path, json={**body, "stream": stream}, stream=True, timeout=120,
                               headers={"X-Tandem-Variant-Key": "key-0"}) as resp:
                # Read on the response head, before the body.
                revision, variant = resp.headers.get("X-Tandem-Revision"), resp.headers.get("X-Tandem-Variant")
                assert resp.status_code == 200
                events = sse_events(resp) if stream else [resp.json()]
            assert (revision, variant) in {("1", "a"), ("2", "b")}, (path, stream, resp.headers)
            assert revision == str(_expected_revision("key-0", [(1, 50), (2, 50)]))
            assert events[-1] == "[DONE]" if stream else events[0]["choices"]


def test_setting_a_groups_weight_to_0_moves_all_its_traffic_within_one_poll(fleet):
    control_plane, gateway, workers = fleet
    _split_50_50(fleet)
    on_1 = [f"user-{i}" for i in range(20) if _expected_revision(f"user-{i}", [(1, 50), (2, 50)]) == 1]
    assert on_1 and _post(gateway, {**BODY, "user": on_1[0]}).headers["X-Tandem-Revision"] == "1"
    control_plane.endpoints["groups"] = [_group(workers, 2, 100, "b"), _group(workers, 1, 0, "a")]
    control_plane.wait_polls(2)  # the answer of the first poll after the change has been applied
    revisions = Counter(_post(gateway, {**BODY, "user": user}).headers["X-Tandem-Revision"] for user in on_1)
    revisions.update(_post(gateway, BODY).headers["X-Tandem-Revision"] for _ in range(20))
    assert revisions == {"2": len(on_1) + 20}


def test_a_request_a_failing_canary_fails_before_its_first_token_is_answered_by_stable_and_counted_on_the_canary(
        fleet):
    _, gateway, workers = fleet
    _serve(fleet, _group(workers, 3, 100, "canary", prefill="prefill-3-failing"), _group(workers, 1, 0, "stable"))
    health = requests.get(workers["prefill-3-failing"].url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["revision"] == "3"  # ready through the proxy, as a bad canary is
    errors_before = _sum(gateway.url, "tandem_request_errors_total", revision="3")
    stable_before = _sum(gateway.url, "tandem_request_success_total", revision="1")
    for stream in (False, True):
        resp = _post(gateway, {**BODY, "stream": stream})
        assert resp.status_code == 200, resp.text
        assert resp.headers["X-Tandem-Revision"] == "1" and resp.headers["X-Tandem-Variant"] == "stable"
    # The client saw no failure; the rollout's analysis still sees the canary's.
    assert _sum(gateway.url, "tandem_request_errors_total", revision="3") - errors_before == 2
    assert _sum(gateway.url, "tandem_request_success_total", revision="1") - stable_before == 2
    assert _sum(gateway.url, "tandem_gateway_retries_total", kind="canary_failed") >= 2


def test_a_failing_canary_without_a_stable_group_answers_its_errors_under_its_own_revision_and_variant(fleet):
    _, gateway, workers = fleet
    _serve(fleet, _group(workers, 3, 100, "canary", prefill="prefill-3-failing"))
    errors_before = _sum(gateway.url, "tandem_request_errors_total", revision="3")
    for stream in (False, True):
        resp = _post(gateway, {**BODY, "stream": stream})
        assert resp.status_code == 502, resp.text
        assert resp.headers["X-Tandem-Revision"] == "3" and resp.headers["X-Tandem-Variant"] == "canary"
        assert "chaos fault proxy" in resp.json()["error"]["message"]
    assert _sum(gateway.url, "tandem_request_errors_total", revision="3") - errors_before == 2
    # A request refused before any group was picked counts under revision "".
    refused_before = _sum(gateway.url, "tandem_request_errors_total", revision="")
    assert _post(gateway, {**BODY, "max_tokens": -1}).status_code == 400
    assert _sum(gateway.url, "tandem_request_errors_total", revision="") - refused_before == 1
