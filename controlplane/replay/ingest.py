"""The pull: every TANDEM_TRACE_PULL_INTERVAL_S, read each serving gateway's /trace past its cursor (the scrape token
answers it) into its deployment's recorded trace. A shared gateway keeps a ring per deployment: it is read once per
deployment attached to it (`/trace?deployment=NAME`), each into that deployment's trace, with a cursor per
(gateway, deployment). A gateway that does not answer is tried again next pass: its ring holds the records
meanwhile, and what the ring dropped before a pull read it is counted on the cursor (`lost`)."""
from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlencode

import aiohttp

from controlplane.lib.fleet_http import fleet_http, gather_bounded, get_text, pass_bound_s
from controlplane.lib.worker_keys import scrape_headers
from controlplane.models import Deployment, Worker, WorkerRole, WorkerStatus
from controlplane.replay.models import Trace
from controlplane.replay.services import cursor_position, prune, recorded_trace, store_page

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
CONCURRENCY = 16
MAX_PAGES = 20  # per gateway and pass: a gateway far behind catches up over a few passes
READY = (WorkerStatus.READY, WorkerStatus.DRAINING)


def _gateways() -> list[tuple[int, int, str]]:
    """(gateway worker id, deployment id, the URL its /trace is read at but for `after`): one per deployment a
    shared gateway serves."""
    rows = Worker.objects.filter(role=WorkerRole.GATEWAY, status__in=READY, port__isnull=False) \
        .values_list("id", "deployment_id", "shared_gateway_id", "host", "port")
    attached: dict[int, list[tuple[int, str]]] = {}
    for dep, name, gateway in Deployment.objects.filter(shared_gateway__isnull=False).values_list(
            "id", "name", "shared_gateway_id"):
        attached.setdefault(gateway, []).append((dep, name))
    pulls = []
    for wid, dep, shared, host, port in rows:
        url = f"http://{host}:{port}/trace?"
        if shared is None:
            pulls.append((wid, dep, url))
        else:
            pulls.extend((wid, dep, f"{url}{urlencode({'deployment': name})}&") for dep, name in attached.get(shared, []))
    return pulls


async def _page(session: aiohttp.ClientSession, url: str, after: int) -> dict:
    status, text = await get_text(session, f"{url}after={after}", timeout_s=TIMEOUT_S, headers=scrape_headers())
    if status != 200:
        raise ValueError(f"HTTP {status}: {text[:200]}")
    return json.loads(text)


def _fetch(gateways: list[tuple[int, int, str, int]]) -> list[dict | str]:
    async def one(session, item):
        try:
            return await _page(session, item[2], item[3])
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    bound = pass_bound_s(len(gateways), CONCURRENCY, TIMEOUT_S)
    return fleet_http().run(lambda session: gather_bounded(
        gateways, lambda item: one(session, item), concurrency=CONCURRENCY, bound_s=bound,
        late=lambda item: "no answer within the pass's bound"), timeout_s=bound + 30)


def pull_all() -> dict:
    """One pass over every serving gateway; returns what it stored and which gateways failed."""
    gateways = _gateways()
    traces: dict[int, Trace] = {}
    stored, failed = 0, {}
    pending = []
    for wid, dep, url in gateways:
        started, last = cursor_position(wid, dep)
        pending.append((wid, dep, url, last, started))
    for _ in range(MAX_PAGES):
        if not pending:
            break
        pages = _fetch([(wid, dep, url, last) for wid, dep, url, last, _ in pending])
        more = []
        for (wid, dep, url, last, started), page in zip(pending, pages):
            if isinstance(page, str):
                failed[(wid, dep)] = page
                continue
            if started is not None and abs(page["started"] - started) > 1e-6 and last:
                # A new process: read its ring from the start (the page just read began past our old cursor).
                more.append((wid, dep, url, 0, page["started"]))
                continue
            if dep not in traces:
                deployment = Deployment.objects.filter(pk=dep).first()
                if deployment is None:
                    continue
                traces[dep] = recorded_trace(deployment)
            stored += store_page(traces[dep], wid, page)
            if page["records"] and page["records"][-1]["seq"] < page["last"]:
                more.append((wid, dep, url, page["records"][-1]["seq"], page["started"]))
        pending = more
    removed = prune(live_gateways={wid for wid, _, _ in gateways})
    for (wid, dep), error in failed.items():
        log.info("trace pull: gateway %s, deployment %s: %s", wid, dep, error)
    return {"gateways": len(gateways), "stored": stored, "failed": len(failed), "pruned": removed}
