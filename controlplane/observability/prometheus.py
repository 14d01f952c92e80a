"""For operators who keep Prometheus and Grafana: the scrape targets as Prometheus HTTP service discovery, and a
Grafana dashboard per deployment with the panels of its Tandem page.

`sd_targets()` answers `http_sd_configs` (https://prometheus.io/docs/prometheus/latest/http_sd/): one group per
worker and gateway that Tandem itself scrapes (observability.store.scrape_targets: a process with a port, serving,
not a profile run's), labelled with what Tandem's queries need: `deployment`, `pool` (the role of its pool),
`revision` (its number), `node`, `worker` (its id), and for a worker `engine` (tandem or vllm: a vLLM worker's
series are renamed to Tandem's by the job's metric_relabel_configs, inference.engines.vllm.metrics.RELABEL_CONFIGS,
docs/engines.md). A shared gateway's process is a group per attached deployment, labelled `shared_gateway` too, and
scraped at `/metrics?deployment=NAME` (`__param_deployment`): that deployment's series alone, so that Prometheus reads
each series once per pass however many deployments the process serves (the whole page per group read each one once
per attached deployment, and dropped all but its own).
Workers label their own series `role` and `model`; Prometheus adds these, so
`tandem_time_to_first_token_seconds_bucket{deployment="demo", role="prefill"}` is one stage of one deployment.

`grafana_dashboard(name)` is a dashboard JSON (schemaVersion 39, the current Grafana releases' model) whose panels
are PromQL over those labels, with the Prometheus data source as a variable (`${datasource}`) so that it imports
into any Grafana. The expressions are checked by promtool in the tests (tests/controlplane/observability).
"""
from __future__ import annotations

from controlplane.observability.store import scrape_targets
from inference.engines import engine_of

SCHEMA_VERSION = 39
RATE = "$__rate_interval"


def sd_targets() -> list[dict]:
    """Prometheus HTTP SD groups: [{"targets": ["host:port"], "labels": {...}}], one per scraped process, and one per
    deployment attached to a shared gateway's process (the same address in each, labelled `shared_gateway` and that
    deployment, whose page it asks for; SHARED_GATEWAY_RELABEL_CONFIGS keeps a whole page, as a process started
    before it answered `?deployment=` serves, to that deployment's series)."""
    from controlplane.models import Worker

    targets = scrape_targets()
    models: dict[int, list[str]] = {}  # a shared gateway's process → the models (deployment names) it serves
    for target in targets:
        if target.model:
            models.setdefault(target.worker_id, []).append(target.model)
    rows = (Worker.objects.filter(pk__in=[target.worker_id for target in targets])
            .values_list("id", "host", "port", "role", "deployment__name", "revision__number", "node__name",
                         "revision__engine_settings", "shared_gateway__name")
            .order_by("deployment__name", "role", "id"))
    groups = []
    for worker_id, host, port, role, deployment, revision, node, engine_settings, shared in rows:
        labels = {"pool": role, "revision": "" if revision is None else str(revision), "node": node or "",
                  "worker": str(worker_id), **({"engine": engine_of(engine_settings)} if role != "gateway" else {})}
        if worker_id not in models:
            groups.append({"targets": [f"{host}:{port}"], "labels": {"deployment": deployment, **labels}})
            continue
        groups.extend({"targets": [f"{host}:{port}"],
                       "labels": {"deployment": name, **labels, "shared_gateway": shared, "__param_deployment": name}}
                      for name in sorted(models[worker_id]))
    return groups


# The scrape job's metric_relabel_configs for shared gateways (docs/prometheus.md): a shared gateway's group asks for
# its deployment's page, but a process started before `?deployment=` existed ignores the parameter and answers with
# the whole page, every attached deployment's series told apart by `model`; a series is kept in the group whose
# `deployment` its `model` names. The process's own series (no `model`) are kept in none, as the
# embedded scrape keeps them (exposition.model_page): per deployment they would be counted once for each. A target
# of one deployment (no `shared_gateway` label) compares its `deployment` with itself, so it keeps every series.
SHARED_GATEWAY_RELABEL_CONFIGS = [
    {"source_labels": ["shared_gateway", "deployment"], "regex": ";(.*)", "target_label": "__tmp_tandem_owner",
     "replacement": "$1"},
    {"source_labels": ["shared_gateway", "model"], "regex": "[^;]+;(.*)", "target_label": "__tmp_tandem_owner",
     "replacement": "$1"},
    {"action": "keepequal", "source_labels": ["__tmp_tandem_owner"], "target_label": "deployment"},
    {"action": "labeldrop", "regex": "__tmp_tandem_owner"},
]


def _q(quantile: float, metric: str, where: str, by: str = "role") -> str:
    return (f"histogram_quantile({quantile}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{where}}}[{RATE}])))")


def panels(deployment: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(title, unit, [(PromQL, legend)]) per panel, in the order of the deployment page."""
    d = f'deployment="{deployment}"'
    gateway = f'{d}, role="gateway"'
    workers = f'{d}, role!="gateway"'
    return [
        ("End-to-end latency (gateway)", "s", [
            (_q(0.5, "tandem_e2e_request_latency_seconds", gateway), "P50"),
            (_q(0.99, "tandem_e2e_request_latency_seconds", gateway), "P99")]),
        ("Time to first token by stage", "s", [
            (_q(0.5, "tandem_time_to_first_token_seconds", workers), "{{role}} P50"),
            (_q(0.99, "tandem_time_to_first_token_seconds", workers), "{{role}} P99")]),
        ("Inter-token latency by stage", "s", [
            (_q(0.5, "tandem_inter_token_latency_seconds", workers), "{{role}} P50"),
            (_q(0.99, "tandem_inter_token_latency_seconds", workers), "{{role}} P99")]),
        ("Requests per second (gateway)", "reqps", [
            (f"sum by (revision) (rate(tandem_request_success_total{{{gateway}}}[{RATE}]))", "ok r{{revision}}"),
            (f"sum by (kind) (rate(tandem_request_errors_total{{{gateway}}}[{RATE}]))", "error {{kind}}")]),
        ("Error ratio (gateway)", "percentunit", [
            (f"sum(rate(tandem_request_errors_total{{{gateway}}}[{RATE}])) / clamp_min("
             f"sum(rate(tandem_request_success_total{{{gateway}}}[{RATE}])) + "
             f"sum(rate(tandem_request_errors_total{{{gateway}}}[{RATE}])), 1e-9)", "errors")]),
        ("Generated tokens per second by stage", "short", [
            (f"sum by (role) (rate(tandem_generation_tokens_total{{{workers}}}[{RATE}]))", "{{role}}")]),
        ("Queue (requests waiting) by stage", "short", [
            (f"sum by (role) (tandem_requests_waiting{{{workers}}})", "{{role}} waiting"),
            (f"sum by (role) (tandem_requests_running{{{workers}}})", "{{role}} running")]),
        ("KV cache usage by stage", "percentunit", [
            (f"max by (role) (tandem_kv_cache_usage_ratio{{{workers}}})", "{{role}} (fullest worker)")]),
        ("GPU utilisation by stage", "percentunit", [
            (f"avg by (role) (tandem_gpu_utilization_ratio{{{workers}}})", "{{role}}")]),
        ("GPU memory used by stage", "bytes", [
            (f"sum by (role) (tandem_gpu_memory_used_bytes{{{workers}}})", "{{role}}")]),
        ("GPU temperature", "celsius", [
            (f"max by (role, gpu) (tandem_gpu_temperature_celsius{{{workers}}})", "{{role}} {{gpu}}")]),
        ("Prefix-cache hit rate", "percentunit", [
            (f"sum by (role) (rate(tandem_prefix_cache_hit_tokens_total{{{workers}}}[{RATE}])) / clamp_min("
             f"sum by (role) (rate(tandem_prefix_cache_queried_tokens_total{{{workers}}}[{RATE}])), 1e-9)",
             "{{role}}")]),
        ("Speculative acceptance", "percentunit", [
            (f"sum by (role) (rate(tandem_spec_decode_accepted_tokens_total{{{workers}}}[{RATE}])) / clamp_min("
             f"sum by (role) (rate(tandem_spec_decode_proposed_tokens_total{{{workers}}}[{RATE}])), 1e-9)",
             "{{role}}")]),
        ("Workers up", "short", [(f"sum by (pool) (up{{{d}}})", "{{pool}}")]),
    ]


def grafana_dashboard(deployment: str) -> dict:
    """An importable Grafana dashboard of one deployment (Dashboards → New → Import, or the HTTP API)."""
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    built = []
    for index, (title, unit, queries) in enumerate(panels(deployment)):
        built.append({
            "id": index + 1, "type": "timeseries", "title": title, "datasource": datasource,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}},
            "targets": [{"refId": chr(ord("A") + i), "datasource": datasource, "expr": expr, "legendFormat": legend,
                         "range": True} for i, (expr, legend) in enumerate(queries)],
        })
    return {
        "title": f"Tandem: {deployment}", "uid": f"tandem-{deployment}"[:40], "tags": ["tandem"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "timezone": "browser",
        "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "links": [], "panels": built,
    }


def recording_rules_for_check(deployment: str) -> str:
    """Every panel expression as a recording rule (Grafana's $__rate_interval as 1m): the file `promtool check
    rules` parses, which is how the tests check that each expression is valid PromQL."""
    lines = ["groups:", f"  - name: tandem-grafana-{deployment}", "    rules:"]
    for index, (_, _, queries) in enumerate(panels(deployment)):
        for number, (expr, _) in enumerate(queries):
            lines.append(f"      - record: tandem:panel_{index}_{number}")
            lines.append(f"        expr: '{expr.replace(RATE, '1m').replace(chr(39), chr(39) * 2)}'")
    return "\n".join(lines) + "\n"
