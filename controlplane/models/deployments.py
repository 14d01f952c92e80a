from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from inference.weights import DEFAULT_WEIGHT, WEIGHT_LABEL, parse_weight


class DeploymentMode(models.TextChoices):
    DISAGGREGATED = "disaggregated"  # a prefill pool and a decode pool, KV cache handed between them
    COLOCATED = "colocated"  # one pool whose workers do both stages


class PoolRole(models.TextChoices):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


# The pools each mode has: a deployment never has a pool of another role.
ROLES_BY_MODE = {
    DeploymentMode.DISAGGREGATED: (PoolRole.PREFILL, PoolRole.DECODE),
    DeploymentMode.COLOCATED: (PoolRole.COLOCATED,),
}


# Service-level objectives per deployment (P99, seconds), and the alert rules' thresholds that follow them
# (alerting.services.defaults). Defaults that SmolLM2-135M on a loaded 2-core CPU host meets with room (several
# times what its engine alone takes for a step of a few prompts), so a fresh demo is not red.
DEFAULT_OBJECTIVES = {"ttft_p99_seconds": 10.0, "itl_p99_seconds": 1.0, "e2e_p99_seconds": 60.0}


def default_objectives() -> dict:
    return dict(DEFAULT_OBJECTIVES)


class Deployment(models.Model):
    """A served model: its name is the OpenAI `model` clients send; one gateway plus its pools."""

    name = models.SlugField(max_length=63, unique=True)
    mode = models.CharField(max_length=20, choices=DeploymentMode.choices)
    # SET_NULL, not PROTECT: deleting a deployment cascades to its revisions, this one included.
    current_revision = models.ForeignKey(
        "controlplane.Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gateway_port = models.PositiveIntegerField(unique=True, null=True, blank=True)
    gateway_node = models.ForeignKey(
        "controlplane.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="gateway_deployments"
    )
    # Served by this shared gateway instead of one of its own (then gateway_port is None). PROTECT: a shared gateway
    # is deleted only once no deployment is attached (services.gateways).
    shared_gateway = models.ForeignKey(
        "controlplane.SharedGateway", null=True, blank=True, on_delete=models.PROTECT, related_name="deployments"
    )
    # The autoscaler acts on this deployment's pools only while this is on.
    autoscale_enabled = models.BooleanField(default=False)
    # What the gateway fills into a request that leaves a field out: any of temperature, top_p, top_k, max_tokens
    # (inference.sampling_params.check_sampling_defaults). A request's own values always win.
    sampling_defaults = models.JSONField(default=dict, blank=True)
    # {"ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds"}: see DEFAULT_OBJECTIVES; set through
    # services.objectives, which keeps every key present.
    objectives = models.JSONField(default=default_objectives, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(str(role) for role in ROLES_BY_MODE[DeploymentMode(self.mode)])


def engine_settings_parts(engine_settings: dict | None) -> dict:
    """{"common": {...}, <role>: {...}}. A dict without parts is the flat shape stored before per-role parts
    existed (migration 0009 moves those into common): all of it is common."""
    engine_settings = engine_settings or {}
    if "common" not in engine_settings and not set(engine_settings) & set(PoolRole.values):
        return {"common": dict(engine_settings)}
    return {part: dict(values or {}) for part, values in engine_settings.items()}


def engine_settings_for_role(engine_settings: dict | None, role: str) -> dict:
    """What a worker of `role` runs with: common overridden by `role`'s part."""
    parts = engine_settings_parts(engine_settings)
    return {**parts.get("common", {}), **parts.get(role, {})}


class RevisionImmutableError(Exception):
    pass


class Revision(models.Model):
    """What a deployment runs. Immutable: a change of model or settings is a new revision, which rollouts follow."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    model_path = models.CharField(max_length=1024)
    # "auto" (the model config's own dtype, resolved by each worker at load), "float32", "bfloat16" or "float16".
    # Revisions written before "auto" existed keep their explicit float32.
    dtype = models.CharField(max_length=20, default="auto")
    # Passed to the workers as flags: {"common": {...}, "prefill": {...}, "decode": {...}} (or "colocated"); a
    # role's part overrides common for that role's workers (`settings_for`). Keys: device, threads,
    # kv_cache_bytes, block_size, max_num_seqs, max_queue, ... (controlplane.services.validation).
    engine_settings = models.JSONField(default=dict, blank=True)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The checksum of the model files its first worker loaded (inference.model_snapshot.checksum; "" until then),
    # recorded once by that worker's node agent (services.revision_model_checksum_record): every later worker of the
    # revision serves those files, or refuses to start.
    model_checksum = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["deployment_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="revision_number_unique_per_deployment"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}#{self.number}"

    def settings_for(self, role: str) -> dict:
        """The engine settings a worker of `role` runs with: common, overridden by the role's part."""
        return engine_settings_for_role(self.engine_settings, role)

    def save(self, *args, **kwargs):
        if self.pk is not None and not self._state.adding:
            raise RevisionImmutableError("revisions are immutable: create a new revision instead")
        super().save(*args, **kwargs)


class Pool(models.Model):
    """The workers of one role of a deployment: desired replicas within min..max, placed on the nodes its selector
    names with room for its per-worker request (supervision.placement)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="pools")
    role = models.CharField(max_length=20, choices=PoolRole.choices)
    desired_replicas = models.PositiveIntegerField(default=1)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=8)
    # Labels a node must carry, e.g. {"class": "compute"} for prefill, {"class": "bandwidth"} for decode.
    node_selector = models.JSONField(default=dict, blank=True)
    # What one worker takes of a node: GPUs (0: none needed) and CPU threads (0: not accounted).
    gpus_per_worker = models.PositiveSmallIntegerField(default=0)
    threads_per_worker = models.PositiveSmallIntegerField(default=0)
    # Whether two workers may share one GPU (off: a GPU is the worker's own).
    allow_gpu_sharing = models.BooleanField(default=False)
    # How much of the role's traffic the gateway gives a worker, by the labels of its node: [{"selector": {"class":
    # "compute"}, "weight": 3}, ...], the first entry whose selector the node matches wins (see routing_weight).
    routing_weights = models.JSONField(default=list, blank=True)
    # Why reconcile could not place a worker of this pool on its last try ("" when it could): operators see it as
    # the pool's status `unschedulable` in the API and the dashboard.
    unschedulable_reason = models.TextField(blank=True)
    unschedulable_replicas = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["deployment_id", "role"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "role"], name="pool_role_unique_per_deployment"),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=F("desired_replicas")) & Q(desired_replicas__lte=F("max_replicas")),
                name="pool_desired_within_min_max",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}/{self.role}"

    @property
    def status(self) -> str:
        return "unschedulable" if self.unschedulable_reason else "ok"

    def routing_weight(self, node) -> int | float:
        """The gateway's weight for a worker of this pool on `node`: workers of one role and revision share a pool,
        so what tells them apart is where they run.

        1. The first routing_weights entry whose selector the node's labels match.
        2. Else the node's `tandem.weight` label (checked when it is set; a value that is not a weight counts as
           absent).
        3. Else 1.
        """
        if node is None:
            return DEFAULT_WEIGHT
        for entry in self.routing_weights or []:
            if node.matches(entry["selector"]):
                return entry["weight"]
        label = node.all_labels.get(WEIGHT_LABEL)
        if label is not None:
            try:
                return parse_weight(str(label))
            except ValueError:
                pass
        return DEFAULT_WEIGHT
