"""Alert rules as a Prometheus rule file over the workers' and gateways' own tandem_* series, for teams that run
Prometheus themselves (`promtool check rules` accepts it).

Series selection: a gateway labels its series `model="<deployment>"` (the served model name), so gateway-scoped rules
need nothing else. Worker series carry `model=<model folder>`, which does not name the deployment: the Prometheus
scrape config must add a `deployment` target label to worker targets (controlplane/alerting/README.md shows one).
The time aggregation of a gauge maps to `<agg>_over_time`; counters and histograms use `rate` over the rule's window.
"""
from __future__ import annotations

import json
import re

from controlplane.alerting.models import CONTROL_LOOP_METRIC, AlertRule
from controlplane.observability.telemetry import expected_intervals, stale_after_s

H = {"ttft": "tandem_time_to_first_token_seconds", "itl": "tandem_inter_token_latency_seconds",
     "e2e": "tandem_e2e_request_latency_seconds"}
QUANTILE = {"p50": "0.5", "p90": "0.9", "p99": "0.99"}
# Pool-level: the sum/avg of the instances of one role; per worker: one series per scrape target (`instance`).
GAUGES = {
    "requests_running": ("tandem_requests_running", "sum"),
    "requests_waiting": ("tandem_requests_waiting", "sum"),
    "kv_cache_usage_ratio": ("tandem_kv_cache_usage_ratio", "avg"),
    "gpu_utilization_ratio": ("tandem_gpu_utilization_ratio", "avg"),
    "gpu_memory_used_bytes": ("tandem_gpu_memory_used_bytes", "sum"),
    "gpu_temperature_celsius": ("tandem_gpu_temperature_celsius", "max"),
    "gpu_power_watts": ("tandem_gpu_power_watts", "sum"),
    "resident_memory_bytes": ("process_resident_memory_bytes", "sum"),
    "gpu_memory_fragmentation_bytes": ("tandem_gpu_memory_fragmentation_bytes", "sum"),
    "up": ("up", "avg"),
    "prefill_roofline_ratio": ("tandem_prefill_roofline_ratio", "avg"),
    "decode_roofline_ratio": ("tandem_decode_roofline_ratio", "avg"),
    # The control plane's own /metrics (labels deployment and role), not a worker's.
    "unschedulable_replicas": ("tandem_pool_unschedulable_replicas", "sum"),
}
COUNTERS = {
    "prompt_tokens_per_second": "tandem_prompt_tokens_total",
    "generation_tokens_per_second": "tandem_generation_tokens_total",
    "cpu_usage_ratio": "process_cpu_seconds_total",
    "prefix_cache_hit_tokens_per_second": "tandem_prefix_cache_hit_tokens_total",
}
OVER_TIME = {"avg": "avg_over_time", "max": "max_over_time", "min": "min_over_time", "sum": "sum_over_time",
             "count": "count_over_time"}


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: double quotes, backslash escapes


class _Query:
    def __init__(self, rule: AlertRule, deployment_name: str | None, offset_s: int | None = None):
        self.rule = rule
        self.window = f"[{rule.window_s}s]"
        self.offset = f" offset {offset_s}s" if offset_s else ""
        matchers = []
        if rule.role == "gateway":
            matchers.append('role="gateway"')
            if deployment_name:
                matchers.append(f"model={_quote(deployment_name)}")
        else:
            if rule.role:
                matchers.append(f"role={_quote(rule.role)}")
            else:
                matchers.append('role!="gateway"')
            if deployment_name:
                matchers.append(f"deployment={_quote(deployment_name)}")
        self.matchers = matchers
        by = ["instance", "role"] if rule.per_worker else ["role"]
        if not deployment_name:
            # A rule over every deployment keeps one series (one alert) per deployment.
            by.insert(0, "model" if rule.role == "gateway" else "deployment")
        self.by = ", ".join(by)

    def sel(self, metric: str, extra: str = "") -> str:
        matchers = ",".join(self.matchers + ([extra] if extra else []))
        return f"{metric}{{{matchers}}}"

    def rate(self, metric: str, extra: str = "") -> str:
        return f"rate({self.sel(metric, extra)}{self.window}{self.offset})"

    def sum_rate(self, metric: str, extra: str = "", by: str | None = None) -> str:
        return f"sum by ({by or self.by}) ({self.rate(metric, extra)})"

    def expr(self) -> str:
        from controlplane.observability.exposition import CLIENT_ERROR_KINDS

        metric, agg = self.rule.metric, self.rule.aggregation
        match = re.fullmatch(r"(ttft|itl|e2e)_(p50|p90|p99)_seconds", metric)
        if match:
            family, quantile = match.groups()
            return (f"histogram_quantile({QUANTILE[quantile]}, "
                    f"{self.sum_rate(H[family] + '_bucket', by='le, ' + self.by)})")
        requests = (f"({self.sum_rate('tandem_request_success_total')} + "
                    f"{self.sum_rate('tandem_request_errors_total')})")
        if metric == "qps":
            return requests
        if metric == "error_ratio":
            return f"({self.sum_rate('tandem_request_errors_total')} / {requests})"
        if metric == "server_error_ratio":
            client = "|".join(sorted(CLIENT_ERROR_KINDS))
            return f"({self.sum_rate('tandem_request_errors_total', f'kind!~{_quote(client)}')} / {requests})"
        if metric in COUNTERS:
            return self.sum_rate(COUNTERS[metric])
        if metric == "batch_tokens_per_step":
            return (f"({self.sum_rate('tandem_batch_tokens_per_step_sum')} / "
                    f"{self.sum_rate('tandem_batch_tokens_per_step_count')})")
        if metric == "prefix_cache_hit_ratio":
            return (f"({self.sum_rate('tandem_prefix_cache_hit_tokens_total')} / "
                    f"{self.sum_rate('tandem_prefix_cache_queried_tokens_total')})")
        if metric == "gpu_memory_used_ratio":
            return (f"(sum by ({self.by}) ({self._gauge('tandem_gpu_memory_used_bytes', agg)}) / "
                    f"sum by ({self.by}) ({self._gauge('tandem_gpu_memory_total_bytes', agg)}))")
        series, across = GAUGES[metric]
        return f"{across} by ({self.by}) ({self._gauge(series, agg)})"

    def _gauge(self, series: str, agg: str) -> str:
        if agg == "last":
            return f"{self.sel(series)}{self.offset}"
        return f"{OVER_TIME[agg]}({self.sel(series)}{self.window}{self.offset})"


def _tenant_expr(rule: AlertRule, deployment_name: str | None, offset_s: int | None = None) -> str:
    """A tenant's series come from the tandem_tenant: recording rules (observability/recording_rules.py), which
    pool the gateways' per-tenant series as the embedded store does."""
    matchers = [f"tenant={_quote(rule.tenant)}"]
    if deployment_name:
        matchers.append(f"deployment={_quote(deployment_name)}")
    offset = f" offset {offset_s}s" if offset_s else ""
    selector = f"tandem_tenant:{rule.metric}{{{', '.join(matchers)}}}"
    if rule.aggregation == "last":
        return f"{selector}{offset}"
    return f"{OVER_TIME[rule.aggregation]}({selector}[{rule.window_s}s]{offset})"


def _expr(rule: AlertRule, deployment_name: str | None, offset_s: int | None = None) -> str:
    if rule.tenant:
        return _tenant_expr(rule, deployment_name, offset_s)
    return _Query(rule, deployment_name, offset_s).expr()


def rule_promql(rule: AlertRule) -> str:
    deployment_name = rule.deployment.name if rule.deployment_id else None
    current = _expr(rule, deployment_name)
    if rule.compare_to_offset_s:
        earlier = _expr(rule, deployment_name, rule.compare_to_offset_s)
        current = f"({current} / {earlier})"
    return f"{current} {rule.comparison} {rule.threshold!r}"


def _alert_name(rule: AlertRule) -> str:
    # Prometheus shows alert names as metric-like identifiers; the Tandem name is kept as a label.
    name = re.sub(r"[^A-Za-z0-9_]", "_", rule.name)
    return name if re.match(r"[A-Za-z_]", name) else f"tandem_{name}"


def _yaml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # JSON strings are valid YAML double-quoted scalars


def control_loop_promql(rule: AlertRule) -> dict[str, str]:
    """{loop kind: expr}: a control-loop rule's staleness ratio, read from the control plane's own /metrics
    (tandem_controlplane_cycle_last_run_timestamp_seconds), for a Prometheus that scrapes the web process. A backstop
    for Tandem's own watchdog, which its web processes step: it fires even when every one of them is down."""
    return {str(kind): f"(time() - tandem_controlplane_cycle_last_run_timestamp_seconds{{kind={_quote(str(kind))}}})"
                       f" / {stale_after_s(interval):g} {rule.comparison} {rule.threshold!r}"
            for kind, interval in expected_intervals().items()}


def _rule_lines(alert: str, expr: str, rule: AlertRule, labels: dict) -> list[str]:
    lines = [f"      - alert: {alert}", f"        expr: {_yaml_str(expr)}"]
    if rule.for_s:
        lines.append(f"        for: {rule.for_s}s")
    if rule.keep_firing_for_s:
        lines.append(f"        keep_firing_for: {rule.keep_firing_for_s}s")
    lines.append("        labels:")
    for key, value in sorted(labels.items()):
        lines.append(f"          {key}: {_yaml_str(str(value))}")
    if rule.annotations:
        lines.append("        annotations:")
        for key, value in sorted(rule.annotations.items()):
            lines.append(f"          {key}: {_yaml_str(str(value))}")
    return lines


def prometheus_rule_file(rules) -> str:
    """One group `tandem` with an alerting rule per enabled Tandem rule (per control loop for a control-loop
    rule)."""
    lines = ["# Generated by Tandem (GET /api/v1/alert-rules/export?format=prometheus).", "groups:",
             "  - name: tandem", "    rules:"]
    for rule in rules:
        if not rule.enabled:
            continue
        labels = {**(rule.labels or {}), "severity": rule.severity, "tandem_rule": rule.name}
        if rule.metric == CONTROL_LOOP_METRIC:
            for loop, expr in control_loop_promql(rule).items():
                lines += _rule_lines(f"{_alert_name(rule)}_{loop}", expr, rule, {**labels, "loop": loop})
            continue
        if rule.deployment_id:
            labels["deployment"] = rule.deployment.name
        if rule.tenant:
            labels["tenant"] = rule.tenant
        lines += _rule_lines(_alert_name(rule), rule_promql(rule), rule, labels)
    if lines[-1] == "    rules:":
        lines[-1] = "    rules: []"
    return "\n".join(lines) + "\n"
