"""A real Prometheus (Debian's `prometheus` and `promtool`) for bench/fleet/sim_fleet.py's `prometheus` backend.

`PrometheusProcess` starts one in a folder of its own, scraping the fleet the way docs/prometheus.md tells an
operator to: one `http_sd_configs` job on the control plane's GET /api/v1/prometheus/targets with a viewer token,
and `rule_files` naming the recording rules `manage.py tandem_recording_rules` writes, evaluated every interval.

`backfill_day` gives one deployment a day of the recorded series its page reads, as the recording rules would have
written them: an OpenMetrics file turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics` (as
tests/controlplane/observability/seeded_prometheus.py does), moved into the running Prometheus' data folder, which
loads new blocks once a minute. `own_figures` reads Prometheus' own metrics: its rule evaluation and scrape loops.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import requests

PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"
DAY_S = 24 * 3600
POOLS = ("prefill", "decode", "gateway")


class PrometheusProcess:
    def __init__(self, directory: Path, *, port: int, targets_url: str, token: str, rules: Path, interval_s: int):
        for binary in (PROMETHEUS, PROMTOOL):
            if not Path(binary).exists():
                raise SystemExit(f"--backend prometheus needs {binary} (Debian package `prometheus`)")
        directory.mkdir(parents=True, exist_ok=True)
        self.data = directory / "data"
        (directory / "token").write_text(token)
        # The gateways answer /metrics to the scrape token only (docs/prometheus.md); workers ignore it.
        scrape_token = requests.get(targets_url.removesuffix("/targets") + "/scrape-token", timeout=30,
                                    headers={"Authorization": f"Bearer {token}"})
        scrape_token.raise_for_status()
        (directory / "scrape-token").write_text(scrape_token.text)
        config = {"global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s",
                             "scrape_timeout": f"{min(interval_s, 10)}s"},
                  "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "tandem", "http_sd_configs": [{
                      "url": targets_url, "refresh_interval": "15s",
                      "authorization": {"type": "Bearer", "credentials_file": str(directory / "token")}}],
                      "authorization": {"type": "Bearer", "credentials_file": str(directory / "scrape-token")}}]}
        (directory / "prometheus.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
        self.url = f"http://127.0.0.1:{port}"
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self._ready():
            if self.proc.poll() is not None:
                raise SystemExit(f"prometheus exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"prometheus not ready within 120 s: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def query(self, expr: str) -> list[dict]:
        body = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30).json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {expr}: {body.get('error')}")
        return body["data"]["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def page_series(has_gpu: bool) -> tuple[list[str], list[str]]:
    """(pool series, per-worker series) that the deployment page reads and the recording rules record (its
    charts, stage columns and current values), for a host with or without GPUs. Needs Django set up."""
    from controlplane.observability.recording_rules import recorded_metrics
    from dashboards.panels import panels_for
    from dashboards.stages import GPU_HEALTH, stage_indicators

    pool, worker = set(), set()
    for panel in panels_for(has_gpu=has_gpu):
        (worker if panel.per_worker else pool).update(line.metric for line in panel.lines)
    for stage in ("prefill", "decode"):
        for indicator in stage_indicators(stage, has_gpu=has_gpu):
            pool.update({line.metric for line in indicator.lines} | {indicator.value_metric} - {""})
    if has_gpu:
        pool.update(line.metric for indicator in GPU_HEALTH for line in indicator.lines)
    recorded = recorded_metrics()
    return sorted(pool & recorded), sorted(worker & recorded)


def _value(metric: str, index: int, ts: float) -> float:
    # A smooth daily curve plus a faster wiggle per series (bench/lib/seeded_day.value_at's shape).
    phase = (len(metric) * 7 + index * 13) % 100 / 100.0
    wave = 0.5 + 0.3 * math.sin(2 * math.pi * (ts / DAY_S + phase)) + 0.1 * math.sin(ts / 300.0 + phase * 6)
    return wave if metric.endswith("_ratio") else wave * 100


def backfill_day(prometheus: PrometheusProcess, *, deployment: str, workers: list[tuple[int, str]], has_gpu: bool,
                 end: float, step_s: float, folder: Path) -> dict:
    """A day of 5-second samples ending at `end` of the page's series of `deployment` (pools, and each of `workers`,
    [(id, role)]), loaded into the running Prometheus; returns what was written and how long each part took.
    1. write the OpenMetrics file; 2. promtool makes blocks of it; 3. move them into the data folder; 4. wait until
    Prometheus reads the day (it loads new blocks once a minute)."""
    from controlplane.observability.recording_rules import POOL_PREFIX, WORKER_PREFIX

    pool_metrics, worker_metrics = page_series(has_gpu)
    series = [(f"{POOL_PREFIX}{m}", f'deployment="{deployment}",pool="{role}"') for m in pool_metrics for role in POOLS]
    series += [(f"{WORKER_PREFIX}{m}", f'deployment="{deployment}",pool="{role}",worker="{wid}"')
               for m in worker_metrics for wid, role in workers if role != "gateway"]
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    source, blocks = folder / "day.om", folder / "blocks"
    num_steps = int(DAY_S // step_s)
    first = end - num_steps * step_s
    written: set[str] = set()
    with open(source, "w") as out:
        for index, (name, labels) in enumerate(series):
            if name not in written:  # OpenMetrics wants each metric family's samples together, after its TYPE
                out.write(f"# TYPE {name} gauge\n")
                written.add(name)
            out.writelines(f"{name}{{{labels}}} {_value(name, index, ts):.6g} {ts:.3f}\n"
                           for ts in (first + k * step_s for k in range(1, num_steps + 1)))
        out.write("# EOF\n")
    wrote = time.perf_counter()
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(blocks)],
                   check=True, capture_output=True, timeout=1800)
    made = time.perf_counter()
    for block in blocks.iterdir():
        if re.fullmatch(r"[0-9A-Z]{26}", block.name):
            shutil.move(str(block), str(prometheus.data / block.name))
    source.unlink()
    probe = f'count_over_time({POOL_PREFIX}{pool_metrics[0]}{{deployment="{deployment}",pool="decode"}}[1d] @ {end})'
    deadline = time.monotonic() + 300
    while (prometheus.scalar(probe) or 0) < num_steps * 0.99:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus did not load the backfilled blocks within 300 s ({probe})")
        time.sleep(2.0)
    return {"num_series": len(series), "num_samples": len(series) * num_steps, "step_s": step_s,
            "write_openmetrics_s": round(wrote - started, 1), "promtool_blocks_s": round(made - wrote, 1),
            "loaded_s": round(time.perf_counter() - made, 1)}


def rule_groups(prometheus: PrometheusProcess, *, num_slowest: int = 3) -> dict:
    """Each rule group's last evaluation as GET /api/v1/rules tells it: seconds, number of rules and its slowest
    rules (record name, seconds), which is where a group that misses its interval spends it."""
    groups = requests.get(f"{prometheus.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
    return {group["name"]: {
        "last_s": round(group["evaluationTime"], 4), "interval_s": group["interval"], "rules": len(group["rules"]),
        "slowest": [[rule["name"], round(rule["evaluationTime"], 4)] for rule in sorted(
            group["rules"], key=lambda rule: -rule["evaluationTime"])[:num_slowest]]} for group in groups}


def own_figures(prometheus: PrometheusProcess) -> dict:
    """Prometheus' own loops: the recording rule groups' evaluation (its /metrics: the slowest group, the rules of
    all; GET /api/v1/rules: each group) and its scrapes (`up` and `scrape_duration_seconds` of the tandem job)."""
    text = requests.get(f"{prometheus.url}/metrics", timeout=30).text

    def own(name: str, reduce=max):
        values = [float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
        return round(reduce(values), 4) if values else None

    def stored(expr: str):
        value = prometheus.scalar(expr)
        return None if value is None else round(value, 4)

    return {"targets": stored("count(up)"), "targets_up": stored("sum(up)"),
            "scrape_duration_max_s": stored("max(scrape_duration_seconds)"),
            "rule_group_last_duration_s": own("prometheus_rule_group_last_duration_seconds"),
            "rule_group_interval_s": own("prometheus_rule_group_interval_seconds"),
            "rule_group_rules": own("prometheus_rule_group_rules", sum),
            "rule_groups": rule_groups(prometheus),
            "rule_iterations_missed": own("prometheus_rule_group_iterations_missed_total", sum),
            "rule_evaluation_failures": own("prometheus_rule_evaluation_failures_total", sum),
            "sd_http_failures": own("prometheus_sd_http_failures_total", sum),
            "head_series": own("prometheus_tsdb_head_series")}
