"""The gateway's request trace: one record per request it admitted for serving, kept in a bounded ring that the
control plane pulls (GET /trace, operator only) into its trace store (controlplane/replay), where a replay of the
deployment reads it.

A record holds what a replay needs and nothing a client said: when the request arrived, who sent it (tenant, or an
anonymous caller's fairness key) and in which priority class, its prompt and completion token counts, `max_tokens`,
the chained hashes of its prompt's leading blocks (two requests whose first k hashes match share a k-block prefix,
which a prefix cache would reuse), and how it went: TTFT and end-to-end seconds as the client saw them, the outcome
(`ok`, `shed` when admission refused or timed it out, `incomplete` when the stream ended before its finish, `error`).

Blocks are cut from the prompt's text, not its tokens (the gateway has no tokenizer): BLOCK_CHARS characters each,
at most MAX_BLOCKS of them, each hash covering its block and every block before it. `block_tokens` turns them into
tokens for the replay (the prompt's tokens per block, from its measured token count). A request that never reached
a worker has no measured prompt size: its tokens are estimated from its characters and the record says so.

Each deployment a gateway serves has its own ring, and each record names its deployment (a shared gateway answers
`GET /trace?deployment=NAME`), so one busy deployment cannot push another's records out. The ring holds the last
`size` records; `GET /trace?after=SEQ` returns those after SEQ, with the ring's oldest
sequence number, so a reader that fell behind knows how many it lost. Sequence numbers start at 1 with each process
(`started` tells processes apart).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

BLOCK_CHARS = 256
MAX_BLOCKS = 64
CHARS_PER_TOKEN = 4  # only for prompts that never reached a worker
DEFAULT_SIZE = 20000
MAX_PAGE = 5000
OUTCOMES = ("ok", "shed", "incomplete", "error")
# Refusals of admission (admission.py): what a replay of another fleet or other settings may not repeat.
SHED_CODES = frozenset({"queue_full", "queue_timeout", "overloaded"})


class Answer(Protocol):
    """What a record reads of the gateway's answer (an aiohttp response; a refusal's JSON is its `body`)."""

    status: int


def prompt_text(worker_body: dict) -> str:
    """The text whose blocks are hashed: a completion's prompt; a chat's messages as role and content."""
    prompt = worker_body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\x1e".join(str(p) for p in prompt)
    parts = []
    for message in worker_body.get("messages") or ():
        if isinstance(message, dict):
            parts.append(f"{message.get('role')}\x1f{message.get('content')}\x1e")
    return "".join(parts)


def block_hashes(text: str) -> tuple[str, ...]:
    """Chained hashes of the text's whole leading blocks (a shorter tail is no block: it cannot be shared as one)."""
    hashes, previous = [], b""
    for start in range(0, min(len(text), BLOCK_CHARS * MAX_BLOCKS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        digest = hashlib.blake2b(previous + text[start:start + BLOCK_CHARS].encode("utf-8", "replace"),
                                 digest_size=6).digest()
        hashes.append(digest.hex())
        previous = digest
    return tuple(hashes)


@dataclass(slots=True)
class TraceEntry:
    """One request while it is served; the gateway fills in its first token and its finish."""

    arrival: float  # wall clock
    received: float  # perf counter, the same instant
    tenant: str
    priority: str
    prompt_chars: int
    hashes: tuple[str, ...]
    max_tokens: int | None
    first_token: float | None = None  # perf counter
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    finish: str | None = None
    revision: str | None = None

    def first(self, now: float) -> None:
        if self.first_token is None:
            self.first_token = now

    def finished(self, prompt_tokens: int, completion_tokens: int, reason: str | None) -> None:
        self.prompt_tokens, self.completion_tokens, self.finish = prompt_tokens, completion_tokens, reason or "stop"


class TraceLog:
    """The bounded ring of finished requests' records, sampled at `sample` (0..1; 0 records nothing)."""

    def __init__(self, size: int = DEFAULT_SIZE, sample: float = 1.0, *, rng: random.Random | None = None,
                 deployment: str | None = None) -> None:
        self.size, self.sample, self.deployment = size, sample, deployment
        self.started = time.time()
        self.records: deque[dict] = deque(maxlen=max(1, size))
        self.seq = 0
        self._rng = rng or random.Random()

    def begin(self, worker_body: dict, tenant: str, priority: str, received: float) -> TraceEntry | None:
        """A record for a request just admitted, or None when it is not sampled (or the log is off)."""
        if self.size <= 0 or self.sample <= 0 or (self.sample < 1 and self._rng.random() >= self.sample):
            return None
        text = prompt_text(worker_body)
        max_tokens = worker_body.get("max_tokens")
        return TraceEntry(time.time() - (time.perf_counter() - received), received, tenant, priority, len(text),
                          block_hashes(text), max_tokens if isinstance(max_tokens, int) else None)

    def end(self, entry: TraceEntry | None, response: Answer | None) -> None:
        """Keep the record of a request that ended with `response` (None: the client went away before an answer;
        a refusal's error code says whether admission shed it)."""
        if entry is None:
            return
        now = time.perf_counter()
        status = response.status if response is not None else None
        if entry.finish is not None:
            outcome = "ok"
        elif status is None or status < 300:
            outcome = "incomplete"  # the stream ended before its finish (cut, or the client left)
        else:
            outcome = "shed" if error_code(getattr(response, "body", None)) in SHED_CODES else "error"
        estimated = entry.prompt_tokens is None
        prompt_tokens = entry.prompt_tokens if not estimated else max(1, math.ceil(entry.prompt_chars
                                                                                   / CHARS_PER_TOKEN))
        blocks = len(entry.hashes)
        block_tokens = max(1, round(prompt_tokens * BLOCK_CHARS / entry.prompt_chars)) if blocks else 0
        self.seq += 1
        self.records.append({
            "seq": self.seq, "t": round(entry.arrival, 4), "tenant": entry.tenant, "class": entry.priority,
            "prompt_tokens": prompt_tokens, "prompt_estimated": estimated,
            "completion_tokens": entry.completion_tokens, "max_tokens": entry.max_tokens,
            "block_tokens": block_tokens, "hashes": list(entry.hashes),
            "ttft_s": None if entry.first_token is None else round(entry.first_token - entry.received, 6),
            "e2e_s": round(now - entry.received, 6), "outcome": outcome, "finish": entry.finish,
            "revision": entry.revision, "status": status, "deployment": self.deployment,
        })

    def page(self, after: int, limit: int = MAX_PAGE) -> dict:
        """The records after sequence number `after` (at most `limit`), oldest first."""
        limit = max(1, min(limit, MAX_PAGE))
        oldest = self.records[0]["seq"] if self.records else self.seq + 1
        skip = max(0, after + 1 - oldest)
        records = list(islice(self.records, skip, skip + limit))
        return {"deployment": self.deployment, "started": self.started, "oldest": oldest, "last": self.seq,
                "size": self.size, "sample": self.sample, "records": records}


def error_code(body: bytes | None) -> str | None:
    """The `error.code` of an OpenAI-shaped error body (None when there is none)."""
    try:
        code = json.loads(body)["error"]["code"] if body else None
    except (ValueError, TypeError, KeyError):
        return None
    return code if isinstance(code, str) else None
