"""A shared gateway's membership: the deployments the control plane attaches to it, all in one poll.

`GET {URL}/api/v1/gateways/{NAME}/endpoints` (docs/contracts.md, "Shared gateway membership") answers
`{"gateway": NAME, "deployments": [...]}`, each item one deployment's answer in the per-deployment shape
(membership.py). One poll for all of them: fifty deployments behind one gateway cost the control plane one request
every interval, not fifty.

Each item is checked on its own (membership.parse_deployment): a malformed one keeps that deployment's last good
membership, and the others apply. An answer whose envelope is malformed (not an object, no list, an item without a
name, two items of one model) changes nothing, and neither does an unreachable control plane: the gateway serves on
with what it last knew. A deployment the answer no longer lists is detached: new requests for its model get 404, and
the ones it holds finish (app.Gateway.attach).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from inference.gateway.config import Config
from inference.gateway.membership import DeploymentAnswer, MembershipError, parse_deployment

log = logging.getLogger("tandem.gateway.membership")


@dataclass(slots=True)
class Attached:
    """One deployment of the answer: its name, the model clients send for it, and its answer or what is wrong with
    it."""

    name: str
    model: str
    answer: DeploymentAnswer | None
    error: str | None = None


def parse_shared(body: object) -> list[Attached]:
    """The deployments of a shared gateway's answer, each item parsed on its own; MembershipError for an envelope
    that cannot be trusted at all."""
    if not isinstance(body, dict):
        raise MembershipError("answer is not a JSON object")
    items = body.get("deployments")
    if not isinstance(items, list):
        raise MembershipError("'deployments' is not a list")
    attached: list[Attached] = []
    models: set[str] = set()
    for item in items:
        name = item.get("deployment") if isinstance(item, dict) else None
        model = item.get("model", name) if isinstance(item, dict) else None
        if not (isinstance(name, str) and name and isinstance(model, str) and model):
            raise MembershipError("a deployment's answer has no 'deployment' and 'model' names")
        if model in models:
            raise MembershipError(f"two deployments serve the model {model!r}")
        models.add(model)
        try:
            attached.append(Attached(name, model, parse_deployment(item)))
        except MembershipError as exc:
            attached.append(Attached(name, model, None, str(exc)))
    return attached


class SharedMembership:
    """Polls the shared gateway's answer and hands each good one to `on_answer` (app.Gateway.attach)."""

    def __init__(self, config: Config, on_answer: Callable[[list[Attached]], Awaitable[None]]) -> None:
        self.config = config
        self.on_answer = on_answer
        self.url = f"{config.control_plane_url}/api/v1/gateways/{config.shared_gateway}/endpoints"
        self.headers = {"Authorization": f"Token {config.token}"}
        self.num_polls_failed = 0
        self.last_error: str | None = None
        self.errors: dict[str, str] = {}  # deployment name → what was wrong with its item in the last answer

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=max(self.config.membership_interval, 5.0),
                                        connect=self.config.connect_timeout)
        try:
            async with session.get(self.url, headers=self.headers, timeout=timeout) as resp:
                if resp.status != 200:
                    raise MembershipError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                attached = parse_shared(await resp.json(content_type=None))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, MembershipError) as exc:
            self.num_polls_failed += 1
            error = f"control plane {self.url}: {type(exc).__name__}: {exc}"
            if error != self.last_error:
                log.warning("%s (keeping the last good membership)", error)
            self.last_error = error
            return
        if self.last_error:
            log.info("control plane %s answers again", self.url)
        self.last_error = None
        errors = {a.name: a.error for a in attached if a.error is not None}
        for name, error in errors.items():
            if self.errors.get(name) != error:
                log.warning("deployment %s: %s (keeping its last good membership)", name, error)
        self.errors = errors
        await self.on_answer(attached)

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.poll_once(session)
            await asyncio.sleep(self.config.membership_interval)
