"""The built-in experiment templates: the faults an operator of an inference fleet tries first, each with the
hypothesis Tandem claims to keep under it (no client error past 0.5 %, TTFT P99 at most 1.5x its value before the
fault, a ready worker left in the target's pool) and an abort at 5 % errors held for 10 s.

A template is not a row: creating an experiment from one (services.experiment_from_template) fills in its target
role, count and duration, and the result is an ordinary experiment, validated as any other and editable after."""
from __future__ import annotations

from dataclasses import dataclass

from controlplane.errors import invalid
from controlplane.models import WorkerRole


@dataclass(frozen=True, slots=True)
class Template:
    key: str
    title: str
    description: str
    role: str  # the target role it is written for; the admin may pick another of the deployment's roles
    faults: tuple[dict, ...]
    duration_s: float = 30.0


TEMPLATES = (
    Template("decode-kill", "Kill a decode worker",
             "SIGKILL one decode worker under load: its streams migrate, supervision restarts it.",
             WorkerRole.DECODE, ({"kind": "kill"},), 30),
    Template("prefill-kill", "Kill a prefill worker",
             "SIGKILL one prefill worker: requests before their first token are retried on another.",
             WorkerRole.PREFILL, ({"kind": "kill"},), 30),
    Template("gateway-kill", "Kill the gateway",
             "SIGKILL the deployment's gateway: how long clients are refused until it is back.",
             WorkerRole.GATEWAY, ({"kind": "kill"},), 30),
    Template("decode-hang", "Hang a decode worker",
             "SIGSTOP one decode worker for the duration, then SIGCONT: its streams must move on.",
             WorkerRole.DECODE, ({"kind": "pause"},), 30),
    Template("prefill-hang", "Hang a prefill worker",
             "SIGSTOP one prefill worker for the duration: new prompts must avoid it.",
             WorkerRole.PREFILL, ({"kind": "pause"},), 30),
    Template("decode-slow-tokens", "Slow decode steps",
             "50 ms added before every streamed token of one decode worker (a slow GPU, a noisy neighbour).",
             WorkerRole.DECODE, ({"kind": "latency", "ms": 1, "line_ms": 50},), 60),
    Template("prefill-slow", "Slow prefill",
             "500 ms added before every request to one prefill worker.",
             WorkerRole.PREFILL, ({"kind": "latency", "ms": 500},), 60),
    Template("decode-errors", "Decode engine answers errors",
             "Half the generation requests of one decode worker answered 500: retries must hide them.",
             WorkerRole.DECODE, ({"kind": "error", "ratio": 0.5},), 60),
    Template("prefill-errors", "Prefill engine answers errors",
             "Every generation request of one prefill worker answered 500 before its first token.",
             WorkerRole.PREFILL, ({"kind": "error", "ratio": 1.0},), 60),
    Template("decode-connection-reset", "Connections to a decode worker cut",
             "Half the connections to one decode worker closed without an answer.",
             WorkerRole.DECODE, ({"kind": "reset", "ratio": 0.5},), 60),
    Template("decode-partition", "Partition a decode worker",
             "Every connection to one decode worker, health checks included, held unanswered: the gateway must "
             "keep it out of rotation.",
             WorkerRole.DECODE, ({"kind": "partition"},), 30),
    Template("kv-push-corrupt", "Corrupt the KV push",
             "Bytes flipped in every KV push to one decode worker: refused by its checksum, retried elsewhere, "
             "never answered with garbage.",
             WorkerRole.DECODE, ({"kind": "kv_corrupt", "ratio": 1.0, "bytes": 4},), 60),
    Template("kv-push-slow", "Slow the KV push",
             "200 ms added to every KV push from prefill to one decode worker (a congested link between stages).",
             WorkerRole.DECODE, ({"kind": "kv_latency", "ms": 200},), 60),
    Template("cpu-hog", "CPU hog on a worker's host",
             "Four busy processes on the host of one decode worker.",
             WorkerRole.DECODE, ({"kind": "cpu_hog", "workers": 4},), 60),
    Template("memory-pressure", "Memory pressure on a worker's host",
             "512 MiB allocated and held on the host of one decode worker.",
             WorkerRole.DECODE, ({"kind": "memory_pressure", "mib": 512},), 60),
    Template("gpu-memory", "GPU memory held on a worker's GPU",
             "1024 MiB allocated and held on the GPU of one decode worker (another tenant's job): the worker must "
             "keep serving on what its own allocations left it. A node without a GPU refuses it.",
             WorkerRole.DECODE, ({"kind": "gpu_memory", "mib": 1024},), 60),
    Template("disk-fill", "Disk nearly full under var/",
             "One file under the var/ folder of one decode worker's host, as large as leaves 64 MiB free there (at "
             "most TANDEM_CHAOS_DISK_FILL_MAX_MIB, 4096 MiB by default): logs, the filesystem broker and new files "
             "must cope.",
             WorkerRole.DECODE, ({"kind": "disk_fill", "free_mib": 64},), 60),
    Template("broker-freeze", "Freeze the control plane's broker",
             "The Celery broker hangs (accepts, passes nothing) for the duration, then comes back: the data plane "
             "must keep serving while the control plane cannot reach its agents.",
             WorkerRole.DECODE, ({"kind": "broker_freeze"},), 60),
    Template("agent-kill", "Kill a node agent",
             "SIGKILL the node agent of one decode worker's host: its supervisor starts it again, which adopts the "
             "workers (never restarts them); they keep serving meanwhile.",
             WorkerRole.DECODE, ({"kind": "agent_kill"},), 30),
    Template("db-slow", "Slow the control plane's database",
             "Every statement of the control plane's database waits: its server stopped 50 ms out of every 100 ms "
             "(SQLite: its write lock held so), for the duration: the data plane must keep serving, and the "
             "control plane catch up after.",
             WorkerRole.DECODE, ({"kind": "db_slow", "ms": 50},), 60),
)
BY_KEY = {template.key: template for template in TEMPLATES}


def template_get(key) -> Template:
    template = BY_KEY.get(key) if isinstance(key, str) else None
    if template is None:
        raise invalid(f"template {key!r} is not a built-in template; known: {', '.join(BY_KEY)}", field="template")
    return template


def template_fields(template: Template, *, role: str, count, duration_s, node=None) -> dict:
    """The fields of an experiment made from `template` against `role`, on `node` when one is given (experiment_create
    validates them)."""
    # The deployment's own failures (5xx, broken streams), not its callers' mistakes (a missing key, a request over
    # its tenant's quota: 4xx): a client's error must not block a chaos run, nor abort one (docs/chaos.md).
    hypothesis = [{"metric": "server_error_ratio", "max": 0.005, "window_s": 10},
                  {"metric": "ttft_p99_seconds", "max_baseline_ratio": 1.5, "window_s": 10}]
    if role != WorkerRole.GATEWAY:
        hypothesis.append({"metric": "ready_workers", "role": role, "min": 1})
    return {"description": f"{template.title} (template {template.key}): {template.description}",
            "target": {"role": role, "count": count, **({"node": node} if node is not None else {})},
            "faults": [dict(fault) for fault in template.faults],
            "duration_s": duration_s, "hypothesis": hypothesis,
            "abort_conditions": [{"metric": "server_error_ratio", "above": 0.05, "window_s": 5, "for_s": 10}],
            "recovery_timeout_s": 120}
