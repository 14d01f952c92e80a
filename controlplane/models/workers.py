from __future__ import annotations

from django.db import models
from django.utils import timezone


class WorkerRole(models.TextChoices):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    # A deployment's gateway, or a shared gateway's (Worker.shared_gateway): supervised like a worker, without a
    # pool or revision.
    GATEWAY = "gateway"


class WorkerStatus(models.TextChoices):
    PENDING = "pending"  # wanted; no process yet
    STARTING = "starting"  # process spawned; /health not yet 200
    READY = "ready"  # /health 200: listed in the gateway's membership
    DRAINING = "draining"  # taken out of membership; finishing its requests before it stops
    STOPPED = "stopped"
    FAILED = "failed"  # too many restarts in the window: left down, an action row says so


class WorkerPurpose(models.TextChoices):
    SERVING = "serving"  # a pool's worker (or the gateway): in the gateway's membership, scraped, counted
    # A capacity profile run's worker: started and stopped by its node agent like any other, health-checked, but in
    # no pool, never in the gateway's membership, never scraped into the deployment's series.
    PROFILE = "profile"


# Statuses that hold (or are about to hold) a process.
LIVE_STATUSES = (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING)


def health_answer_ok(role: str, status_code: int) -> bool:
    """Whether a worker's GET /health answer means its process is up. A gateway counts as up as soon as it answers
    at all: it says 503 until its pools have ready workers, which is not its own failure."""
    return status_code == 200 or (role == WorkerRole.GATEWAY and status_code == 503)


def _health_body(response) -> dict:
    """A /health answer's JSON object, {} when it is not one."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def health_answer_dtype(response) -> str:
    """The dtype a worker's /health answer says it runs ("auto" resolved), "" when it says none (a gateway)."""
    dtype = _health_body(response).get("dtype")
    # Stored in a 20-character column and shown on pages: anything else is not a dtype.
    return dtype if isinstance(dtype, str) and dtype.isidentifier() and len(dtype) <= 20 else ""


def health_answer_status(response) -> str:
    """The `status` word of a /health answer ("ok", "starting", "draining", "dead"), "" when it says none."""
    status = _health_body(response).get("status")
    return status if isinstance(status, str) else ""


def health_answer_weights(response) -> dict:
    """What a worker's /health answer says of its weights: {"quantization": ..., "weight_bytes": ...}, each only
    when it says it (and it is well-formed); {} for a gateway or an older worker."""
    body = _health_body(response)
    weights = {}
    quantization, weight_bytes = body.get("quantization"), body.get("weight_bytes")
    # Stored in a 10-character column and shown on pages: anything else is not a quantization.
    if isinstance(quantization, str) and quantization.isidentifier() and len(quantization) <= 10:
        weights["quantization"] = quantization
    if isinstance(weight_bytes, int) and not isinstance(weight_bytes, bool) and 0 < weight_bytes < 1 << 62:
        weights["weight_bytes"] = weight_bytes
    return weights


class Worker(models.Model):
    """One process (a prefill, decode or colocated worker, or a gateway) on a node. Desired vs live is reconciled.

    Every process is a deployment's but a shared gateway's (docs/gateway.md, "Shared gateway"), which serves several:
    its row has `shared_gateway` instead, so that it is started, probed, restarted and re-adopted by the same code as
    any other process."""

    deployment = models.ForeignKey("controlplane.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="workers")
    shared_gateway = models.ForeignKey("controlplane.SharedGateway", null=True, blank=True,
                                       on_delete=models.CASCADE, related_name="workers")
    # A shared gateway's process gets each attached deployment's worker key in its environment at start: the ids it
    # was given, so that reconcile restarts it once a deployment attached later needs its key.
    worker_keys_of = models.JSONField(default=list, blank=True)
    pool = models.ForeignKey(
        "controlplane.Pool", null=True, blank=True, on_delete=models.CASCADE, related_name="workers"
    )
    role = models.CharField(max_length=20, choices=WorkerRole.choices)
    revision = models.ForeignKey(
        "controlplane.Revision", null=True, blank=True, on_delete=models.CASCADE, related_name="workers"
    )
    node = models.ForeignKey(
        "controlplane.Node", null=True, blank=True, on_delete=models.PROTECT, related_name="workers"
    )
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    # An operator's restart or drain of a serving worker starts this one first and drains `replaces` once this one is
    # ready (a surge), so that the pool never has fewer ready workers than it had. Counted in its pool's place.
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replacements")
    purpose = models.CharField(max_length=10, choices=WorkerPurpose.choices, default=WorkerPurpose.SERVING)
    host = models.CharField(max_length=255, default="127.0.0.1")
    port = models.PositiveIntegerField(null=True, blank=True)
    # Where prefill workers push a decode worker's KV cache when not to `port`: a chaos KV fault's proxy
    # (controlplane.agent.proxy_faults), so that only the KV push crosses it. Null: `port`.
    kv_port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=WorkerStatus.choices, default=WorkerStatus.PENDING)
    restart_count = models.PositiveIntegerField(default=0)
    consecutive_health_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    log_path = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    last_health_at = models.DateTimeField(null=True, blank=True)
    # The dtype the process says it runs (its /health, read by the health check): the revision's dtype with "auto"
    # resolved. Blank until its first healthy answer; a restarted process reports it again.
    dtype = models.CharField(max_length=20, blank=True)
    # What the process says of its weights (its /health, like dtype): quantization ("none", "int8") and the bytes
    # the loaded weights hold. Blank / null until its first healthy answer.
    quantization = models.CharField(max_length=10, blank=True)
    weight_bytes = models.BigIntegerField(null=True, blank=True)
    # Exponential backoff: the next start is not attempted before this.
    next_restart_at = models.DateTimeField(null=True, blank=True)
    restart_window_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["deployment", "role", "status"], name="worker_deployment_role_status")]
        constraints = [models.CheckConstraint(
            name="worker_one_owner",
            condition=(models.Q(deployment__isnull=False, shared_gateway__isnull=True)
                       | models.Q(deployment__isnull=True, shared_gateway__isnull=False, role="gateway")))]

    def __str__(self) -> str:
        return f"{self.role}#{self.pk}"

    @property
    def owner_name(self) -> str:
        """The deployment's name, or the shared gateway's: what its log file and its gateway token are named by."""
        return self.deployment.name if self.deployment_id is not None else self.shared_gateway.name

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        return f"http://{self.host}:{self.port}"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES
