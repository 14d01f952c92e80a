"""What the node agent runs for a Worker row: the command line, its environment, where it logs.

Workers: `python -m inference.worker --role R --model DIR --port P --revision N --dtype D` plus the revision's
engine settings for role R (its common part overridden by R's part) as flags (`--key value`; a boolean setting is
`--key` alone when true, and `--no-key` when false where the worker has that form, for settings on by default).
Threads: the engine setting `threads` where the revision sets it, else the pool's `threads_per_worker` (what
placement reserves for the worker), else 1. D may be `auto`: the
worker resolves it from the model's config when it loads. A CPU worker on a node that has measured its host also
gets `--host-peak-gflops` and `--host-bandwidth-gbs` (its share of the host's roofline), to report its efficiency. Gateways: `python -m inference.gateway --port P --control-plane URL --deployment NAME`,
`--quota-state FILE` (quota_state_path), with the `tandem-gateway` service user's token (viewer: it only reads
/endpoints) in its environment (TANDEM_CONTROL_PLANE_TOKEN), not on its command line where `ps` shows it. A shared
gateway's process (a row with `shared_gateway`, docs/gateway.md) runs `--shared-gateway NAME` in place of
`--deployment NAME`, on the shared gateway's port.
Secrets between them (inference.worker_secret), in the environment too: a worker gets its revision's worker secret,
a gateway the deployment's worker key, from which it derives each revision's; a shared gateway the key of each
deployment attached when it starts (TANDEM_WORKER_KEYS, a JSON object of name → key; shared_gateway_keys).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import psutil
from django.conf import settings

from controlplane.agent import processes
from controlplane.lib.worker_keys import deployment_worker_key, scrape_token, worker_secret_for
from controlplane.models import Deployment, Pool, Worker, WorkerPurpose, WorkerRole
from controlplane.models.workers import LIVE_STATUSES
from controlplane.services.revisions import revision_model_checksum_record
from inference.engines import VLLM, engine_of
from inference.engines.vllm import launch as vllm_launch
from inference.engines.vllm.launch import LaunchSpec
from inference.gateway.config import SCRAPE_TOKEN_ENV, WORKER_KEYS_ENV
from inference.model_snapshot import checksum as model_checksum
from inference.roofline import format_gflops_flag, peaks_for_threads
from inference.worker_secret import KEY_ENV, SECRET_ENV

log = logging.getLogger(__name__)

GATEWAY_USERNAME = "tandem-gateway"


def _worker_flags() -> set[str]:
    """The long options `python -m inference.worker` accepts, so that an engine setting it does not know is left
    out (with a warning) instead of making every start of that revision exit with a usage error."""
    from inference.worker.config import build_parser

    return {opt for action in build_parser()._actions for opt in action.option_strings if opt.startswith("--")}


def gateway_token(deployment_name: str) -> str:
    """A new API token for the gateway of a deployment to read its membership (tokens are stored hashed, so each
    gateway start gets its own, and the previous one of that deployment is revoked). The service user is created
    on first use."""
    from django.contrib.auth import get_user_model

    from controlplane.auth import Role, set_role
    from controlplane.services.tokens import token_issue

    user, created = get_user_model().objects.get_or_create(username=GATEWAY_USERNAME)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        set_role(user, Role.VIEWER)
    return token_issue(user=user, name=f"gateway {deployment_name}", replace=True)


def quota_state_path(deployment_name: str, port: int) -> Path:
    """Where a gateway keeps its tenants' minute of usage across a restart (inference/gateway/quota_state.py): one
    file per deployment and port, so the gateway started again in its place reads what the last one saved."""
    return settings.VAR_DIR / "gateway-state" / f"{deployment_name}-{port}.quota.json"


def log_path_for(worker: Worker) -> Path:
    prefix = "profile-" if worker.purpose == WorkerPurpose.PROFILE else ""
    if worker.shared_gateway_id is not None:
        prefix = "shared-"  # a shared gateway's name may be a deployment's too: its log is never that one's
    return settings.TANDEM_LOG_DIR / f"{prefix}{worker.owner_name}-{worker.role}-{worker.id}.log"


def gateway_port(worker: Worker) -> int:
    """The port a gateway listens on: its shared gateway's, else its deployment's (chosen by the operator)."""
    if worker.shared_gateway_id is not None:
        return worker.shared_gateway.port
    return worker.deployment.gateway_port


def shared_gateway_keys(worker: Worker) -> dict[int, tuple[str, str]]:
    """Each deployment attached to the worker's shared gateway now: id → (name, worker key). Read once per start:
    the ids the process got are recorded on its row (Worker.worker_keys_of), from the same read."""
    attached = Deployment.objects.filter(shared_gateway_id=worker.shared_gateway_id).order_by("name")
    return {deployment.pk: (deployment.name, deployment_worker_key(deployment)) for deployment in attached}


def settings_for(worker: Worker) -> dict:
    """The engine settings this worker runs with: its revision's common part overridden by its role's part; threads
    from the pool's `threads_per_worker` where the revision sets none (placement reserved that many for it). A
    profile run's worker, in no pool, runs as its role's pool would run it."""
    if worker.revision is None:
        return {}
    engine_settings = worker.revision.settings_for(worker.role)
    pool = worker.pool if worker.pool_id is not None else (
        Pool.objects.filter(deployment_id=worker.deployment_id, role=worker.role).first()
        if worker.purpose == WorkerPurpose.PROFILE else None)
    if "threads" not in engine_settings and pool is not None and pool.threads_per_worker:
        engine_settings["threads"] = pool.threads_per_worker
    return engine_settings


def model_checksum_for(revision) -> str:
    """The checksum of the files the revision serves: recorded by its first worker's start (from this node's folder),
    "" where the folder is not here (the worker's own load says why)."""
    if revision.model_checksum:
        return revision.model_checksum
    if not Path(revision.model_path).is_dir():
        return ""
    try:
        found = model_checksum(revision.model_path)
    except OSError:
        return ""
    return revision_model_checksum_record(revision=revision, checksum=found)


def argv_for(worker: Worker, port: int) -> list[str]:
    if worker.role == WorkerRole.GATEWAY:
        served = (["--shared-gateway", worker.shared_gateway.name] if worker.shared_gateway_id is not None
                  else ["--deployment", worker.deployment.name])
        return processes.python_argv(
            "inference.gateway", "--port", str(port), "--host", worker.host,
            "--control-plane", settings.TANDEM_PUBLIC_URL, *served,
            "--quota-state", str(quota_state_path(worker.owner_name, port)),
        )
    revision = worker.revision
    if engine_of(revision.engine_settings) == VLLM:
        return vllm_command(worker, port)[0]
    engine_settings = settings_for(worker)
    # A role's own dtype (its part of the engine settings) overrides the revision's: stages may differ.
    dtype = engine_settings.pop("dtype", None) or revision.dtype
    argv = processes.python_argv(
        "inference.worker", "--role", worker.role, "--model", revision.model_path, "--port", str(port),
        "--host", worker.host, "--revision", str(revision.number), "--dtype", dtype,
    )
    known = _worker_flags()
    if engine_settings.get("device") == "auto":
        # "auto" is resolved where the hardware is known: the node's GPUs (NVML at agent start), else the CPU.
        engine_settings["device"] = "cuda" if worker.node and worker.node.gpus else "cpu"
    # SIGTERM must finish draining before the agent's SIGKILL deadline.
    engine_settings.setdefault("drain_timeout", max(1, settings.TANDEM_STOP_DEADLINE_S - 2))
    if worker.role == WorkerRole.PREFILL:
        engine_settings.pop("speculative", None)  # decode and colocated only (a prefill part is refused at the API)
    budget = kv_budget_for(worker, engine_settings)
    if budget is not None:
        argv += ["--kv-memory-budget", str(budget)]
    if settings.TANDEM_MODEL_SNAPSHOTS and not engine_settings.get("simulate"):
        # A private copy of the model folder per content, shared by the workers of it: rewriting the folder under
        # load kills no running worker (inference/model_snapshot.py).
        argv += ["--model-snapshots", str(settings.VAR_DIR / "model-snapshots")]
    if not engine_settings.get("simulate"):
        expected = model_checksum_for(revision)
        if expected:
            argv += ["--model-checksum", expected]
    for key, value in sorted(engine_settings.items()):
        flag = "--" + key.replace("_", "-")
        if flag not in known or flag in argv:
            log.warning("revision %s: engine setting %r is not a worker option; left out", revision.pk, key)
            continue
        if value is False and "--no-" + flag[2:] in known:
            argv.append("--no-" + flag[2:])  # a setting that is on by default (chunked_prefill) is turned off
            continue
        if value is None or value is False:
            continue
        if isinstance(value, dict):  # an object setting (speculative) travels as JSON
            argv += [flag, json.dumps(value, sort_keys=True)]
            continue
        if isinstance(value, str) and value.startswith("-"):  # a text setting (shared_prompt) argparse must not
            argv.append(f"{flag}={value}")                      # take for an option
            continue
        argv += [flag] if value is True else [flag, str(value)]  # a boolean setting is a flag without a value
    return argv + host_peak_flags(worker, engine_settings)


def vllm_command(worker: Worker, port: int) -> tuple[list[str], dict[str, str]]:
    """(argv, environment to add) of a vLLM worker (inference/engines/vllm/launch.py): its revision's settings for
    its role, half the stop deadline as vLLM's shutdown timeout, its share of the host's KV memory where the revision
    sets none, the revision's worker secret as its API key. ValueError where this host has no vLLM: the start is
    then reported as failed with that reason."""
    if not settings.TANDEM_VLLM_PYTHON:
        raise ValueError("this node has no vLLM to run the worker with: set TANDEM_VLLM_PYTHON for its agent "
                         "(`make vllm` builds .venv-vllm)")
    engine_settings = settings_for(worker)
    dtype = engine_settings.pop("dtype", None) or worker.revision.dtype
    device = str(engine_settings.get("device", "cpu"))
    on_gpu = device.startswith("cuda") or (device == "auto" and bool(worker.node and worker.node.gpus))
    # Half the stop deadline for its requests: vLLM's engine core takes seconds more to shut down after them.
    engine_settings.setdefault("drain_timeout", max(1, settings.TANDEM_STOP_DEADLINE_S // 2))
    budget = kv_budget_for(worker, engine_settings) if not on_gpu else None
    if budget is not None:
        engine_settings["kv_cache_bytes"] = budget
    spec = LaunchSpec(python=settings.TANDEM_VLLM_PYTHON, model_path=worker.revision.model_path,
                      served_name=worker.deployment.name, host=worker.host, port=port, dtype=dtype,
                      settings=engine_settings, secret=worker_secret_for(worker.deployment, worker.revision.number),
                      on_gpu=on_gpu)
    return vllm_launch.command(spec)


def host_peak_flags(worker: Worker, engine_settings: dict) -> list[str]:
    """The host's roofline for this worker's threads (inference.roofline.peaks_for_threads), which it reports its
    efficiency against: none where the node has not measured its host, and for a worker on a GPU (the figures are
    the CPU's)."""
    node = worker.node
    if node is None or str(engine_settings.get("device", "cpu")) != "cpu":
        return []
    peaks = peaks_for_threads(node.roofline, engine_settings.get("threads") or 1)
    if peaks is None:
        return []
    flags = ["--host-peak-gflops", format_gflops_flag(peaks.matmul_gflops)] if peaks.matmul_gflops else []
    return flags + (["--host-bandwidth-gbs", f"{peaks.read_gbs:g}"] if peaks.read_gbs else [])


def kv_budget_for(worker: Worker, engine_settings: dict) -> int | None:
    """This worker's share of its host's KV memory: TANDEM_KV_HOST_PERCENT of the host's RAM, divided among the model
    workers placed on the node (live rows, this one included), so that N workers on one host never each take the
    same fraction of it. A share is fixed when the worker starts: after a scale-up the older workers keep theirs
    until they restart, and since a CPU pool takes RAM only for the blocks in use, that costs RAM only under load.

    None (the worker sizes its pool itself) where the revision does (kv_cache_bytes or kv_memory_fraction), on a GPU
    (free GPU memory, not the host's RAM, bounds its pool), and for a worker on no node. A profile run's worker
    counts as one of the node's workers: it shares the host's RAM while it runs."""
    if engine_settings.get("kv_cache_bytes", "auto") != "auto" or engine_settings.get("kv_memory_fraction"):
        return None
    if str(engine_settings.get("device", "cpu")) != "cpu" or worker.node_id is None:
        return None
    num_workers = (Worker.objects.filter(node_id=worker.node_id, status__in=LIVE_STATUSES)
                   .exclude(role=WorkerRole.GATEWAY).exclude(id=worker.id).count() + 1)
    host_budget = psutil.virtual_memory().total * settings.TANDEM_KV_HOST_PERCENT // 100
    return host_budget // num_workers


# The agent's own secrets and control-plane settings are none of an inference process's business; a worker secret
# or key in the agent's own environment is no deployment's (each process gets its own below).
_PRIVATE_ENV = ("SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "TANDEM_ADMIN_PASSWORD",
                SECRET_ENV, KEY_ENV, SCRAPE_TOKEN_ENV, WORKER_KEYS_ENV)


def gpu_pick(worker: Worker) -> int | None:
    """The GPU of this node for a worker that asks for `cuda` or `auto`: the one with the fewest live workers.
    None on a CPU node, for `cpu`, and for an explicit `cuda:N` (the revision chose; nothing to pin)."""
    from controlplane.models import WorkerStatus

    device = str(settings_for(worker).get("device", "cpu"))
    gpus = [gpu["index"] for gpu in (worker.node.gpus or []) if "index" in gpu]
    if device not in ("cuda", "auto") or not gpus:
        return None
    busy = Worker.objects.filter(node=worker.node, gpu_index__isnull=False, status__in=(
        WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING)).exclude(id=worker.id)
    load = {index: 0 for index in gpus}
    for index in busy.values_list("gpu_index", flat=True):
        if index in load:
            load[index] += 1
    return min(gpus, key=lambda index: (load[index], index))


def env_for(worker: Worker, gpu_index: int | None = None,
            worker_keys: dict[int, tuple[str, str]] | None = None) -> dict[str, str]:
    """The process's environment. worker_keys: a shared gateway's (shared_gateway_keys), read by the caller, which
    records whose keys the process got."""
    env = {key: value for key, value in os.environ.items() if key not in _PRIVATE_ENV}
    # Each worker process gets the threads its revision asks for (else one): several share a host's cores.
    threads = settings_for(worker).get("threads")
    env["OMP_NUM_THREADS"] = str(threads or 1)
    env["MKL_NUM_THREADS"] = env["OMP_NUM_THREADS"]
    if worker.role == WorkerRole.GATEWAY and worker.shared_gateway_id is not None:
        # "shared " in the token's name: a shared gateway and a deployment of one name each keep their own token.
        env["TANDEM_CONTROL_PLANE_TOKEN"] = gateway_token(f"shared {worker.shared_gateway.name}")
        keys = shared_gateway_keys(worker) if worker_keys is None else worker_keys
        env[WORKER_KEYS_ENV] = json.dumps({name: key for name, key in keys.values()}, sort_keys=True)
        env[SCRAPE_TOKEN_ENV] = scrape_token()
    elif worker.role == WorkerRole.GATEWAY:
        env["TANDEM_CONTROL_PLANE_TOKEN"] = gateway_token(worker.deployment.name)
        env[KEY_ENV] = deployment_worker_key(worker.deployment)
        env[SCRAPE_TOKEN_ENV] = scrape_token()
    elif worker.revision is not None and engine_of(worker.revision.engine_settings) == VLLM:
        env.update(vllm_command(worker, 0)[1])  # its secret as VLLM_API_KEY, its CPU binding and KV space
    elif worker.revision is not None:
        env[SECRET_ENV] = worker_secret_for(worker.deployment, worker.revision.number)
    if gpu_index is not None:
        # The process sees only its GPU (as cuda:0), so `--device cuda` lands on the one picked for it. The index is
        # NVML's (PCI bus order); CUDA numbers GPUs fastest first unless told, so on a host with mixed GPUs the
        # worker would run on another GPU than the one placed, metered and faulted.
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_index)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def handle_of(worker: Worker) -> processes.ProcessHandle | None:
    """The process identity recorded on the row: pid, create time (stored as started_at) and the id marker."""
    if worker.pid is None or worker.started_at is None:
        return None
    return processes.ProcessHandle(pid=worker.pid, create_time=worker.started_at.timestamp(), marker=str(worker.id))
