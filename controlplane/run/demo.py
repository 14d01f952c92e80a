"""What `make run` sets up before it starts the stack: the demo model, the admin user, the `demo` deployment;
and the light stream of demo requests it sends once the gateway answers."""
from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

log = logging.getLogger(__name__)

DEMO_NAME = "demo"
ADMIN_USERNAME = "admin"
MODEL_FOLDERS = {"tiny": "tiny", "smollm2": "smollm2-135m"}
DEMO_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three colours:",
    "Once upon a time",
]


def model_prepare(name: str) -> Path:
    """`python -m inference.models prepare NAME` (instant when already built); returns the model folder."""
    out = settings.TANDEM_MODELS_DIR / MODEL_FOLDERS[name]
    subprocess.run([sys.executable, "-m", "inference.models", "prepare", name, "--out", str(out)],
                   check=True, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, timeout=900)
    return out


@dataclass(frozen=True, slots=True)
class AdminLogin:
    username: str
    password: str | None  # only when it was set now (generated or from TANDEM_ADMIN_PASSWORD)
    token: str
    generated: bool
    from_env: bool = False  # TANDEM_ADMIN_PASSWORD is set (and is the password now), on every run


def admin_ensure() -> AdminLogin:
    """The superuser `admin`: password from TANDEM_ADMIN_PASSWORD, else generated on first run and shown once
    (only its hash is stored). Returns its API token too."""
    from rest_framework.authtoken.models import Token

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
        token, _ = Token.objects.get_or_create(user=user)
    return AdminLogin(ADMIN_USERNAME, password, token.key, generated, from_env=bool(wanted))


def demo_deployment_ensure(model_path: Path) -> tuple[object, str]:
    """The `demo` deployment (1 prefill, 1 decode, gateway on TANDEM_GATEWAY_PORT), created through the service,
    serving its model in the model's own dtype (`auto`: bfloat16 for SmolLM2, float32 for the tiny model). When it
    exists with another model (TANDEM_DEMO_MODEL changed), or with a fixed dtype that an earlier `make run` wrote
    (float32, before `auto` existed), a new revision rolls it over; a dtype an operator chose stays. Returns
    (deployment, what was done)."""
    from controlplane.models import Deployment
    from controlplane.services.actions import Actor, enqueue_reconcile
    from controlplane.services.deployments import deployment_create
    from controlplane.services.revisions import revision_create

    actor = Actor.system("tandem_run")
    deployment = Deployment.objects.select_related("current_revision").filter(name=DEMO_NAME).first()
    if deployment is None:
        action = deployment_create(
            name=DEMO_NAME, mode="disaggregated", model_path=str(model_path), dtype="auto",
            engine_settings={"threads": 1}, replicas={"prefill": 1, "decode": 1},
            gateway_port=settings.TANDEM_GATEWAY_PORT, actor=actor, reason="make run: the demo deployment")
        return action.deployment, "created"
    current = deployment.current_revision
    # A revision without a user was written by make run itself; one with a user is an operator's choice.
    made_by_make_run = current is not None and current.created_by_id is None
    if current is not None and Path(current.model_path).resolve() != model_path.resolve():
        revision_create(deployment=deployment, actor=actor, model_path=str(model_path),
                        dtype="auto" if made_by_make_run else None,
                        comment=f"make run: TANDEM_DEMO_MODEL={settings.TANDEM_DEMO_MODEL}",
                        reason="the demo model changed")
        return deployment, f"new revision for model {model_path.name}"
    if made_by_make_run and current.dtype != "auto":
        revision_create(deployment=deployment, actor=actor, dtype="auto",
                        comment="make run: the demo serves its model in the model's own dtype",
                        reason=f"the demo's dtype was make run's earlier fixed {current.dtype}")
        return deployment, f"new revision with dtype auto (was {current.dtype})"
    enqueue_reconcile(deployment.id)
    return deployment, "exists"


def completion(gateway_url: str, prompt: str, *, max_tokens: int = 16, timeout: float = 60.0) -> requests.Response:
    return requests.post(f"{gateway_url}/v1/completions", timeout=timeout,
                         json={"model": DEMO_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.7})


def gateway_wait(gateway_url: str, *, timeout_s: float, is_running=lambda: True) -> float:
    """Wait until the gateway answers a completion with 200; returns the seconds waited. TimeoutError else."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s and is_running():
        try:
            if completion(gateway_url, "Hello", max_tokens=4, timeout=30).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the demo gateway at {gateway_url} did not answer within {timeout_s:g} s")


class DemoLoad(threading.Thread):
    """One small completion every interval_s through the gateway, so the dashboards show live numbers.
    Failures are counted and reported in a line per minute at most, never raised."""

    def __init__(self, gateway_url: str, *, interval_s: float = 2.0, report=print):
        super().__init__(name="demo-load", daemon=True)
        self.gateway_url, self.interval_s, self.report = gateway_url, interval_s, report
        self.num_ok = self.num_failed = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_report, last_error = time.monotonic(), ""
        while not self._stop_event.wait(self.interval_s):
            try:
                response = completion(self.gateway_url, secrets.choice(DEMO_PROMPTS))
                if response.status_code == 200:
                    self.num_ok += 1
                else:
                    self.num_failed += 1
                    last_error = f"HTTP {response.status_code}: {response.text[:120]}"
            except requests.RequestException as exc:
                self.num_failed += 1
                last_error = type(exc).__name__
            if last_error and time.monotonic() - last_report > 60:
                self.report(f"demo load: {self.num_ok} ok, {self.num_failed} failed (last: {last_error})")
                last_report, last_error = time.monotonic(), ""

    def stop(self) -> None:
        self._stop_event.set()
