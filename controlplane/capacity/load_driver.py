"""The profile run's load driver: drive profiling workers over HTTP at increasing load and return the measured
points. No Django: services.profile_jobs starts the workers (with the revision's own command line) and stores what
this returns.

Prefill: prompts of increasing length, alone and `batch` at once, `max_tokens` 1 so that nothing is handed off
(a prefill worker's /v1/prefill; a colocated worker's /v1/generate, where the time to the first token is the prefill).
Decode: `concurrency` requests at once with a short or a long prompt, `ignore_eos` so that each runs its full
`max_tokens`; the gaps between a request's tokens are the step times at that batch and context (a disaggregated
profile sends them through its own prefill worker to its own decode worker, as the gateway would). The prefill
answers of those requests also give the KV push time and bytes.
"""
from __future__ import annotations

import asyncio
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

Progress = Callable[[float, str], None]


@dataclass(frozen=True, slots=True)
class Levels:
    prompt_tokens: tuple[int, ...]
    prefill_batches: tuple[int, ...]
    concurrency: tuple[int, ...]
    contexts: tuple[int, ...]
    output_tokens: int
    repeats: int

    @classmethod
    def for_run(cls, *, quick: bool, max_model_len: int, max_num_seqs: int) -> "Levels":
        if quick:
            levels = cls((16, 64, 128), (1, 4), (1, 4), (16, 96), 8, 1)
        else:
            levels = cls((16, 64, 256, 512, 1024), (1, 4, 8), (1, 2, 4, 8, 16), (32, 256, 768), 24, 3)
        # Leave room for the output in the context, and never ask for a batch the worker refuses.
        room = max(8, max_model_len - levels.output_tokens - 8)
        return cls(tuple(sorted({min(n, room) for n in levels.prompt_tokens})), levels.prefill_batches,
                   tuple(sorted({min(c, max_num_seqs) for c in levels.concurrency})),
                   tuple(sorted({min(n, room) for n in levels.contexts})), levels.output_tokens, levels.repeats)

    @property
    def num_steps(self) -> int:
        return len(self.prompt_tokens) * len(self.prefill_batches) + len(self.concurrency) * len(self.contexts) + 1

    @property
    def burst(self) -> int:
        """Requests of the saturation burst: twice the highest concurrency level."""
        return 2 * max(self.concurrency)


def prompt_of(num_tokens: int) -> str:
    """Text of about `num_tokens` tokens for any tokenizer (one short word per token); the worker reports the real
    count, which is what the points record."""
    return " ".join(["the"] * max(1, num_tokens - 1))


class ProfileError(Exception):
    pass


async def _json(session: aiohttp.ClientSession, url: str, body: dict, timeout: float) -> dict:
    async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        data = await response.json(content_type=None)
        if response.status != 200:
            raise ProfileError(f"{url} answered {response.status}: {data}")
        return data


async def _stream(session: aiohttp.ClientSession, method: str, url: str, body: dict | None,
                  timeout: float) -> tuple[int | None, list[tuple[float, int]]]:
    """(prompt_tokens, [(arrival time, number of tokens)] of each token event) of an NDJSON stream."""
    import json

    events, prompt_tokens = [], None
    async with session.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
        if response.status != 200:
            raise ProfileError(f"{url} answered {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            if event["type"] == "start":
                prompt_tokens = event.get("prompt_tokens")
            elif event["type"] == "token" and event.get("token_ids"):
                events.append((time.perf_counter(), len(event["token_ids"])))
            elif event["type"] == "error":
                raise ProfileError(f"{url}: {event.get('message')}")
    return prompt_tokens, events


def _body(num_tokens: int, max_tokens: int) -> dict:
    return {"request_id": f"profile-{uuid.uuid4().hex[:12]}", "prompt": prompt_of(num_tokens),
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


class Driver:
    """One profile run against started workers: `serving_url` takes prompts (prefill or colocated worker),
    `decode_url` is the decode worker of a disaggregated run (None for colocated)."""

    def __init__(self, *, serving_url: str, decode_url: str | None, timeout: float = 300.0,
                 headers: dict[str, str] | None = None):
        self.serving_url, self.decode_url, self.timeout = serving_url.rstrip("/"), decode_url, timeout
        self.headers = headers or {}  # sent with every request: the workers' secret (inference.worker_secret)

    async def prefill_once(self, session, num_tokens: int, batch: int) -> tuple[int, float]:
        """(prompt tokens, seconds until the last of `batch` simultaneous prompts had its first token)."""
        started = time.perf_counter()

        async def one() -> int:
            body = _body(num_tokens, 1)
            if self.decode_url is None:
                prompt_tokens, _ = await _stream(session, "POST", f"{self.serving_url}/v1/generate", body,
                                                 self.timeout)
                return prompt_tokens
            data = await _json(session, f"{self.serving_url}/v1/prefill",
                               {**body, "decode_url": self.decode_url}, self.timeout)
            return data["prompt_tokens"]

        counts = await asyncio.gather(*(one() for _ in range(batch)))
        return int(counts[0] or num_tokens), time.perf_counter() - started

    async def decode_once(self, session, num_tokens: int, concurrency: int, output_tokens: int) -> dict:
        """Step-time statistics of `concurrency` requests decoding at once."""
        transfers: list[tuple[float, int]] = []

        async def one() -> tuple[int, list[tuple[float, int]]]:
            body = _body(num_tokens, output_tokens + 1)
            if self.decode_url is None:
                return await _stream(session, "POST", f"{self.serving_url}/v1/generate", body, self.timeout)
            data = await _json(session, f"{self.serving_url}/v1/prefill", {**body, "decode_url": self.decode_url},
                               self.timeout)
            transfers.append((float(data.get("kv_transfer_seconds") or 0.0), int(data.get("kv_bytes") or 0)))
            _, events = await _stream(session, "GET", f"{self.decode_url}/v1/stream/{body['request_id']}", None,
                                      self.timeout)
            return data["prompt_tokens"], events

        started = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        gaps = []
        for _, events in results:
            gaps += [(t1 - t0) / n for (t0, _), (t1, n) in zip(events, events[1:])]
        if not gaps:
            raise ProfileError("the decode level produced no token gaps (is max_tokens > 2?)")
        gaps.sort()
        prompt_tokens = int(results[0][0] or num_tokens)
        point = {"batch": concurrency, "context": prompt_tokens + output_tokens // 2,
                 "prompt_tokens": prompt_tokens, "step_s": statistics.median(gaps),
                 "step_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
                 "tokens_per_s": sum(len(e) for _, e in results) / wall, "source": "synthetic"}
        if transfers:
            point["kv_transfer_s"] = statistics.median(t for t, _ in transfers)
            point["kv_bytes"] = int(statistics.median(b for _, b in transfers))
        return point

    async def burst_once(self, session, levels: Levels) -> dict:
        """`burst` requests at once (short prompt, the levels' output length): how long the worker(s) take for them
        all, which calibrates the per-request time outside the engine's steps."""
        num_tokens = min(levels.contexts)
        started = time.perf_counter()
        point = await self.decode_once(session, num_tokens, levels.burst, levels.output_tokens)
        return {"requests": levels.burst, "prompt_tokens": point["prompt_tokens"],
                "output_tokens": levels.output_tokens + 1, "wall_s": time.perf_counter() - started,
                "source": "synthetic"}

    async def run(self, levels: Levels, progress: Progress) -> dict:
        """{"prefill": [points], "decode": [points]}; progress(fraction, what) after each level."""
        points = {"prefill": [], "decode": []}
        done = 0
        async with aiohttp.ClientSession(headers=self.headers) as session:
            await self.prefill_once(session, 8, 1)  # warm-up: first-call costs are not a property of the load
            for num_tokens in levels.prompt_tokens:
                for batch in levels.prefill_batches:
                    progress(done / levels.num_steps, f"prefill: {batch} × {num_tokens} prompt tokens")
                    runs = [await self.prefill_once(session, num_tokens, batch) for _ in range(levels.repeats)]
                    prompt_tokens = runs[0][0]
                    points["prefill"].append({"prompt_tokens": prompt_tokens, "batch": batch,
                                              "batch_tokens": prompt_tokens * batch,
                                              "latency_s": statistics.median(s for _, s in runs),
                                              "source": "synthetic"})
                    done += 1
            for context in levels.contexts:
                for concurrency in levels.concurrency:
                    progress(done / levels.num_steps, f"decode: {concurrency} sequences, {context}-token prompts")
                    runs = [await self.decode_once(session, context, concurrency, levels.output_tokens)
                            for _ in range(levels.repeats)]
                    best = sorted(runs, key=lambda p: p["step_s"])[len(runs) // 2]
                    points["decode"].append(best)
                    done += 1
            progress(done / levels.num_steps, f"saturation: {levels.burst} requests at once")
            points["saturation"] = [await self.burst_once(session, levels)]
        progress(1.0, "measured")
        return points


def drive(*, serving_url: str, decode_url: str | None, levels: Levels, progress: Progress,
          timeout: float = 300.0, headers: dict[str, str] | None = None) -> dict:
    """Run the levels on an event loop in a thread of its own; `progress` is called in the caller's thread (it
    writes the job row, and database calls do not belong on an event loop). `headers` go with every request."""
    events: queue.Queue = queue.Queue()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["points"] = asyncio.run(Driver(serving_url=serving_url, decode_url=decode_url, timeout=timeout,
                                                   headers=headers)
                                            .run(levels, lambda fraction, step: events.put((fraction, step))))
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc
        finally:
            events.put(None)

    thread = threading.Thread(target=run, name="profile-driver", daemon=True)
    thread.start()
    while (event := events.get()) is not None:
        progress(*event)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["points"]


def wait_healthy(url: str, *, timeout: float, alive: Callable[[], bool], warmup_timeout: float = 0.0) -> dict:
    """Poll GET url/health until 200 (returns GET /info), the process exits (ProfileError) or the deadline: `timeout`,
    or `warmup_timeout` once the worker answers 503 "starting" (up, loading its model or compiling its decode step),
    as the health pass gives a starting worker TANDEM_WARMUP_TIMEOUT_S."""
    import requests

    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise ProfileError(f"the profiling worker at {url} exited before it was ready")
        try:
            response = requests.get(f"{url}/health", timeout=2)
            if response.status_code == 200:
                return requests.get(f"{url}/info", timeout=5).json()
            if warmup_timeout > timeout and _says_starting(response):
                deadline, timeout = start + warmup_timeout, warmup_timeout
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise ProfileError(f"the profiling worker at {url} was not ready within {timeout:.0f} s")


def _says_starting(response) -> bool:
    """A 503 whose JSON body says {"status": "starting"} (a worker's /health while it loads or compiles)."""
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("status") == "starting"
