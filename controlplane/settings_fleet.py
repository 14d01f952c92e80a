"""The fleet's settings, per part of the control plane: supervision, observability, rollouts, chaos, autoscaling,
capacity, tenants and alerting (controlplane/settings.py imports them; Django's own settings stay there).

Read from the environment here and nowhere else (STYLE.md), each with its default and bounds.
"""
from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from controlplane.lib.env import env_bool, env_int, env_str

# --- supervision ------------------------------------------------------------------------------------------
# How long a started worker may take to answer /health 200 before the start counts as failed (model load).
TANDEM_STARTUP_TIMEOUT_S = env_int("TANDEM_STARTUP_TIMEOUT_S", 120, minimum=1)
# The same for a worker that answers /health 503 "starting": its process is up, loading the weights or compiling its
# decode step (`compile`: minutes of warm-up on a GPU, docs/performance.md, 'On a GPU'), so it gets this
# long (at least TANDEM_STARTUP_TIMEOUT_S) before the start counts as failed.
TANDEM_WARMUP_TIMEOUT_S = env_int("TANDEM_WARMUP_TIMEOUT_S", 900, minimum=1)
# The Python of the vLLM environment that vLLM workers run from (inference/engines/vllm/environment.py): on each agent
# the one its host's vLLM workers start with, on the web host the one whose argument parser checks a vLLM revision's
# extra_args. Default: the project's own .venv-vllm (`make vllm`) where it exists.
_PROJECT_VLLM = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"
TANDEM_VLLM_PYTHON = env_str("TANDEM_VLLM_PYTHON", str(_PROJECT_VLLM) if _PROJECT_VLLM.is_file() else "")
# Tandem's workers load a private snapshot of their model folder (var/model-snapshots/, one per content, shared by
# the workers of it): an operator rewriting the folder in place kills no running worker. 0: they map the folder.
TANDEM_MODEL_SNAPSHOTS = env_bool("TANDEM_MODEL_SNAPSHOTS", True)
# A worker's or gateway's log past this many bytes is rotated by its node agent's heartbeat (one old copy kept).
TANDEM_LOG_MAX_BYTES = env_int("TANDEM_LOG_MAX_BYTES", 64 << 20, minimum=4096)
# One /health probe's timeout; probes of all workers run concurrently.
TANDEM_HEALTH_TIMEOUT_S = env_int("TANDEM_HEALTH_TIMEOUT_S", 2, minimum=1)
# A health pass in which the probes of at least this many ready workers, and at least this share of them, on hosts
# whose agent is alive, time out restarts none of them for it: the prober or its network is the likely cause
# (controlplane/supervision/probe_hold.py). HOLD_PCT=100 with a HOLD_MIN above the fleet's size never holds.
TANDEM_HEALTH_HOLD_PCT = env_int("TANDEM_HEALTH_HOLD_PCT", 10, minimum=1, maximum=100)
TANDEM_HEALTH_HOLD_MIN = env_int("TANDEM_HEALTH_HOLD_MIN", 10, minimum=1)
# The node agent's heartbeat: Node.last_seen_at and a liveness check of each of its processes.
TANDEM_HEARTBEAT_INTERVAL_S = env_int("TANDEM_HEARTBEAT_INTERVAL_S", 2, minimum=1)
# A node whose agent has not beaten for this long gets no new workers.
TANDEM_NODE_OFFLINE_AFTER_S = env_int("TANDEM_NODE_OFFLINE_AFTER_S", 30, minimum=2)
# Between taking a worker out of the gateway's membership (status draining) and its SIGTERM: the gateway polls
# membership every 2 s, so it must have stopped routing new requests there first.
TANDEM_DRAIN_GRACE_S = env_int("TANDEM_DRAIN_GRACE_S", 3, minimum=0)
# Restart backoff: 1, 2, 4, ... seconds, capped here.
TANDEM_RESTART_BACKOFF_MAX_S = env_int("TANDEM_RESTART_BACKOFF_MAX_S", 60, minimum=1)
# Threads of the node agent's Celery pool: stops block for the drain deadline, so several run at once.
TANDEM_AGENT_CONCURRENCY = env_int("TANDEM_AGENT_CONCURRENCY", 8, minimum=1)
# The node agent measures its host's roofline (matmul peaks, read bandwidth: a child process, a few seconds) when it
# starts and on demand (POST /api/v1/nodes/<name>/measure); off where many agents start on a busy host (tests).
TANDEM_HOST_MEASURE = env_bool("TANDEM_HOST_MEASURE", True)
TANDEM_HOST_MEASURE_TIMEOUT_S = env_int("TANDEM_HOST_MEASURE_TIMEOUT_S", 120, minimum=5)

# --- observability ----------------------------------------------------------------------------------------
# Scrape every worker's and gateway's /metrics this often (Celery beat → periodic queue), at most this many at once.
TANDEM_SCRAPE_INTERVAL_S = env_int("TANDEM_SCRAPE_INTERVAL_S", 5, minimum=1)
TANDEM_SCRAPE_TIMEOUT_S = env_int("TANDEM_SCRAPE_TIMEOUT_S", 3, minimum=1)
TANDEM_SCRAPE_CONCURRENCY = env_int("TANDEM_SCRAPE_CONCURRENCY", 100, minimum=1)
# Scrape passes per interval, each of the deployments whose id modulo this is its shard: a large fleet's scrape
# spread over several periodic workers (run as many `--queues periodic` workers as shards).
TANDEM_SCRAPE_SHARDS = env_int("TANDEM_SCRAPE_SHARDS", 1, minimum=1)
# Rates and latency quantiles are computed over this window of raw counters (Prometheus' rate(x[window])).
TANDEM_SCRAPE_WINDOW_S = env_int("TANDEM_SCRAPE_WINDOW_S", 30, minimum=1)
TANDEM_METRICS_RAW_RETENTION_S = env_int("TANDEM_METRICS_RAW_RETENTION_S", 6 * 3600, minimum=60)
TANDEM_METRICS_ROLLUP_RETENTION_S = env_int("TANDEM_METRICS_ROLLUP_RETENTION_S", 14 * 86400, minimum=3600)
# Where the control loops read series (observability/reader.py): "embedded" (Tandem scrapes and keeps the samples
# in its own tables) or "prometheus" (Tandem does not scrape; it reads the recording rules of
# `manage.py tandem_recording_rules` with PromQL instant queries at TANDEM_PROMETHEUS_URL, each bounded by the timeout).
TANDEM_METRICS_BACKEND = (env_str("TANDEM_METRICS_BACKEND", "embedded") or "embedded").strip().lower()
if TANDEM_METRICS_BACKEND not in ("embedded", "prometheus"):
    raise ImproperlyConfigured(f"TANDEM_METRICS_BACKEND={TANDEM_METRICS_BACKEND!r} is not embedded or prometheus")
TANDEM_PROMETHEUS_URL = (env_str("TANDEM_PROMETHEUS_URL", "") or "").strip().rstrip("/")
if TANDEM_PROMETHEUS_URL and not TANDEM_PROMETHEUS_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"TANDEM_PROMETHEUS_URL={TANDEM_PROMETHEUS_URL!r} is not an http:// or https:// URL")
if TANDEM_METRICS_BACKEND == "prometheus" and not TANDEM_PROMETHEUS_URL:
    raise ImproperlyConfigured("TANDEM_METRICS_BACKEND=prometheus needs TANDEM_PROMETHEUS_URL "
                               "(e.g. http://localhost:9090)")
TANDEM_PROMETHEUS_TIMEOUT_S = env_int("TANDEM_PROMETHEUS_TIMEOUT_S", 3, minimum=1, maximum=60)

# --- rollouts (canary, A/B) -----------------------------------------------------------------------------------
# How often the rollout driver steps every running rollout (Celery beat, periodic queue).
TANDEM_ROLLOUT_INTERVAL_S = env_int("TANDEM_ROLLOUT_INTERVAL_S", 2, minimum=1)

# --- chaos experiments ----------------------------------------------------------------------------------
# How often the chaos driver steps every running experiment (its gateway numbers come from the scrape).
TANDEM_CHAOS_INTERVAL_S = env_int("TANDEM_CHAOS_INTERVAL_S", 2, minimum=1)
# The longest fault an experiment may hold (a pause is released by the node agent by then in any case).
TANDEM_CHAOS_MAX_DURATION_S = env_int("TANDEM_CHAOS_MAX_DURATION_S", 600, minimum=1)
# The most a disk_fill fault writes under var/ (MiB), whatever its max_mib: a fault on a big disk writes at most this.
TANDEM_CHAOS_DISK_FILL_MAX_MIB = env_int("TANDEM_CHAOS_DISK_FILL_MAX_MIB", 4096, minimum=1)

# --- autoscaling ------------------------------------------------------------------------------------------
# The autoscaler (HPA's algorithm, evaluated every TANDEM_SCRAPE_INTERVAL_S): tolerance in percent, stabilisation
# windows, the largest change per step period, how long a manual scale pauses the autoscaler of that pool, and the
# default targets of new policies.
TANDEM_AUTOSCALE_TOLERANCE_PCT = env_int("TANDEM_AUTOSCALE_TOLERANCE_PCT", 10, minimum=0, maximum=100)
TANDEM_AUTOSCALE_UP_STABILIZATION_S = env_int("TANDEM_AUTOSCALE_UP_STABILIZATION_S", 0, minimum=0)
TANDEM_AUTOSCALE_DOWN_STABILIZATION_S = env_int("TANDEM_AUTOSCALE_DOWN_STABILIZATION_S", 300, minimum=0)
TANDEM_AUTOSCALE_MAX_STEP = env_int("TANDEM_AUTOSCALE_MAX_STEP", 2, minimum=1)
TANDEM_AUTOSCALE_STEP_PERIOD_S = env_int("TANDEM_AUTOSCALE_STEP_PERIOD_S", 60, minimum=0)
TANDEM_AUTOSCALE_MANUAL_PAUSE_S = env_int("TANDEM_AUTOSCALE_MANUAL_PAUSE_S", 600, minimum=0)
TANDEM_AUTOSCALE_TTFT_TARGET_MS = env_int("TANDEM_AUTOSCALE_TTFT_TARGET_MS", 1000, minimum=1)
TANDEM_AUTOSCALE_ITL_TARGET_MS = env_int("TANDEM_AUTOSCALE_ITL_TARGET_MS", 100, minimum=1)

# --- capacity ---------------------------------------------------------------------------------------------
# Stage profiles, the capacity planner, per-pool schedules and predictive floors (controlplane/capacity/).
# How often live traffic adds points (from the scraped series) to the current revisions' profiles.
TANDEM_CAPACITY_LIVE_REFINE_INTERVAL_S = env_int("TANDEM_CAPACITY_LIVE_REFINE_INTERVAL_S", 300, minimum=10)

# --- replay (request traces) -------------------------------------------------------------------------------
# How often the gateways' request traces are pulled; how long and how many recorded requests each deployment keeps;
# the most requests one imported file may hold.
TANDEM_TRACE_PULL_INTERVAL_S = env_int("TANDEM_TRACE_PULL_INTERVAL_S", 15, minimum=1)
TANDEM_TRACE_RETENTION_S = env_int("TANDEM_TRACE_RETENTION_S", 7 * 86400, minimum=3600)
TANDEM_TRACE_MAX_REQUESTS = env_int("TANDEM_TRACE_MAX_REQUESTS", 1_000_000, minimum=1000)
TANDEM_TRACE_IMPORT_MAX_REQUESTS = env_int("TANDEM_TRACE_IMPORT_MAX_REQUESTS", 1_000_000, minimum=1)
TANDEM_TRACE_IMPORT_MAX_BYTES = env_int("TANDEM_TRACE_IMPORT_MAX_BYTES", 256 << 20, minimum=1024)
# A replay (what-if): the most requests one window may hold, and how long a worker the replay adds takes to serve.
TANDEM_REPLAY_MAX_REQUESTS = env_int("TANDEM_REPLAY_MAX_REQUESTS", 100_000, minimum=100)
TANDEM_REPLAY_STARTUP_S = env_int("TANDEM_REPLAY_STARTUP_S", 30, minimum=0)
# The change gate replays at most this many of the window's newest requests (it answers within the change's request).
TANDEM_GATE_MAX_REQUESTS = env_int("TANDEM_GATE_MAX_REQUESTS", 50_000, minimum=100)

# --- tenants (API keys, limits, the deployments that require a key) ----------------------------------------
# Hourly usage rows per tenant and deployment (controlplane/tenants/usage.py) are kept this long (a bill's months).
TANDEM_TENANT_USAGE_RETENTION_S = env_int("TANDEM_TENANT_USAGE_RETENTION_S", 400 * 86400, minimum=86400)
# At most this many tenants: each is a `tenant` label value on every gateway's /metrics (~50 series, its TTFT
# histogram the most) and a ring in its scrape state, so the label's cardinality stays bounded.
TANDEM_MAX_TENANTS = env_int("TANDEM_MAX_TENANTS", 100, minimum=1)

# --- alerting ---------------------------------------------------------------------------------------------
# How often Celery beat runs one evaluation pass over every enabled alert rule.
TANDEM_ALERT_EVAL_INTERVAL_S = env_int("TANDEM_ALERT_EVAL_INTERVAL_S", 5, minimum=1)
# Outgoing webhooks: each try's timeout, the number of tries and the first backoff (doubled after each try).
TANDEM_WEBHOOK_TIMEOUT_S = env_int("TANDEM_WEBHOOK_TIMEOUT_S", 5, minimum=1, maximum=60)
TANDEM_WEBHOOK_MAX_ATTEMPTS = env_int("TANDEM_WEBHOOK_MAX_ATTEMPTS", 3, minimum=1, maximum=10)
TANDEM_WEBHOOK_BACKOFF_MS = env_int("TANDEM_WEBHOOK_BACKOFF_MS", 1000, minimum=0)
# Channel URLs that name or resolve to loopback, link-local, private or other non-public addresses are refused
# (the control plane must not be made to call its own network's services); set to 1 for receivers on such networks.
TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS = env_bool("TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS", False)
# The most alerts one Alertmanager delivery may carry; more are ignored, and the response says how many.
TANDEM_ALERTMANAGER_MAX_ALERTS = env_int("TANDEM_ALERTMANAGER_MAX_ALERTS", 100, minimum=1, maximum=10_000)
# Ended alerts (with their transitions) and finished deliveries are pruned after this many days.
TANDEM_ALERT_HISTORY_DAYS = env_int("TANDEM_ALERT_HISTORY_DAYS", 30, minimum=1)
