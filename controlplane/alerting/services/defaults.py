"""The rules every new deployment gets (thresholds from the issue's seeds). Ordinary rules afterwards: edit or
disable them like any other. Named `<deployment>:<key>`, marked with `default_key`.

Deployment-level conditions (latency, errors, QPS) read the gateway's series: its client-side view is what users
see. GPU conditions read each pool. "Worker down" reads `up` per worker: the scraper stores up=0 for a failed
scrape, and for a worker supervision left `failed` while it keeps its slot (observability.store.failed_targets),
so `max(up[30s]) < 1` means no scrape of that worker succeeded for 30 s, and a failed worker keeps the alert firing
until it is ready again, stopped or replaced. A worker without any sample (not scraped yet, or stopped) is no data
and does not fire: restarting it is not this rule's business. "Unschedulable" reads the control plane's own count
of a pool's workers that no node can take.

Stage rules watch each stage on its own terms: a spec with `stage` reads the prefill (or decode) pool of a
disaggregated deployment and the colocated pool otherwise. A spec with `objective` takes its threshold from the
deployment's objectives (Deployment.objectives): at creation, and again whenever the objectives are saved
(`on_deployment_saved`), so a threshold stays a plain number that evaluation and the Prometheus export read as is.
An admin may still edit such a threshold; the next change of that objective sets it again.
"""
from __future__ import annotations

import logging

from django.db import transaction

from controlplane.alerting.models import AlertRule
from controlplane.models.deployments import DEFAULT_OBJECTIVES, DeploymentMode

log = logging.getLogger(__name__)

NOTIFY_ALL = {"type": "notify"}  # no channel list: every enabled channel
SCALE_UP = {"type": "scale", "direction": "up", "step": 1}

DEFAULT_RULES: tuple[dict, ...] = (
    {"key": "p99-latency", "metric": "e2e_p99_seconds", "role": "gateway", "aggregation": "last", "window_s": 60,
     "comparison": ">", "objective": "e2e_p99_seconds", "for_s": 60, "severity": "warning", "actions": [NOTIFY_ALL],
     "summary": "P99 end-to-end latency of {{ $labels.deployment }} is {{ $value }} s, over its objective"},
    {"key": "gpu-utilization", "metric": "gpu_utilization_ratio", "role": "", "aggregation": "min",
     "window_s": 60, "comparison": ">", "threshold": 0.95, "for_s": 300, "severity": "warning",
     "actions": [SCALE_UP, NOTIFY_ALL],
     "summary": "GPU utilisation of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} (> 95%)"},
    {"key": "gpu-memory", "metric": "gpu_memory_used_ratio", "role": "", "aggregation": "min", "window_s": 60,
     "comparison": ">", "threshold": 0.9, "for_s": 300, "severity": "warning", "actions": [SCALE_UP, NOTIFY_ALL],
     "summary": "GPU memory of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} used (> 90%)"},
    {"key": "error-ratio", "metric": "error_ratio", "role": "gateway", "aggregation": "last", "window_s": 60,
     "comparison": ">", "threshold": 0.01, "for_s": 60, "severity": "warning", "actions": [NOTIFY_ALL],
     "summary": "{{ $value }} of the requests of {{ $labels.deployment }} fail (> 1%)"},
    {"key": "server-error-ratio", "metric": "server_error_ratio", "role": "gateway", "aggregation": "last",
     "window_s": 60, "comparison": ">", "threshold": 0.005, "for_s": 60, "severity": "critical",
     "actions": [NOTIFY_ALL],
     "summary": "{{ $value }} of the requests of {{ $labels.deployment }} end in a server error (> 0.5%)"},
    {"key": "qps-drop", "metric": "qps", "role": "gateway", "aggregation": "avg", "window_s": 600,
     "compare_to_offset_s": 3600, "comparison": "<", "threshold": 0.7, "for_s": 300, "severity": "warning",
     "actions": [NOTIFY_ALL],
     "summary": "QPS of {{ $labels.deployment }} is {{ $value }} × its level an hour ago (down more than 30%)"},
    {"key": "worker-down", "metric": "up", "role": "", "per_worker": True, "aggregation": "max", "window_s": 30,
     "comparison": "<", "threshold": 1, "for_s": 30, "severity": "critical",
     "actions": [{"type": "restart"}, NOTIFY_ALL],
     "summary": "worker {{ $labels.worker }} ({{ $labels.role }}) of {{ $labels.deployment }} is down: it failed or "
                "answers no scrape"},
    {"key": "unschedulable", "metric": "unschedulable_replicas", "role": "", "aggregation": "min", "window_s": 30,
     "comparison": ">", "threshold": 0, "for_s": 30, "severity": "warning", "actions": [NOTIFY_ALL],
     "summary": "{{ $value }} workers of the {{ $labels.role }} pool of {{ $labels.deployment }} cannot be placed "
                "on any node (see the pool's status)"},
    # Per stage. TTFT is the prefill stage's latency as its workers measure it, ITL the decode stage's.
    {"key": "prefill-ttft", "metric": "ttft_p99_seconds", "stage": "prefill", "aggregation": "last",
     "window_s": 60, "comparison": ">", "objective": "ttft_p99_seconds", "for_s": 60, "severity": "warning",
     "actions": [NOTIFY_ALL],
     "summary": "P99 time to first token of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} s, "
                "over its objective"},
    {"key": "decode-itl", "metric": "itl_p99_seconds", "stage": "decode", "aggregation": "last", "window_s": 60,
     "comparison": ">", "objective": "itl_p99_seconds", "for_s": 60, "severity": "warning", "actions": [NOTIFY_ALL],
     "summary": "P99 inter-token latency of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} s, "
                "over its objective"},
    {"key": "decode-tokens-drop", "metric": "generation_tokens_per_second", "stage": "decode", "aggregation": "avg",
     "window_s": 600, "compare_to_offset_s": 3600, "comparison": "<", "threshold": 0.7, "for_s": 300,
     "severity": "warning", "actions": [NOTIFY_ALL],
     "summary": "Generated tokens/s of the {{ $labels.role }} pool of {{ $labels.deployment }} are {{ $value }} × "
                "their level an hour ago (down more than 30%)"},
    # Every pool that holds a KV cache: the one that is full gets a replica (pool_scale_by keeps max_replicas).
    {"key": "kv-usage", "metric": "kv_cache_usage_ratio", "role": "", "aggregation": "min", "window_s": 60,
     "comparison": ">", "threshold": 0.9, "for_s": 300, "severity": "warning", "actions": [SCALE_UP, NOTIFY_ALL],
     "summary": "KV cache of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} used (> 90% for "
                "5 minutes)"},
    # Each stage against its host's roofline (inference.roofline): a wrong dtype, a noisy neighbour, a throttled CPU
    # or GPU. Thresholds far below what a healthy CPU worker reaches (SmolLM2, one thread, a busy AVX512 host:
    # prefill 0.45-0.71 of the matmul peak, single-stream decode 0.11-0.19 of the bandwidth limit, its step bound
    # by per-step overhead), so that a healthy demo never fires; no figure (an unmeasured host) is no data.
    {"key": "prefill-roofline", "metric": "prefill_roofline_ratio", "stage": "prefill", "aggregation": "max",
     "window_s": 60, "comparison": "<", "threshold": 0.2, "for_s": 300, "severity": "warning",
     "actions": [NOTIFY_ALL],
     "summary": "Prefill of the {{ $labels.role }} pool of {{ $labels.deployment }} runs at {{ $value }} of its host's "
                "matmul peak (< 20% for 5 minutes): a dtype the CPU does not compute natively, a busy or throttled "
                "host?"},
    {"key": "decode-roofline", "metric": "decode_roofline_ratio", "stage": "decode", "aggregation": "max",
     "window_s": 60, "comparison": "<", "threshold": 0.05, "for_s": 300, "severity": "warning",
     "actions": [NOTIFY_ALL],
     "summary": "Decode of the {{ $labels.role }} pool of {{ $labels.deployment }} runs at {{ $value }} of its host's "
                "bandwidth limit (< 5% for 5 minutes): a busy or throttled host, or a batch too large for it?"},
)
# default_key → the objective its threshold follows.
OBJECTIVE_RULES = {spec["key"]: spec["objective"] for spec in DEFAULT_RULES if "objective" in spec}


def stage_role(stage: str, mode: str) -> str:
    """The pool that runs a stage: itself in a disaggregated deployment, the colocated pool otherwise."""
    return stage if mode == DeploymentMode.DISAGGREGATED else "colocated"


def objective_of(deployment, name: str) -> float:
    return float((deployment.objectives or {}).get(name, DEFAULT_OBJECTIVES[name]))


def rule_fields(spec: dict, deployment) -> dict:
    """The AlertRule fields of a default spec for one deployment (its stage's role, its objective's threshold)."""
    fields = {k: v for k, v in spec.items() if k not in ("key", "summary", "stage", "objective")}
    if "stage" in spec:
        fields["role"] = stage_role(spec["stage"], deployment.mode)
    if "objective" in spec:
        fields["threshold"] = objective_of(deployment, spec["objective"])
    return fields


def default_rules_create(*, deployment) -> list[AlertRule]:
    """Insert the default rules of `deployment` (those it already has are left alone)."""
    have = set(AlertRule.objects.filter(deployment=deployment).values_list("default_key", flat=True))
    rules = []
    for spec in DEFAULT_RULES:
        if spec["key"] in have:
            continue
        fields = rule_fields(spec, deployment)
        rules.append(AlertRule(name=f"{deployment.name}:{spec['key']}", deployment=deployment,
                               default_key=spec["key"], annotations={"summary": spec["summary"]},
                               cooldown_s=300, **fields))
    with transaction.atomic():
        AlertRule.objects.bulk_create(rules, ignore_conflicts=True)
    return rules


def objective_thresholds_sync(*, deployment) -> int:
    """Set the threshold of each rule that follows an objective to that objective; returns the rules changed."""
    num_updated = 0
    for key, objective in OBJECTIVE_RULES.items():
        num_updated += (AlertRule.objects.filter(deployment=deployment, default_key=key)
                        .exclude(threshold=objective_of(deployment, objective))
                        .update(threshold=objective_of(deployment, objective)))
    return num_updated


def on_deployment_saved(sender, instance, created: bool, raw: bool = False, update_fields=None, **kwargs) -> None:
    """post_save of Deployment, in the writer's transaction: a new deployment gets its default rules; a save of
    its objectives moves the thresholds that follow them."""
    if raw:
        return
    if created:
        default_rules_create(deployment=instance)
    elif update_fields is not None and "objectives" in update_fields:
        objective_thresholds_sync(deployment=instance)
