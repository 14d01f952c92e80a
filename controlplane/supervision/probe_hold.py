"""The health pass's guard against restart storms: when many probes time out at once on hosts whose agents are alive,
the prober (an overloaded control plane) or its network is the likely cause, not the workers, so that pass counts
none of those timeouts and restarts no one for them.

Why: restarting a worker that is slow to answer /health does not make the host or the prober faster; it throws away the
worker's requests and KV, and its new start loads the host more. On the simulated fleet bench (1,000 workers, Prometheus
and the control plane on 2 cores) a pass's probes timed out for a sizeable share of the ready workers, and three such
passes in a row restarted hundreds of workers that were all alive (SocketTimeoutError): the fleet's ready workers shrank
instead of growing to 1,000 (docs/performance.md, 'Control plane at scale'). Kubernetes' node controller makes the same
call for nodes (it slows, then stops, evictions when a large share of a zone is unhealthy at once).

The rule (settings TANDEM_HEALTH_HOLD_PCT, TANDEM_HEALTH_HOLD_MIN): a pass holds when the ready workers whose probe
timed out, on nodes whose agent has beaten within TANDEM_NODE_OFFLINE_AFTER_S, number at least HOLD_MIN and at least
HOLD_PCT % of the ready workers it probed. What still counts in a held pass: an answer that says unhealthy (HTTP
5xx), a refused connection (nothing listens: the host is up and the process is not), and every failure on a node
whose agent went quiet (a host gone: its workers are restarted elsewhere, which is the health pass's job), unless
the agents of most of the fleet's nodes went quiet at once: then their heartbeats are the likely casualty of the same
overload (on the bench above every simulated node's heartbeat lagged by minutes), and all count as live. A dead
process is the agent's heartbeat to report in any case; a hold only delays restarting processes that live but do
not answer in time.

An operator sees a hold as a running `hold` action (the audit log, the pages' action lists) from the first held pass
until the first pass that does not hold, and as a problem on /healthz (controlplane.selectors.health_hold_get).
"""
from __future__ import annotations

import logging
import math

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.models import Action, ActionKind, ActionStatus, Worker

log = logging.getLogger(__name__)


def online_node_ids(workers: list[Worker]) -> set[int]:
    """The ids of the nodes (of these workers) whose agent has beaten within TANDEM_NODE_OFFLINE_AFTER_S."""
    from controlplane.supervision.placement import online_nodes

    ids = {worker.node_id for worker in workers if worker.node_id is not None}
    return set(online_nodes().filter(id__in=ids).values_list("id", flat=True))


def hold_threshold(num_ready: int) -> int:
    """How many timed-out probes of live hosts' ready workers make a pass over `num_ready` of them hold."""
    return max(settings.TANDEM_HEALTH_HOLD_MIN, math.ceil(settings.TANDEM_HEALTH_HOLD_PCT * num_ready / 100))


def held_ids(ready: list[Worker], timed_out: list[int]) -> set[int]:
    """The ids of `timed_out` (ready workers whose probe timed out this pass) whose failures this pass must not
    count: all of those on live nodes when they reach hold_threshold(len(ready)), else none."""
    if len(timed_out) < settings.TANDEM_HEALTH_HOLD_MIN:
        return set()
    node_of = {worker.id: worker.node_id for worker in ready}
    nodes = {node for node in node_of.values() if node is not None}
    live = online_node_ids(ready)
    if len(nodes) > 1 and 2 * len(live) < len(nodes):
        # Most hosts' agents quiet at once: their heartbeats (the broker, the database) are the likely casualty of
        # the same overload, not the hosts. Nothing tells a host gone from the others then; count them all as live.
        live = nodes
    on_live = {worker_id for worker_id in timed_out if node_of.get(worker_id) in live}
    return on_live if len(on_live) >= hold_threshold(len(ready)) else set()


def record_pass(*, num_ready: int, held: set[int]) -> None:
    """Open the running `hold` action on the first held pass, note the latest held pass on it, and close it on the
    first pass that does not hold. One row per storm, not one per pass."""
    from controlplane.services.actions import action_create, action_params_update, action_succeed
    from controlplane.services.restarts import SUPERVISOR

    now = timezone.now()
    with transaction.atomic():
        running = (Action.objects.select_for_update().filter(kind=ActionKind.HOLD, status=ActionStatus.RUNNING)
                   .order_by("-id").first())
        if held:
            share = 100 * len(held) / max(num_ready, 1)
            latest = {"at": now.isoformat(), "timed_out": len(held), "ready": num_ready}
            if running is None:
                reason = (f"health probes of {len(held)} of {num_ready} ready workers ({share:.0f} %) on live hosts "
                          f"timed out in one pass: the prober or its network is the likely cause, so no restarts "
                          f"for timeouts until a pass sees fewer than {hold_threshold(num_ready)}")
                action_create(kind=ActionKind.HOLD, actor=SUPERVISOR, reason=reason, status=ActionStatus.RUNNING,
                              params={"first": latest, "latest": latest, "held_passes": 1})
                log.warning("health: %s", reason)
            else:
                params = dict(running.params or {})
                params.update(latest=latest, held_passes=int(params.get("held_passes", 0)) + 1)
                action_params_update(action_id=running.id, params=params)
            return
        if running is not None:
            passes = int((running.params or {}).get("held_passes", 0))
            action_succeed(action_id=running.id,
                           result={"released_at": now.isoformat(), "held_passes": passes, "ready": num_ready})
            log.warning("health: restarts for timed-out probes resume after %d held passes", passes)

