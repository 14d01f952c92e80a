"""What a run breaks: the workers it targets (chosen at run start from the ready workers of the fleet), whether the
pools keep enough of them to serve meanwhile, and the node agent's messages that carry out each fault on them. Reads
of the fleet only; the run's rows are written by services.py."""
from __future__ import annotations

import math
import random

from controlplane.agent.fault_kinds import kinds_of
from controlplane.chaos import fault_checks
from controlplane.errors import ControlPlaneError, conflict
from controlplane.models import Deployment, Node, Worker, WorkerPurpose, WorkerStatus

# Faults of a node rather than of a worker: sent once per node of the targets.
NODE_KINDS = kinds_of(node_level=True)


def run_targets(deployment: Deployment, target: dict) -> list[dict]:
    """The workers a run breaks: ready serving workers with a live process, of the role and on the node the target
    names (a node target: all its workers unless count or percent), `count` of them or `percent` (rounded up, at
    least one), chosen at random. 409 when there are fewer ready workers."""
    workers = Worker.objects.filter(deployment=deployment, purpose=WorkerPurpose.SERVING, status=WorkerStatus.READY,
                                    pid__isnull=False, node__isnull=False).select_related("node")
    for key, lookup in (("role", "role"), ("node", "node__name"), ("revision", "revision__number")):
        if key in target:
            workers = workers.filter(**{lookup: target[key]})
    workers = list(workers)
    wanted = target.get("count") or max(1, math.ceil(len(workers) * target.get("percent", 100) / 100))
    if len(workers) < wanted:
        of = f" of revision {target['revision']}" if "revision" in target else ""
        where = f"the {target['role']} role of {deployment.name!r}" if "role" in target else repr(deployment.name)
        on = f" on node {target['node']!r}" if "node" in target else ""
        raise conflict(f"{where} has {len(workers)} ready worker(s){of}{on}; the experiment targets {wanted}")
    chosen = sorted(random.sample(workers, wanted), key=lambda w: w.pk)
    return [{"worker": w.pk, "role": w.role, "node": w.node.name, "queue": w.node.queue, "pid": w.pid}
            for w in chosen]


# Faults whose target leaves the ready workers at once (it exits; the agent restarts it): a pool whose every ready
# worker is a target has no survivor to serve meanwhile. A pause or a partition leaves the row ready until health
# checks fail, and a short one never does.
OUT_OF_SERVICE_KINDS = kinds_of(out_of_service=True)


def check_survivors(deployment: Deployment, spec: dict, targets: list[dict]) -> None:
    """409 `no_survivor` where the faults take out so many of a role's ready workers that a `ready_workers` check of
    the hypothesis cannot hold while they last (a decode kill on a pool of one: every stream breaks, every request
    gets a 503 until the worker is back): the experiment needs a bigger pool first."""
    if not any(fault["kind"] in OUT_OF_SERVICE_KINDS for fault in spec["faults"]):
        return
    for check in spec["hypothesis"]:
        if check.get("metric") != "ready_workers" or "min" not in check:
            continue
        role = check["role"]
        taken = sum(1 for target in targets if target["role"] == role)
        ready = Worker.objects.filter(deployment=deployment, purpose=WorkerPurpose.SERVING, role=role,
                                      status=WorkerStatus.READY).count()
        if taken and ready - taken < check["min"]:
            raise ControlPlaneError(
                f"the {role} pool of {deployment.name!r} has {ready} ready worker(s) and the experiment takes {taken} "
                f"of them out, leaving {ready - taken}; its hypothesis needs at least {check['min']:g} ready "
                f"(ready_workers): scale the {role} pool to {taken + int(check['min'])} or more first",
                status=409, code="no_survivor", extra={"role": role, "ready": ready, "targets": taken})


def fault_messages(spec: dict, targets: list[dict], carriers: dict[str, Node | None]) -> list[dict]:
    """One agent message per (fault, target), with the queue of the agent that carries it out: the target's node's;
    a node-level fault (NODE_KINDS) once per node, by the agent of that node's first target (a second agent_kill
    would kill the restarted agent, a second hog double the load asked of the host); a broker_freeze or a db_slow
    once in all, by its carrier's agent (fault_checks.broker_freeze_carrier, db_slow_carrier), its target the first
    (the deployment's, for the audit)."""
    faults = []
    for fault in spec["faults"]:
        chosen = targets
        if fault["kind"] in NODE_KINDS:
            chosen, nodes = [], set()
            for target in targets:
                if target["node"] not in nodes:
                    nodes.add(target["node"])
                    chosen.append(target)
        params = fault_checks.fault_params(fault)
        if fault["kind"] in carriers:
            carrier = carriers[fault["kind"]]
            chosen, params = [{**targets[0], "queue": carrier.queue}], {**params, "node": carrier.name}
        faults += [{"key": "", "kind": fault["kind"], "worker": t["worker"], "queue": t["queue"],
                    "duration_s": fault.get("duration_s"), "params": params} for t in chosen]
    return faults
