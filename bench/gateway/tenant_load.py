"""The clients of bench/gateway/tenants.py: closed-loop, periodic and open-loop (Poisson) load against one gateway,
as the tenants `noisy` and `quiet`, and what finished inside the measured window."""
from __future__ import annotations

import asyncio
import json
import time

from inference.gateway.admission import DEFAULT_HEADROOM

KEYS = {"noisy": "tk-noisy-0123456789", "quiet": "tk-quiet-0123456789"}
OVERLOAD_DEADLINE_S = 10.0  # the interactive class's default queue deadline (admission.DEFAULT_DEADLINES)


def headroom(args) -> int:
    return DEFAULT_HEADROOM if args.headroom is None else args.headroom


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


class Load:
    """Closed-loop and periodic clients against one gateway; what finished inside the measured window."""

    def __init__(self, session, url: str, window: tuple[float, float]) -> None:
        self.session, self.url, self.window = session, url, window
        self.tokens = {name: 0 for name in KEYS}
        self.failures: dict[str, int] = {}
        self.quiet_ttft: list[float] = []
        self.quiet_e2e: list[float] = []
        self.arrivals: list[float | None] = []  # open loop: each request in the window, its TTFT or None (failed)

    def _in_window(self, t: float) -> bool:
        return self.window[0] <= t <= self.window[1]

    async def request(self, tenant: str, max_tokens: int, stream: bool) -> tuple[float, float] | None:
        """(TTFT, e2e) seconds, or None when it failed; counts its completion tokens if it ended in the window."""
        body = {"model": "demo", "prompt": "one two three four", "max_tokens": max_tokens, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        started = time.monotonic()
        ttft, completion = None, 0
        try:
            async with self.session.post(self.url + "/v1/completions", json=body,
                                         headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as resp:
                if resp.status != 200:
                    self.failures[f"{tenant}:{resp.status}"] = self.failures.get(f"{tenant}:{resp.status}", 0) + 1
                    await resp.read()
                    return None
                if stream:
                    async for line in resp.content:
                        if not line.startswith(b"data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if ttft is None and chunk.get("choices"):
                            ttft = time.monotonic() - started
                        if chunk.get("usage"):
                            completion = chunk["usage"]["completion_tokens"]
                else:
                    completion = (await resp.json())["usage"]["completion_tokens"]
        except Exception as exc:  # noqa: BLE001 - a bench counts failures, whatever they are
            key = f"{tenant}:{type(exc).__name__}"
            self.failures[key] = self.failures.get(key, 0) + 1
            return None
        ended = time.monotonic()
        if self._in_window(ended):
            self.tokens[tenant] += completion
        return (ttft if ttft is not None else ended - started), ended - started

    async def closed_loop(self, tenant: str, max_tokens: int, until: float) -> None:
        while time.monotonic() < until:
            if await self.request(tenant, max_tokens, stream=False) is None:
                await asyncio.sleep(0.2)  # a refused request: back off a little, as a client would

    async def periodic(self, tenant: str, max_tokens: int, interval: float, until: float) -> None:
        tasks = []

        async def one() -> None:
            started = time.monotonic()
            result = await self.request(tenant, max_tokens, stream=True)
            if result is not None and self._in_window(started):
                self.quiet_ttft.append(result[0])
                self.quiet_e2e.append(result[1])

        while time.monotonic() < until:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(interval)
        await asyncio.gather(*tasks)


    async def open_loop(self, tenant: str, max_tokens: int, rate: float, until: float, seed: int) -> None:
        """Poisson arrivals at `rate` per second until `until`, each streamed: what an overloaded fleet sees."""
        import random

        rng, tasks = random.Random(seed), []

        async def one() -> None:
            started = time.monotonic()
            result = await self.request(tenant, max_tokens, stream=True)
            if self._in_window(started):
                self.arrivals.append(None if result is None else result[0])

        while time.monotonic() < until:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)


async def overload(url: str, args, rate: float) -> dict:
    import aiohttp

    start = time.monotonic()
    window = (start + args.warmup, start + args.warmup + args.duration)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=900)) as session:
        load = Load(session, url, window)
        await load.open_loop("noisy", args.long_tokens, rate, window[1], seed=int(rate * 1000))
    good = [ttft for ttft in load.arrivals if ttft is not None and ttft <= OVERLOAD_DEADLINE_S]
    ttfts = [ttft for ttft in load.arrivals if ttft is not None]
    return {"rate_rps": round(rate, 2), "requests": len(load.arrivals),
            "goodput_rps": round(len(good) / args.duration, 2), "served_ttft_p50_s": pct(ttfts, 0.5), "served_ttft_p99_s": pct(ttfts, 0.99), "failed": load.failures}


async def capacity(url: str, args) -> float:
    """Requests per second the worker completes, closed loop with as many clients as the gateway's slots."""
    import aiohttp

    start = time.monotonic()
    window = (start + args.warmup, start + args.warmup + min(args.duration, 15.0))
    done = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        load = Load(session, url, window)

        async def client() -> None:
            while time.monotonic() < window[1]:
                result = await load.request("noisy", args.long_tokens, stream=True)
                if result is not None and load._in_window(time.monotonic()):
                    done.append(result)

        await asyncio.gather(*(client() for _ in range(args.slots + headroom(args))))
    return len(done) / (window[1] - window[0])


async def scenario(url: str, name: str, args) -> dict:
    import aiohttp

    noisy_streams = args.noisy_streams or 4 * args.slots
    start = time.monotonic()
    window = (start + args.warmup, start + args.warmup + args.duration)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        load = Load(session, url, window)
        if name in ("isolation", "priority"):
            clients = [load.closed_loop("noisy", args.long_tokens, window[1]) for _ in range(noisy_streams)]
            clients.append(load.periodic("quiet", args.short_tokens, args.quiet_interval, window[1]))
        else:
            # More than its fair half of the gateway's slots (what the worker runs + the headroom): always backlogged.
            quiet_streams = (args.slots + headroom(args)) // 2 + 1
            clients = [load.closed_loop("noisy", args.long_tokens, window[1]) for _ in range(10 * quiet_streams)]
            clients += [load.closed_loop("quiet", args.long_tokens, window[1]) for _ in range(quiet_streams)]
        await asyncio.gather(*clients)
    total = sum(load.tokens.values()) or 1
    result = {"token_share": {t: round(n / total, 3) for t, n in load.tokens.items()},
              "completion_tokens_per_s": {t: round(n / args.duration, 1) for t, n in load.tokens.items()},
              "failed": load.failures}
    if name in ("isolation", "priority"):
        result.update({"quiet_requests": len(load.quiet_e2e),
                       "quiet_ttft_p50_s": pct(load.quiet_ttft, 0.5), "quiet_ttft_p90_s": pct(load.quiet_ttft, 0.9),
                       "quiet_ttft_p99_s": pct(load.quiet_ttft, 0.99),
                       # With a few dozen requests P99 is the worst one: the three worst say whether it stands alone.
                       "quiet_ttft_worst_s": [round(t, 3) for t in sorted(load.quiet_ttft)[-3:]],
                       "quiet_e2e_p50_s": pct(load.quiet_e2e, 0.5), "quiet_e2e_p99_s": pct(load.quiet_e2e, 0.99)})
    return result


async def unloaded(url: str, args, num: int = 20) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        load = Load(session, url, (0.0, float("inf")))
        results = [await load.request("quiet", args.short_tokens, stream=True) for _ in range(num)]
    e2e = [r[1] for r in results if r]
    ttft = [r[0] for r in results if r]
    return {"ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "e2e_p50_s": pct(e2e, 0.5)}
