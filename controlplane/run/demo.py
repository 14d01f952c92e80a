"""What `make run` sets up before it starts the stack: the demo model, the admin user, the `demo` deployment;
and the light stream of demo requests it sends once the gateway answers."""
from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q

from inference.hardware import cpu_decodes_int8_fast, cpu_has_native_bfloat16

log = logging.getLogger(__name__)

DEMO_NAME = "demo"
# Greedy: a small instruct model sampled at OpenAI's default temperature 1 rambles; greedy it answers sensibly.
# max_tokens bounds a chat request that names none (else it runs to the end of the context, slow on a CPU when a
# greedy answer repeats itself).
DEMO_SAMPLING_DEFAULTS = {"temperature": 0.0, "max_tokens": 256}
# The demo stays one machine: make run's node agent labels this node so, and both demo pools select it, so that the
# demo places its workers through node selectors as a fleet does (there: class=compute for prefill, class=bandwidth
# for decode on separate hosts; a label has one value, so one host cannot be both classes).
DEMO_NODE_LABELS = {"tandem.demo": "true"}
ADMIN_USERNAME = "admin"
MODEL_FOLDERS = {"tiny": "tiny", "smollm2": "smollm2-135m"}


def model_prepare(name: str) -> Path:
    """`python -m inference.models prepare NAME` (instant when already built); returns the model folder."""
    out, args = model_target(name)
    subprocess.run([sys.executable, "-m", "inference.models", "prepare", name, "--out", str(out), *args],
                   check=True, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, timeout=900)
    return out


def model_target(name: str) -> tuple[Path, list[str]]:
    """Where the demo model goes and the extra `prepare` arguments.

    SmolLM2 is saved in the dtype that `auto` runs on this host: bfloat16 where the CPU computes it natively, else
    float32 (a folder of its own, `smollm2-135m-float32`). The workers then map the saved weights as they are, so
    both demo workers share one copy in the page cache; weights converted at load would be a private copy in each
    (a whole float32 copy of the model more per worker loading a bfloat16 folder)."""
    folder = MODEL_FOLDERS[name]
    if name != "smollm2":
        return settings.TANDEM_MODELS_DIR / folder, []
    dtype = "bfloat16" if cpu_has_native_bfloat16() else "float32"
    suffix = "" if dtype == "bfloat16" else f"-{dtype}"
    return settings.TANDEM_MODELS_DIR / f"{folder}{suffix}", ["--dtype", dtype]


def demo_engine_settings() -> tuple[dict, str]:
    """The demo's engine settings, per role what runs fastest on this CPU, and why in words (the revision's comment,
    shown on the deployment page beside the settings).

    - prefill is compute-bound: it runs `auto`, bfloat16 where the CPU computes it natively (its matmul peak is the
      higher), float32 elsewhere (inference/engine/precision.py);
    - decode is memory-bound (every step streams the weights): INT8 weights, a quarter of float32's bytes, where
      they step faster than float32 ones (inference.hardware.cpu_decodes_int8_fast: an int8 dot product, VNNI,
      AMX-INT8 or Arm's, for fbgemm; else AVX2 with FMA for Tandem's int8 kernel, which `auto` takes there: with AVX2
      only its single-stream step is far faster than fbgemm's), its KV cache in prefill's dtype
      (precision.int8_activations), so the KV handoff needs no conversion. On a CPU with neither, decode runs as
      prefill does.
    With AVX512-BF16 and VNNI, INT8 weights with bfloat16 activations stepped several times faster than float32 or
    bfloat16 ones, and bfloat16 prefilled several times faster than float32 (docs/engine.md, "Precision"). INT8
    prefill was faster still but is not picked: it would change every prompt's KV, not only the weights decode
    streams. The INT8 decode pick is off unless TANDEM_DEMO_DECODE_INT8=1: the decode worker's INT8 weights are its
    own (not the file both workers map), which takes the demo over the 2 GB it must fit in.
    """
    common = {"threads": 1}
    if not settings.TANDEM_DEMO_DECODE_INT8:
        return {"common": common}, (
            "make run: both roles run dtype auto; INT8 decode weights (TANDEM_DEMO_DECODE_INT8=1, where the CPU has an "
            "int8 dot product) step faster but take ~0.5 GiB more, over the demo's 2 GB")
    if not cpu_decodes_int8_fast():
        return {"common": common}, ("make run: both roles run dtype auto (neither an int8 dot product nor AVX2 on this "
                                    "CPU, so INT8 weights would not pay in decode)")
    return {"common": common, "decode": {"quantization": "int8"}}, (
        "make run picked per role for this CPU: prefill dtype auto (compute-bound: "
        f"{'bfloat16, computed natively here' if cpu_has_native_bfloat16() else 'float32, no native bfloat16 here'}"
        "); decode INT8 weights (memory-bound: a quarter of float32's bytes per step, and this CPU steps them "
        "faster than float32: an int8 dot product or AVX2)")


@dataclass(frozen=True, slots=True)
class AdminLogin:
    username: str
    password: str | None  # only when it was set now (generated or from TANDEM_ADMIN_PASSWORD)
    token: str
    generated: bool
    from_env: bool = False  # TANDEM_ADMIN_PASSWORD is set (and is the password now), on every run


def admin_ensure() -> AdminLogin:
    """The superuser `admin`: password from TANDEM_ADMIN_PASSWORD, else generated on first run and shown once
    (only its hash is stored). Returns its `make run` API token: the one the last run printed while it still works
    (a shell that kept it goes on working), else a new one. Tokens are stored hashed, so the key itself is kept in
    var/admin_token (0600, in the 0700 var folder, beside the secret key)."""
    from controlplane.services.tokens import token_issue, token_user

    User = get_user_model()
    wanted = settings.TANDEM_ADMIN_PASSWORD
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=ADMIN_USERNAME,
                                                   defaults={"is_staff": True, "is_superuser": True})
        password, generated = None, False
        if wanted and (created or not user.check_password(wanted)):
            password = wanted
        elif created:
            password, generated = secrets.token_urlsafe(12), True
        if password is not None:
            user.set_password(password)
        if not (user.is_staff and user.is_superuser):
            user.is_staff = user.is_superuser = True
        user.save()
        saved = admin_token_path()
        key = saved.read_text().strip() if saved.is_file() else ""
        if not key or token_user(key) != user:
            key = token_issue(user=user, name="make run", replace=True)
            saved.touch(mode=0o600)
            saved.chmod(0o600)
            saved.write_text(key + "\n")
    return AdminLogin(ADMIN_USERNAME, password, key, generated, from_env=bool(wanted))


def admin_token_path() -> Path:
    return settings.VAR_DIR / "admin_token"


def demo_gateway_pids() -> set[int]:
    """The processes of the demo's own gateway (a previous run that was killed leaves it running; the agent adopts
    it again), which may hold the gateway port without it being "in use"."""
    from controlplane.models import Worker, WorkerRole
    from controlplane.models.workers import LIVE_STATUSES

    return set(Worker.objects.filter(deployment__name=DEMO_NAME, role=WorkerRole.GATEWAY, status__in=LIVE_STATUSES,
                                     pid__isnull=False).values_list("pid", flat=True))


def demo_deployment_ensure(model_path: Path) -> tuple[object, str]:
    """The `demo` deployment (1 prefill, 1 decode, both on the node labelled DEMO_NODE_LABELS, gateway on
    TANDEM_GATEWAY_PORT), created through the service,
    serving its model in the model's own dtype (`auto`: bfloat16 for SmolLM2, float32 for the tiny model), with
    greedy sampling defaults (DEMO_SAMPLING_DEFAULTS) so that SmolLM2 answers sensibly out of the box. When it
    exists: a changed TANDEM_DEMO_MODEL, or a fixed dtype that an earlier `make run` wrote (float32, before `auto`
    existed), rolls it to a new revision (a dtype an operator chose stays); a changed TANDEM_GATEWAY_PORT moves its
    gateway there; and its failed workers get a new try (a run is a fresh start: a gateway that crash-looped on a busy
    port last time would otherwise keep its slot and never start). Returns (deployment, what was done)."""
    from controlplane.models import ActionKind, Deployment
    from controlplane.services.actions import Actor, enqueue_reconcile
    from controlplane.services.deployments import deployment_create, deployment_sampling_defaults_set
    from controlplane.services.revisions import revision_create

    actor = Actor.system("tandem_run")
    engine_settings, why = demo_engine_settings()
    deployment = Deployment.objects.select_related("current_revision").filter(name=DEMO_NAME).first()
    if deployment is None:
        action = deployment_create(
            name=DEMO_NAME, mode="disaggregated", model_path=str(model_path), dtype="auto", comment=why,
            engine_settings=engine_settings, sampling_defaults=DEMO_SAMPLING_DEFAULTS,
            replicas={"prefill": 1, "decode": 1},
            placement={role: {"node_selector": dict(DEMO_NODE_LABELS)} for role in ("prefill", "decode")},
            gateway_port=settings.TANDEM_GATEWAY_PORT, actor=actor, reason="make run: the demo deployment")
        return action.deployment, "created"
    done = []
    if not deployment.sampling_defaults and not deployment.actions.filter(kind=ActionKind.SAMPLING).exists():
        # A demo created before sampling defaults existed; one whose defaults an operator set (or cleared) keeps
        # them.
        deployment_sampling_defaults_set(deployment=deployment, sampling_defaults=DEMO_SAMPLING_DEFAULTS,
                                         actor=actor, reason="make run: greedy sampling defaults for the demo")
        done.append("greedy sampling defaults set")
    if deployment.gateway_port != settings.TANDEM_GATEWAY_PORT:
        previous = deployment.gateway_port
        demo_gateway_move(deployment, port=settings.TANDEM_GATEWAY_PORT, actor=actor)
        done.append(f"gateway moved from port {previous} to {deployment.gateway_port} (TANDEM_GATEWAY_PORT)")
    revived = demo_failed_restart(deployment, actor=actor)
    if revived:
        done.append(f"failed workers restarted: {', '.join(revived)}")
    current = deployment.current_revision
    # A revision without a user was written by make run itself; one with a user is an operator's choice.
    made_by_make_run = current is not None and current.created_by_id is None
    if current is not None and Path(current.model_path).resolve() != model_path.resolve():
        revision_create(deployment=deployment, actor=actor, model_path=str(model_path),
                        dtype="auto" if made_by_make_run else None,
                        engine_settings=engine_settings if made_by_make_run else None,
                        comment=f"make run: TANDEM_DEMO_MODEL={settings.TANDEM_DEMO_MODEL}",
                        reason="the demo model changed")
        done.insert(0, f"new revision for model {model_path.name}")
    elif made_by_make_run and current.dtype != "auto":
        revision_create(deployment=deployment, actor=actor, dtype="auto",
                        comment="make run: the demo serves its model in the model's own dtype",
                        reason=f"the demo's dtype was make run's earlier fixed {current.dtype}")
        done.insert(0, f"new revision with dtype auto (was {current.dtype})")
    elif made_by_make_run and current.engine_settings != engine_settings:
        revision_create(deployment=deployment, actor=actor, engine_settings=engine_settings, comment=why,
                        reason="make run picks the demo's engine settings per role for this CPU")
        done.insert(0, "new revision with engine settings picked per role for this CPU")
    else:
        enqueue_reconcile(deployment.id)
    return deployment, "; ".join(done) or "exists"


def demo_gateway_move(deployment, *, port: int, actor):
    """Move a deployment's gateway to `port`, recorded as a `restart` action of the gateway (the setting changed
    while no service offers this verb; make run is its only caller).

    The agent starts a gateway on its deployment's gateway_port, so a stopped gateway comes back on the new port
    when reconcile creates the next one. One still running or failed (a previous run was killed, or its port was
    busy) keeps its slot: it is restarted through worker_restart, which starts it on the new port.
    Raises ControlPlaneError (409) when another deployment's gateway has that port.
    """
    from controlplane.errors import conflict
    from controlplane.models import ActionKind, ActionStatus, Deployment, Worker, WorkerRole, WorkerStatus
    from controlplane.services.actions import action_create, enqueue_reconcile
    from controlplane.services.deployments import deployment_gateway_port_set
    from controlplane.services.workers import worker_restart

    with transaction.atomic():
        locked = Deployment.objects.select_for_update(of=("self",)).get(pk=deployment.pk)
        previous = locked.gateway_port
        other = Deployment.objects.filter(gateway_port=port).exclude(pk=locked.pk).first()
        if other is not None:
            raise conflict(f"port {port} is the gateway port of deployment {other.name!r}; set TANDEM_GATEWAY_PORT "
                           f"to another port (the demo's is {previous})", field="gateway_port")
        deployment_gateway_port_set(deployment=locked, port=port)
        reason = f"TANDEM_GATEWAY_PORT changed: the demo's gateway moves from port {previous} to {port}"
        action = action_create(kind=ActionKind.RESTART, actor=actor, deployment=locked, reason=reason,
                               status=ActionStatus.SUCCEEDED,
                               params={"role": WorkerRole.GATEWAY, "from_port": previous, "to_port": port})
        running = Worker.objects.filter(deployment=locked, role=WorkerRole.GATEWAY, status__in=(
            WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.FAILED))
        for gateway in running:
            worker_restart(worker=gateway, actor=actor, reason=reason)
        enqueue_reconcile(locked.pk)
    deployment.gateway_port = port
    return action


def demo_failed_restart(deployment, *, actor) -> list[str]:
    """Restart (worker_restart) the demo's failed workers that keep a slot; returns them as 'gateway #5'."""
    from controlplane.errors import ControlPlaneError
    from controlplane.models import Worker, WorkerRole, WorkerStatus
    from controlplane.services.workers import worker_restart

    failed = (Worker.objects.filter(deployment=deployment, status=WorkerStatus.FAILED)
              .filter(Q(role=WorkerRole.GATEWAY) | Q(revision_id=deployment.current_revision_id)).order_by("id"))
    revived = []
    for worker in failed:
        try:
            worker_restart(worker=worker, actor=actor, reason="make run started again: a failed worker gets a new try")
        except ControlPlaneError:
            continue  # a restart of it is already pending
        revived.append(f"{worker.role} #{worker.pk}")
    return revived


class NotReady(Exception):
    """The demo will not become ready without help; the message says what went wrong."""


def gateway_ready(gateway_url: str) -> bool:
    """The gateway's /health: 200 once its membership has a group of ready workers that can serve."""
    try:
        response = requests.get(f"{gateway_url}/health", timeout=2)
        return response.status_code == 200 and response.json().get("status") == "ok"
    except (requests.RequestException, ValueError):
        return False


def gateway_wait(gateway_url: str, *, timeout_s: float, is_running=lambda: True, check=lambda: None,
                 interval_s: float = 0.5) -> float | None:
    """Wait until the gateway says it can serve (gateway_ready): health, not traffic, so that the wait sends no
    request that the gateway would count as an error. Returns the seconds waited, or None when `is_running()`
    turned false (Ctrl-C). Raises TimeoutError after timeout_s, and whatever `check()` raises (NotReady: a worker
    that failed) on the way."""
    started = time.monotonic()
    while is_running():
        if gateway_ready(gateway_url):
            return time.monotonic() - started
        check()
        if time.monotonic() - started >= timeout_s:
            raise TimeoutError(f"the demo gateway at {gateway_url} did not answer within {timeout_s:g} s")
        time.sleep(interval_s)
    return None


def error_summary(last_error: str) -> str:
    """A worker's last_error in one line: what happened and the last line of the log tail the agent attached
    (for a crash, the exception: 'process exited (exit code 1): OSError: [Errno 98] ... address already in use')."""
    lines = [line.strip() for line in (last_error or "").splitlines() if line.strip()]
    if not lines:
        return "no error recorded"
    text = lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"
    return text if len(text) <= 300 else text[:297] + "..."


class DemoWatch:
    """What happens to the demo's workers while make run waits for them, in lines for the terminal: each restart
    (with the reason the agent reported) as it happens, and NotReady for a worker that failed since `since`."""

    def __init__(self, deployment_id: int, *, since, report=print):
        self.deployment_id, self.since, self.report = deployment_id, since, report
        self._seen: dict[int, int] = {}

    def __call__(self) -> None:
        from controlplane.models import Worker, WorkerStatus

        workers = Worker.objects.filter(deployment_id=self.deployment_id).exclude(status=WorkerStatus.STOPPED)
        for worker in workers.order_by("id"):
            first_line = error_summary(worker.last_error)
            where = f"{worker.role} worker #{worker.pk}" + (f" (port {worker.port})" if worker.port else "")
            log = f" (log: {worker.log_path})" if worker.log_path else ""
            if worker.status == WorkerStatus.FAILED and worker.stopped_at and worker.stopped_at >= self.since:
                raise NotReady(f"the demo's {where} failed: {first_line}{log}")
            seen = self._seen.setdefault(worker.pk, worker.restart_count)
            if worker.restart_count > seen:
                self._seen[worker.pk] = worker.restart_count
                self.report(f"the demo's {where} is restarting: {first_line}{log}")
