"""Tenants, their API keys, and the deployments that require a key.

A key is shown once, when it is issued; the table keeps its SHA-256 (as controlplane.services.tokens does for the
control plane's own tokens), so neither the database nor the gateways, which learn the hashes through their
membership poll, hold anything that opens the fleet. A revoked key keeps its row: the audit log names it."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from inference.gateway.tenant_limits import TENANT_LIMITS, TenantLimit


class PriorityClass(models.TextChoices):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"


# A tenant's prices per 1M tokens ("prices" in the API: kind → the model's field).
PRICE_FIELDS = {"prompt": "price_prompt_per_million", "completion": "price_completion_per_million"}


class Tenant(models.Model):
    # A DNS-label-like name: it is a Prometheus label value on the gateways and appears in log lines.
    name = models.CharField(max_length=63, unique=True)
    priority_class = models.CharField(max_length=12, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    # A column per limit (null: no limit), added below from the table the gateway enforces
    # (inference/gateway/tenant_limits.py).
    # Prices per 1M tokens (any currency; null: not priced), what the usage export turns tokens into a cost with.
    price_prompt_per_million = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    price_completion_per_million = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # The deployments (models) the tenant's keys may use; a key sent to any other gets 404 model_not_found.
    deployments = models.ManyToManyField("controlplane.Deployment", blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def limits(self) -> dict[str, int]:
        """The limits it has (a limit left out is no limit)."""
        return {limit.name: getattr(self, limit.name) for limit in TENANT_LIMITS
                if getattr(self, limit.name) is not None}

    @property
    def prices(self) -> dict[str, float]:
        """The prices per 1M tokens it has (prompt, completion)."""
        return {kind: float(getattr(self, field)) for kind, field in PRICE_FIELDS.items()
                if getattr(self, field) is not None}


def _limit_column(limit: TenantLimit) -> models.Field:
    column = models.PositiveBigIntegerField if limit.wide else models.PositiveIntegerField
    return column(null=True, blank=True)


for _limit in TENANT_LIMITS:
    Tenant.add_to_class(_limit.name, _limit_column(_limit))


class TenantKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="keys")
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True)  # sha256 hex of the key
    prefix = models.CharField(max_length=12)  # the key's first characters, to tell keys apart in lists
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.prefix}…"

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class DeploymentAccess(models.Model):
    """Whether a deployment's gateway requires a tenant key, and its admission queue's settings. A deployment without
    a row is open (no key needed) and queues as its gateways' flags say: the demo stays open until an admin says
    otherwise."""

    deployment = models.OneToOneField("controlplane.Deployment", on_delete=models.CASCADE, primary_key=True,
                                      related_name="+")
    requires_key = models.BooleanField(default=False)
    # The admission queue's settings its gateways poll
    # (inference.gateway.admission_settings.check_admission_settings: max_queued, queue_deadlines by class); {}: the
    # gateways' flags.
    admission = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.deployment_id}: {'key required' if self.requires_key else 'open'}"


# The counters of a usage row, as the gateways count them per tenant (controlplane/tenants/usage.py).
USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "errors", "rate_limited", "shed")


class TenantUsage(models.Model):
    """One tenant's use of one deployment in one hour (UTC), added to by every scrape of its gateways. By name, not
    a key to Tenant: the rows outlive the tenant (a bill), and open deployments' callers without a key count as
    `_anonymous`."""

    tenant = models.CharField(max_length=63)
    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()  # the hour's start
    requests = models.PositiveBigIntegerField(default=0)  # admitted
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)  # admitted requests that did not finish
    rate_limited = models.PositiveBigIntegerField(default=0)  # refused with 429 over one of its limits
    shed = models.PositiveBigIntegerField(default=0)  # refused by admission (queue full, deadline passed)

    class Meta:
        ordering = ["hour", "tenant", "deployment_id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "deployment", "hour"], name="tenant_usage_hour")]
        indexes = [models.Index(fields=["deployment", "hour"], name="tenant_usage_deployment_hour"),
                   models.Index(fields=["hour"], name="tenant_usage_hour_idx")]

    def __str__(self) -> str:
        return f"{self.tenant}@{self.deployment_id} {self.hour:%Y-%m-%d %H}:00"
