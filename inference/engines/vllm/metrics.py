"""A vLLM worker's /metrics page in Tandem's series names (docs/engines.md has the table).

The control plane's scraper keeps Tandem's families only (controlplane/observability/exposition.py); a vLLM page is
first turned into them here, so that the deployment page, alert rules, the autoscaler, chaos hypotheses, canary
analysis and capacity profiles read a vLLM worker exactly as a Tandem one. Prometheus does the same with the
relabelling rules `RELABEL_CONFIGS` (the control plane's http_sd labels each vLLM target `engine="vllm"`).

What differs, and stays so: vLLM's histograms keep their own buckets (a quantile over a pool whose workers run both
engines, during a canary between engines, mixes two bucket layouts); `requests_waiting` counts vLLM's own queue (the
gateway's queue is the gateway's series, as for Tandem workers); and process_* series are those of vLLM's API server
process, not of its engine-core child, so a vLLM worker's CPU and memory are under-counted.
"""
from __future__ import annotations

# vLLM family -> Tandem family. Histograms are renamed with their _bucket/_sum/_count samples.
FAMILIES = {
    "vllm:time_to_first_token_seconds": "tandem_time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds": "tandem_inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds": "tandem_e2e_request_latency_seconds",
    "vllm:num_requests_running": "tandem_requests_running",
    "vllm:num_requests_waiting": "tandem_requests_waiting",
    # Despite its name, a ratio in 0..1 (1 = every KV block in use).
    "vllm:kv_cache_usage_perc": "tandem_kv_cache_usage_ratio",
    "vllm:prompt_tokens": "tandem_prompt_tokens",
    "vllm:generation_tokens": "tandem_generation_tokens",
    "vllm:prefix_cache_queries": "tandem_prefix_cache_queried_tokens",
    "vllm:prefix_cache_hits": "tandem_prefix_cache_hit_tokens",
    "vllm:num_preemptions": "tandem_preemptions",
    "vllm:iteration_tokens_total": "tandem_batch_tokens_per_step",
}
# vllm:request_success_total counts every finished request by its reason; Tandem counts successes and errors apart.
SUCCESS = "vllm:request_success_total"
ERROR_KINDS = {"abort": "client_disconnected", "error": "engine"}
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "")


def _split(line: str) -> tuple[str, str]:
    """(name, the rest: labels and value) of a sample line."""
    cut = len(line)
    for sep in ("{", " ", "\t"):
        index = line.find(sep)
        if index != -1:
            cut = min(cut, index)
    return line[:cut], line[cut:]


def _tandem_name(name: str) -> str | None:
    for suffix in _SUFFIXES:
        if suffix and not name.endswith(suffix):
            continue
        family = FAMILIES.get(name[:len(name) - len(suffix)] if suffix else name)
        if family is not None:
            return family + suffix
    return None


def translate(text: str) -> str:
    """The page with vLLM's families renamed to Tandem's (and TYPE lines to match); process_* kept; the rest
    dropped. Text that holds no vLLM series is returned unchanged (a Tandem worker's, or a gateway's)."""
    if "vllm:" not in text:
        return text
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            renamed = _tandem_name(parts[2]) if len(parts) == 4 else None
            if renamed is not None:
                out.append(f"# TYPE {renamed} {parts[3]}")
            elif len(parts) == 4 and parts[2] == SUCCESS:
                out += ["# TYPE tandem_request_success counter", "# TYPE tandem_request_errors counter"]
            elif len(parts) == 4 and parts[2].startswith("process_"):
                out.append(line)
            continue
        if not line or line.startswith("#"):
            continue
        name, rest = _split(line)
        if name.startswith("process_"):
            out.append(line)
        elif name == SUCCESS:
            reason = _label(rest, "finished_reason")
            if reason in ERROR_KINDS:
                out.append(f'tandem_request_errors_total{{kind="{ERROR_KINDS[reason]}"}}{_value(rest)}')
            else:
                out.append(f"tandem_request_success_total{rest}")
        else:
            renamed = _tandem_name(name)
            if renamed is not None and not name.endswith("_created"):
                out.append(renamed + rest)
    return "\n".join(out) + "\n"


def _label(rest: str, key: str) -> str:
    start = rest.find(f'{key}="')
    if start == -1:
        return ""
    start += len(key) + 2
    return rest[start:rest.find('"', start)]


def _value(rest: str) -> str:
    """' <value>' of a sample line's rest, without its labels."""
    return rest[rest.rfind("}") + 1:] if "}" in rest else rest


# The same renaming for a Prometheus that scrapes vLLM workers itself (docs/prometheus.md): metric_relabel_configs of
# the job that scrapes targets labelled engine="vllm".
RELABEL_CONFIGS = [
    *({"source_labels": ["__name__"], "regex": f"{vllm}(_bucket|_sum|_count|_total)?",
       "target_label": "__name__", "replacement": f"{tandem}${{1}}"} for vllm, tandem in FAMILIES.items()),
    {"source_labels": ["__name__", "finished_reason"], "regex": f"{SUCCESS};(stop|length|repetition)",
     "target_label": "__name__", "replacement": "tandem_request_success_total"},
    {"source_labels": ["__name__", "finished_reason"], "regex": f"{SUCCESS};abort",
     "target_label": "kind", "replacement": ERROR_KINDS["abort"]},
    {"source_labels": ["__name__", "finished_reason"], "regex": f"{SUCCESS};error",
     "target_label": "kind", "replacement": ERROR_KINDS["error"]},
    {"source_labels": ["__name__", "finished_reason"], "regex": f"{SUCCESS};(abort|error)",
     "target_label": "__name__", "replacement": "tandem_request_errors_total"},
]
