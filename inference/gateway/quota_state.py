"""Tenants' minute of usage kept across a gateway restart (`--quota-state FILE`).

The per-minute buckets (tenant_quota.py) live in the gateway's memory: without this, a restarted gateway would give
every tenant a fresh minute. With a file, the gateway writes every tenant's bucket levels there (atomically: a
temporary file renamed over it) every SAVE_INTERVAL_S seconds and when it stops, and reads it when it starts: a
tenant the restarted gateway knows again starts from its saved levels, refilled for the time the gateway was away
(wall-clock seconds, since the monotonic clock does not survive the process), under its current limits (a changed
limit keeps what was spent, as TokenBucket.resize). A clean stop loses nothing; a crash loses at most the last
SAVE_INTERVAL_S seconds of usage. A missing, unreadable or malformed file is a fresh minute for everyone, with a log
line. The node agent gives each gateway it starts a file of its own (controlplane/agent/launch.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path

from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_limits import BUCKETS  # TenantState.buckets' keys; the file's keys

log = logging.getLogger("tandem.gateway.quota_state")

SAVE_INTERVAL_S = 1.0


def snapshot(gate: TenantGate, *, wall: float) -> dict:
    """Every tenant's bucket levels now: {"saved_at": wall, "tenants": {name: {bucket: [per_minute, level]}}}."""
    gate.sync()  # tenants the membership names again take their carried levels first
    now = gate.clock()
    tenants = {}
    for name, state in gate.states.items():
        buckets = {}
        for kind, bucket in state.buckets.items():
            bucket.wait_s(0, now)  # refilled up to now
            buckets[kind] = [bucket.per_minute, bucket.level]
        if buckets:
            tenants[name] = buckets
    # Carried levels of tenants the membership does not name (yet: a control plane away) stay for a later start.
    for name, buckets in gate.carried.items():
        tenants.setdefault(name, _refilled(buckets, wall - gate.carried_at))
    return {"saved_at": wall, "tenants": tenants}


def save(gate: TenantGate, path: Path, *, wall: float | None = None) -> None:
    """Write the snapshot (nothing while no tenant has a bucket and no file was written: an open deployment)."""
    state = snapshot(gate, wall=time.time() if wall is None else wall)
    if not state["tenants"] and not path.exists():
        return
    body = json.dumps(state, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(body)
    os.replace(tmp, path)


def parse(body: object, *, wall: float) -> dict[str, dict[str, list[float]]]:
    """A saved file's levels, refilled for the seconds since it was saved: {tenant: {bucket: [per_minute, level]}};
    ValueError when it is malformed."""
    if not isinstance(body, dict) or not isinstance(body.get("tenants"), dict):
        raise ValueError("not an object with 'tenants'")
    saved_at = body.get("saved_at")
    if not isinstance(saved_at, (int, float)) or not math.isfinite(saved_at):
        raise ValueError("'saved_at' is not a number")
    carried = {}
    for name, buckets in body["tenants"].items():
        if not isinstance(buckets, dict):
            raise ValueError(f"tenant {name!r}: not an object")
        levels = {}
        for kind, value in buckets.items():
            if kind not in BUCKETS or not isinstance(value, list) or len(value) != 2 or not all(
                    isinstance(v, (int, float)) and math.isfinite(v) for v in value) or value[0] <= 0:
                raise ValueError(f"tenant {name!r}: bad bucket {kind!r}")
            levels[kind] = [float(value[0]), float(value[1])]
        carried[name] = _refilled(levels, wall - saved_at)
    return carried


def _refilled(buckets: dict[str, list[float]], seconds: float) -> dict[str, list[float]]:
    seconds = max(0.0, seconds)
    return {kind: [per_minute, min(per_minute, level + seconds * per_minute / 60.0)]
            for kind, (per_minute, level) in buckets.items()}


def load(gate: TenantGate, path: Path, *, wall: float | None = None) -> None:
    """Hand the saved levels to the gate (applied to each tenant when the membership names it again)."""
    wall = time.time() if wall is None else wall
    try:
        gate.carried, gate.carried_at = parse(json.loads(path.read_text()), wall=wall), wall
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        log.warning("quota state %s not used (every tenant starts with a fresh minute): %s", path, exc)
        return
    log.info("quota state %s: %d tenants' minute of usage carried over", path, len(gate.carried))


def save_quietly(gate: TenantGate, path: Path) -> None:
    """save, with a log line instead of an exception when the file cannot be written (a full disk must not stop
    the gateway)."""
    try:
        save(gate, path)
    except OSError as exc:
        log.warning("quota state %s not saved: %s", path, exc)


async def run(gate: TenantGate, path: Path) -> None:
    while True:
        await asyncio.sleep(SAVE_INTERVAL_S)
        save_quietly(gate, path)
