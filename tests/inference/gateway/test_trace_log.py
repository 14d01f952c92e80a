"""The gateway's request trace (trace_log.py): outcomes told apart by how the request ended, the ring bounded and
paged by sequence number, sampling, chained prefix hashes."""
from __future__ import annotations

import json
import random
import time
from types import SimpleNamespace

from inference.gateway.trace_log import BLOCK_CHARS, TraceLog, block_hashes


def _refusal(status: int, code: str) -> SimpleNamespace:
    return SimpleNamespace(status=status, body=json.dumps({"error": {"code": code}}).encode())


def test_each_way_a_request_ends_has_its_outcome():
    log = TraceLog(size=10)
    body = {"prompt": "x" * (3 * BLOCK_CHARS + 10), "max_tokens": 9}
    served = log.begin(body, "acme", "standard", time.perf_counter())
    served.first(time.perf_counter())
    served.finished(200, 9, "length")
    log.end(served, SimpleNamespace(status=200))
    for status, code in ((429, "queue_full"), (503, "queue_timeout"), (503, "no_ready_workers")):
        log.end(log.begin(body, "acme", "standard", time.perf_counter()), _refusal(status, code))
    cut = log.begin(body, "acme", "standard", time.perf_counter())
    cut.first(time.perf_counter())
    log.end(cut, SimpleNamespace(status=200))  # a stream that ended before its finish
    log.end(log.begin(body, "acme", "standard", time.perf_counter()), None)  # the client left first
    records = log.page(0)["records"]
    assert [r["outcome"] for r in records] == ["ok", "shed", "shed", "error", "incomplete", "incomplete"]
    ok, shed = records[0], records[1]
    assert ok["prompt_tokens"] == 200 and not ok["prompt_estimated"] and ok["finish"] == "length"
    assert ok["block_tokens"] == round(200 * BLOCK_CHARS / (3 * BLOCK_CHARS + 10)) and len(ok["hashes"]) == 3
    assert shed["prompt_estimated"] and shed["prompt_tokens"] == (3 * BLOCK_CHARS + 10 + 3) // 4
    assert shed["ttft_s"] is None and shed["completion_tokens"] == 0


def test_the_ring_keeps_the_newest_and_pages_by_sequence_number():
    log = TraceLog(size=3)
    for _ in range(5):
        log.end(log.begin({"prompt": "hi"}, "", "", time.perf_counter()), None)
    page = log.page(0)
    assert page["oldest"] == 3 and page["last"] == 5 and [r["seq"] for r in page["records"]] == [3, 4, 5]
    assert [r["seq"] for r in log.page(3, limit=1)["records"]] == [4]
    assert log.page(5)["records"] == []


def test_sampling_and_a_trace_turned_off():
    sampled = TraceLog(size=1000, sample=0.25, rng=random.Random(7))
    kept = sum(sampled.begin({"prompt": "hi"}, "", "", time.perf_counter()) is not None for _ in range(2000))
    assert 350 < kept < 650
    assert TraceLog(size=0).begin({"prompt": "hi"}, "", "", time.perf_counter()) is None


def test_hashes_are_chained_so_equal_blocks_after_a_difference_differ():
    a, b = "A" * BLOCK_CHARS + "C" * BLOCK_CHARS, "B" * BLOCK_CHARS + "C" * BLOCK_CHARS
    assert block_hashes(a)[0] != block_hashes(b)[0] and block_hashes(a)[1] != block_hashes(b)[1]
    assert block_hashes(a + "tail") == block_hashes(a) and block_hashes("short") == ()
    chat = {"messages": [{"role": "system", "content": "S" * 600}, {"role": "user", "content": "q"}]}
    assert len(TraceLog().begin(chat, "", "", time.perf_counter()).hashes) == 2
