"""What a node agent does, at its start, about the faults its predecessor carried (controlplane/agent/faults.py).

The control faults an agent injects (an agent kill, a broker freeze) and a disk fill outlive the agent process that
holds their deadlines: the agent that starts next writes their revert rows, thaws what no revert can reach, and holds
a fill again until its deadline.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.utils import timezone

from controlplane.agent import control_faults, resource_faults
from controlplane.agent.fault_kinds import KINDS, Family, kinds_of
from controlplane.agent.fault_holds import FAULT_KIND, is_held, record, reverted_key
from controlplane.agent.faults import hold, release
from controlplane.models import Action, ActionStatus
from controlplane.services.actions import action_find

log = logging.getLogger(__name__)


def faults_resume_after_restart(*, node_name: str, adopted: dict | None = None) -> list[str]:
    """After this node's agent started (again): the control faults its predecessor carried and nobody reverted get
    their revert rows now. An agent_kill is over (this agent is its restart: `restarted`, with the workers adopted);
    a broker freeze is thawed at once (its timer died with the old agent, and no revert can come through a frozen
    broker). A disk_fill's file (which has no deadline of its own) is held again until its deadline, or deleted now
    when that has passed. Returns the keys reverted or held again."""
    since = timezone.now() - timedelta(days=1)
    rows = Action.objects.filter(created_at__gte=since, kind=FAULT_KIND, status=ActionStatus.SUCCEEDED,
                                 params__event="fault_injected",
                                 params__fault__in=(*kinds_of(Family.CONTROL), "disk_fill"),
                                 result__node=node_name).select_related("worker", "deployment")
    resumed = []
    for row in rows:
        key = (row.idempotency_key or "").removesuffix(":injected")
        if not key or action_find(reverted_key(key)) is not None:
            continue
        fault = row.params["fault"]
        held_control = KINDS[fault].family == Family.CONTROL and KINDS[fault].held  # a freeze, a throttle
        if held_control and release(key, "the agent's restart") is not None:
            resumed.append(key)  # held by this very process (a simulated agent's restart): released, row written
            continue
        audit = {k: v for k, v in (row.params or {}).items() if k not in ("event", "worker")}
        state = row.result or {}
        if fault == "disk_fill":
            if is_held(key):
                continue  # held by this very process
            if state.get("until", 0) > time.time():
                hold(key, handle=None, until=state["until"], worker_id=row.worker_id, audit=audit, kind=fault,
                     state=state)
                log.info("fault %s (disk_fill) of node %s: held again until %.1f", key, node_name, state["until"])
                resumed.append(key)
                continue
            outcome, extra = resource_faults.fill_remove(key=key, state=state), {}
        elif fault == "agent_kill":
            outcome = "restarted"
            extra = {"adopted": (adopted or {}).get("adopted", []),
                     "down_s": round((timezone.now() - row.created_at).total_seconds(), 3)}
        else:
            outcome, extra = control_faults.freeze_stop(key=key, state=state), {}
        record(kind=FAULT_KIND, key=reverted_key(key), worker=row.worker, event="fault_reverted", audit=audit,
                outcome=outcome, by="the agent's restart", **extra)
        log.info("fault %s (%s) of node %s: %s at the agent's restart", key, fault, node_name, outcome)
        resumed.append(key)
    return resumed
