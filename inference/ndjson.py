"""Newline-delimited JSON: how a worker streams a request's events to the gateway (docs/contracts.md).

One compact UTF-8 JSON object per line. Workers write with `encode`; the gateway reads with `read`.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator

CONTENT_TYPE = "application/x-ndjson"


def encode(obj: dict) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


async def read(lines: AsyncIterable[bytes]) -> AsyncIterator[dict]:
    """The objects of a stream of lines (an aiohttp response's `content` iterates by line); blank lines are skipped."""
    async for line in lines:
        line = line.strip()
        if line:
            yield json.loads(line)
