"""Profile jobs: queue one for the Celery worker, claim it, run it (start separate workers of the revision, drive
them with the load driver, calibrate, store through profiles.profile_save) and record its outcome on the row.

A profile run never touches a serving worker: it starts its own workers from the revision's command line (the
node agent's `argv_for`, on a port of its own) on the host that runs it, and stops them when it is done.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from controlplane.agent.launch import argv_for, env_for
from controlplane.agent.processes import free_port
from controlplane.capacity.load_driver import Levels, ProfileError, drive, wait_healthy
from controlplane.capacity.models import Profile, ProfileJob, ProfileJobStatus
from controlplane.capacity.services.profiles import profile_save
from controlplane.capacity.sizing.calibration import model_from_points
from controlplane.errors import ControlPlaneError, conflict, invalid
from controlplane.models import Deployment, DeploymentMode, Pool, Worker

log = logging.getLogger(__name__)

PROFILE_TASK = "controlplane.capacity.tasks.profile_task"


def node_class_of(deployment: Deployment, role: str) -> str:
    """The node class a pool's workers run on: its node selector's `class` label, else "default"."""
    pool = Pool.objects.filter(deployment=deployment, role=role).first()
    return str((pool.node_selector or {}).get("class", "default")) if pool is not None else "default"


def profile_job_create(*, deployment: Deployment, actor_user=None, quick: bool = False,
                       node_class: str | None = None, enqueue: bool = True,
                       allow_shared_host: bool = False) -> ProfileJob:
    """A pending profile job of the deployment's current revision, sent to the Celery worker after commit. 409 while
    another job of the deployment is pending or running (two runs would measure each other's load); 409 when its
    serving workers run on this host and `allow_shared_host` is off (shared_host_check)."""
    from controlplane.celery import CONTROL_QUEUE, task_send

    revision = deployment.current_revision
    if revision is None:
        raise invalid(f"deployment {deployment.name!r} has no revision to profile", field="deployment")
    if not isinstance(quick, bool):
        raise invalid("quick must be true or false", field="quick")
    roles = ("colocated",) if deployment.mode == DeploymentMode.COLOCATED else ("prefill", "decode")
    node_class = node_class or node_class_of(deployment, roles[-1])
    if not allow_shared_host:
        shared_host_check(deployment)
    with transaction.atomic():
        busy = ProfileJob.objects.select_for_update().filter(
            deployment=deployment, status__in=(ProfileJobStatus.PENDING, ProfileJobStatus.RUNNING)).first()
        if busy is not None:
            raise conflict(f"profile job #{busy.pk} of {deployment.name!r} is still {busy.status}",
                           job=busy.pk)
        job = ProfileJob.objects.create(deployment=deployment, revision=revision, node_class=node_class,
                                        quick=quick, requested_by=actor_user,
                                        allow_shared_host=allow_shared_host)
        if enqueue:
            transaction.on_commit(lambda: task_send(PROFILE_TASK, args=(job.pk,), queue=CONTROL_QUEUE))
    return job


def shared_host_check(deployment: Deployment) -> None:
    """Refuse (409) to profile on a host where this deployment's serving workers run: the profiling worker would
    take their CPU or GPU and so disturb production traffic. "This host": a node named TANDEM_NODE_NAME or reached at
    a loopback address."""
    serving = Worker.objects.filter(deployment=deployment, status__in=("starting", "ready", "draining")) \
        .exclude(role="gateway").filter(models.Q(node__name=settings.TANDEM_NODE_NAME)
                                        | models.Q(node__address__in=("127.0.0.1", "localhost", "::1")))
    num = serving.count()
    if num:
        raise conflict(f"deployment {deployment.name!r} serves from {num} worker(s) on this host; a profile run here "
                       f"would compete with them and disturb production traffic. Run it on another host, or "
                       f"allow it explicitly (allow_shared_host: true, --allow-shared-host)", num_serving=num)


def _progress_writer(job: ProfileJob | None, echo):
    last = [0.0]

    def progress(fraction: float, step: str) -> None:
        if echo is not None:
            echo(fraction, step)
        now = time.monotonic()
        if job is not None and (now - last[0] > 0.5 or fraction >= 1.0):
            last[0] = now
            ProfileJob.objects.filter(pk=job.pk).update(progress=round(min(max(fraction, 0.0), 1.0), 4),
                                                        step=step[:200])
    return progress


class _Started:
    """Workers of a profile run: started from the revision's own command line, stopped in `close`."""

    def __init__(self, log_dir: Path):
        self.procs: list[subprocess.Popen] = []
        self.log_dir = log_dir

    def start(self, deployment: Deployment, role: str, ready_timeout: float) -> tuple[str, dict]:
        pool = Pool.objects.filter(deployment=deployment, role=role).first()
        worker = Worker(deployment=deployment, pool=pool, role=role, revision=deployment.current_revision,
                        host="127.0.0.1")  # never saved: the serving pools do not count it
        port = free_port()
        argv = argv_for(worker, port)
        env = env_for(worker)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"profile-{deployment.name}-{role}-{port}.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            info = wait_healthy(url, timeout=ready_timeout, alive=lambda: proc.poll() is None)
        except ProfileError as exc:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise ProfileError(f"{exc}; its log ends:\n{tail}") from exc
        return url, info

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def profile_run(*, deployment: Deployment, quick: bool = False, node_class: str | None = None,
                job: ProfileJob | None = None, echo=None, ready_timeout: float = 180.0) -> list[Profile]:
    """Profile the current revision of `deployment` and store one Profile per role it runs.

    1. start a separate worker per role (disaggregated: a prefill and a decode worker; colocated: one) on free ports;
    2. drive them at increasing levels (load_driver.Levels; `quick` for tests), reporting progress to `echo` and
       the job;
    3. fit the curves and store the points per (revision, node class, role), replacing earlier synthetic points and
       keeping live ones; 4. stop the workers, whatever happened.
    """
    revision = deployment.current_revision
    if revision is None:
        raise invalid(f"deployment {deployment.name!r} has no revision to profile", field="deployment")
    colocated = deployment.mode == DeploymentMode.COLOCATED
    roles = ("colocated",) if colocated else ("prefill", "decode")
    node_class = node_class or node_class_of(deployment, roles[-1])
    progress = _progress_writer(job, echo)
    started = _Started(Path(settings.TANDEM_LOG_DIR))
    try:
        progress(0.0, f"starting {' and '.join(roles)} profiling worker(s)")
        urls, infos = {}, {}
        for role in roles:
            urls[role], infos[role] = started.start(deployment, role, ready_timeout)
        serving = urls["colocated"] if colocated else urls["prefill"]
        decode_info = infos["colocated" if colocated else "decode"]
        levels = Levels.for_run(quick=quick, max_model_len=min(i["max_model_len"] for i in infos.values()),
                                max_num_seqs=decode_info["max_num_seqs"])
        points = drive(serving_url=serving, decode_url=None if colocated else urls["decode"], levels=levels,
                       progress=lambda f, s: progress(0.05 + 0.9 * f, s))
    finally:
        started.close()
    serving_info = infos[roles[-1]]
    layout = serving_info.get("kv_layout") or {}
    calibrated = model_from_points(points, layout="colocated" if colocated else "disaggregated",
                                   max_num_seqs=int(serving_info["max_num_seqs"]),
                                   max_batch_tokens=int(infos[roles[0]]["max_num_batched_tokens"]),
                                   kv_capacity_tokens=int(serving_info["num_kv_blocks"])
                                   * int(layout.get("block_size", 16)))
    for burst in points.get("saturation", []):
        burst["request_overhead_s"] = calibrated.request_overhead_s
    stored = []
    for role in roles:
        part = {"colocated": points, "prefill": {"prefill": points["prefill"]},
                "decode": {"decode": points["decode"], "saturation": points.get("saturation", [])}}[role]
        stored.append(profile_save(revision=revision, node_class=node_class, role=role, points=part,
                                   info=infos[role]))
    progress(1.0, f"stored {len(stored)} profile(s)")
    return stored


def profile_job_start(job_id: int) -> ProfileJob | None:
    """Claim a pending job (a conditional UPDATE: a task delivered twice runs it once). None: already claimed."""
    num_updated = ProfileJob.objects.filter(pk=job_id, status=ProfileJobStatus.PENDING).update(
        status=ProfileJobStatus.RUNNING, started_at=timezone.now(), step="starting")
    if num_updated != 1:
        return None
    return ProfileJob.objects.select_related("deployment", "revision").get(pk=job_id)


def profile_job_run(job_id: int, *, echo=None) -> ProfileJob | None:
    """The Celery task's (and the command's) body: claim, run, record the outcome on the row."""
    job = profile_job_start(job_id)
    if job is None:
        return None
    deployment = job.deployment
    if deployment.current_revision_id != job.revision_id:
        return profile_job_fail(job_id, "the deployment moved to another revision since the job was queued")
    try:
        profiles = profile_run(deployment=deployment, quick=job.quick, node_class=job.node_class, job=job,
                               echo=echo)
    except (ProfileError, ControlPlaneError, OSError, ValueError) as exc:
        return profile_job_fail(job_id, str(getattr(exc, "message", exc)))
    ProfileJob.objects.filter(pk=job_id).update(status=ProfileJobStatus.SUCCEEDED, progress=1.0,
                                                finished_at=timezone.now(), profiles=[p.pk for p in profiles])
    return ProfileJob.objects.get(pk=job_id)


def profile_job_fail(job_id: int, error: str) -> ProfileJob:
    ProfileJob.objects.filter(pk=job_id).exclude(status=ProfileJobStatus.SUCCEEDED).update(
        status=ProfileJobStatus.FAILED, error=error[:4000], finished_at=timezone.now())
    return ProfileJob.objects.get(pk=job_id)
