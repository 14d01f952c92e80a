"""Profile jobs: queue one for the Celery worker, claim it, run it (start separate workers of the revision, drive
them with the load driver, calibrate, store through profiles.profile_save) and record its outcome on the row.

A profile run never touches a serving worker: its workers are Worker rows of purpose `profile` (in no pool, never in
the gateway's membership, never scraped), placed on a node of the profiled node class and started and stopped by
that node's agent like every other worker (controlplane.supervision.profile_workers). The run drives them over HTTP
from wherever it runs (the Celery control worker, or `tandem_profile`), and stops them when it is done, whatever
happened.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.capacity.load_driver import Levels, ProfileError, drive, wait_healthy
from controlplane.capacity.models import Profile, ProfileJob, ProfileJobStatus
from controlplane.capacity.selectors import ProfilePlacement, profile_placement
from controlplane.capacity.services.profiles import profile_save
from controlplane.capacity.sizing.calibration import model_from_points
from controlplane.errors import ControlPlaneError, conflict, invalid
from controlplane.lib.worker_keys import worker_secret_for
from controlplane.models import Deployment, DeploymentMode, Pool, Worker, WorkerStatus
from controlplane.supervision.placement import selector_text
from controlplane.supervision.profile_workers import profile_worker_start, profile_workers_stop
from inference.worker_secret import SECRET_HEADER

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
    workers would run on a node with the deployment's serving workers and `allow_shared_host` is off
    (shared_host_check)."""
    from controlplane.celery import CONTROL_QUEUE, task_send

    revision = deployment.current_revision
    if revision is None:
        raise invalid(f"deployment {deployment.name!r} has no revision to profile", field="deployment")
    if not isinstance(quick, bool):
        raise invalid("quick must be true or false", field="quick")
    roles = _roles(deployment)
    node_class = node_class or node_class_of(deployment, roles[-1])
    if not allow_shared_host:
        for role in roles:
            shared_host_check(deployment, profile_placement(deployment, role, node_class))
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


def _roles(deployment: Deployment) -> tuple[str, ...]:
    return ("colocated",) if deployment.mode == DeploymentMode.COLOCATED else ("prefill", "decode")


def shared_host_check(deployment: Deployment, placement: ProfilePlacement) -> None:
    """Refuse (409) to profile on a node where this deployment's serving workers run: the profiling worker would
    take their CPU or GPU and so disturb production traffic. The node is the one the run's worker would be placed
    on (capacity.selectors.profile_placement prefers a node without them)."""
    num = placement.num_serving
    if num:
        raise conflict(f"deployment {deployment.name!r} serves from {num} worker(s) on node {placement.node.name}, "
                       f"the only node a profile run can use ({selector_text(placement.selector) or 'any node'}); a "
                       f"profile run there would compete with them and disturb production traffic. Run it on "
                       f"another node of that class, or allow it explicitly (allow_shared_host: true, "
                       f"--allow-shared-host)", num_serving=num, node=placement.node.name)


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


class _AgentWorkers:
    """The run's workers: Worker rows of purpose `profile`, started and stopped by their nodes' agents."""

    def __init__(self, deployment: Deployment, *, node_class: str, allow_shared_host: bool):
        self.deployment, self.node_class, self.allow_shared_host = deployment, node_class, allow_shared_host
        self.ids: list[int] = []

    def start(self, role: str, ready_timeout: float) -> tuple[str, dict]:
        """Place, ask the node's agent to start it, wait until its /health answers; (url, its /info)."""
        placement = profile_placement(self.deployment, role, self.node_class)
        if placement.node is None or not placement.online:
            raise ProfileError(f"no online node matches {selector_text(placement.selector) or 'any node'} for the "
                               f"{role} profiling worker: start a node agent of node class {self.node_class}")
        if not self.allow_shared_host:
            shared_host_check(self.deployment, placement)
        worker = profile_worker_start(deployment=self.deployment, revision=self.deployment.current_revision,
                                      role=role, node=placement.node)
        self.ids.append(worker.id)
        deadline = time.monotonic() + ready_timeout
        row = self._row(worker.id)
        while row.pid is None or row.port is None:
            # Not started yet; a start that failed is back to pending for a restart (restart_count) or given up.
            if row.status not in (WorkerStatus.PENDING, WorkerStatus.STARTING) or row.restart_count:
                raise ProfileError(self._failure(row, role))
            if time.monotonic() > deadline:
                raise ProfileError(f"the {role} profiling worker {worker.id} was not started within "
                                   f"{ready_timeout:.0f} s: is the node agent of {placement.node.name} running?")
            time.sleep(0.2)
            row = self._row(worker.id)
        pid = row.pid

        def alive() -> bool:
            current = self._row(worker.id)
            return current.pid == pid and current.status in (WorkerStatus.STARTING, WorkerStatus.READY)

        try:
            info = wait_healthy(row.url, timeout=max(1.0, deadline - time.monotonic()), alive=alive,
                                warmup_timeout=settings.TANDEM_WARMUP_TIMEOUT_S)
        except ProfileError as exc:
            raise ProfileError(f"{exc}; {self._failure(self._row(worker.id), role)}") from exc
        return row.url, info

    @staticmethod
    def _row(worker_id: int) -> Worker:
        row = Worker.objects.filter(pk=worker_id).only("id", "status", "pid", "host", "port", "last_error",
                                                       "log_path", "restart_count").first()
        if row is None:
            raise ProfileError(f"profiling worker {worker_id} is gone (was the deployment deleted?)")
        return row

    @staticmethod
    def _failure(row: Worker, role: str) -> str:
        """What went wrong with a profiling worker: its row's status and last error, and its log's end where the
        log is on this host."""
        text = f"the {role} profiling worker {row.id} is {row.status}: {row.last_error or 'no error reported'}"
        log_path = Path(row.log_path) if row.log_path else None
        if log_path is not None and log_path.is_file():
            text += "; its log ends:\n" + log_path.read_text(errors="replace")[-1500:]
        return text

    def close(self) -> None:
        """Stop every worker of the run through its agent, and wait (bounded) until they have stopped."""
        if not self.ids:
            return
        profile_workers_stop(worker_ids=self.ids, reason="its profile run ended")
        deadline = time.monotonic() + settings.TANDEM_STOP_DEADLINE_S + 10
        left = Worker.objects.filter(id__in=self.ids).exclude(status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED))
        while left.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if left.exists():
            log.warning("profile workers %s of %s were still stopping when the run ended", list(
                left.values_list("id", flat=True)), self.deployment.name)


def profile_run(*, deployment: Deployment, quick: bool = False, node_class: str | None = None,
                job: ProfileJob | None = None, echo=None, ready_timeout: float = 180.0,
                allow_shared_host: bool | None = None) -> list[Profile]:
    """Profile the current revision of `deployment` and store one Profile per role it runs.

    1. stop any profile worker of the deployment left by an earlier run that died (one job runs at a time);
    2. start a separate worker per role (disaggregated: a prefill and a decode worker; colocated: one) on a node of
       the node class, through its node agent (_AgentWorkers);
    3. drive them at increasing levels (load_driver.Levels; `quick` for tests), reporting progress to `echo` and
       the job;
    4. fit the curves and store the points per (revision, node class, role), replacing earlier synthetic points and
       keeping live ones; 5. stop the workers, whatever happened.
    """
    revision = deployment.current_revision
    if revision is None:
        raise invalid(f"deployment {deployment.name!r} has no revision to profile", field="deployment")
    colocated = deployment.mode == DeploymentMode.COLOCATED
    roles = _roles(deployment)
    node_class = node_class or node_class_of(deployment, roles[-1])
    if allow_shared_host is None:
        allow_shared_host = job.allow_shared_host if job is not None else False
    progress = _progress_writer(job, echo)
    profile_workers_stop(deployment=deployment, reason="left over from an earlier profile run")
    started = _AgentWorkers(deployment, node_class=node_class, allow_shared_host=allow_shared_host)
    try:
        progress(0.0, f"starting {' and '.join(roles)} profiling worker(s)")
        urls, infos = {}, {}
        for role in roles:
            urls[role], infos[role] = started.start(role, ready_timeout)
        serving = urls["colocated"] if colocated else urls["prefill"]
        decode_info = infos["colocated" if colocated else "decode"]
        levels = Levels.for_run(quick=quick, max_model_len=min(i["max_model_len"] for i in infos.values()),
                                max_num_seqs=decode_info["max_num_seqs"])
        # The profiling workers hold the revision's worker secret, as its serving workers do.
        points = drive(serving_url=serving, decode_url=None if colocated else urls["decode"], levels=levels,
                       progress=lambda f, s: progress(0.05 + 0.9 * f, s),
                       headers={SECRET_HEADER: worker_secret_for(deployment, revision.number)})
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
