"""Request traces: what a deployment's gateways recorded (one trace per deployment, named `recorded`, pulled from
their /trace by the replay app's periodic pass) and what an operator imported (Azure's LLM inference trace,
Mooncake's JSONL, Tandem's own export). A replay reads a window of one."""
from __future__ import annotations

from django.db import models

RECORDED = "recorded"
FORMATS = ("tandem", "azure", "mooncake")


class Trace(models.Model):
    """A named sequence of requests of one deployment; its requests' times are seconds from `start`."""

    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE, related_name="traces")
    name = models.CharField(max_length=63)
    format = models.CharField(max_length=16, default="tandem")  # how it came: recorded (tandem), or its import format
    start = models.DateTimeField()
    # Recorded traces only: the share of the gateways' records kept (a deterministic sample), and whether the pull
    # keeps any at all.
    sample = models.FloatField(default=1.0)
    recording = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["deployment", "name"], name="trace_unique_name")]

    def __str__(self) -> str:
        return f"{self.deployment_id}/{self.name}"


class TraceRequest(models.Model):
    """One request: when it arrived (seconds from its trace's start), who sent it, its sizes, its prefix blocks and,
    where it was recorded, how it was served."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="requests")
    at_s = models.FloatField()
    tenant = models.CharField(max_length=63, blank=True, default="")
    priority = models.CharField(max_length=16, blank=True, default="")
    prompt_tokens = models.IntegerField()
    prompt_estimated = models.BooleanField(default=False)
    completion_tokens = models.IntegerField()
    max_tokens = models.IntegerField(null=True)
    block_tokens = models.IntegerField(default=0)
    hashes = models.JSONField(default=list)
    ttft_s = models.FloatField(null=True)
    e2e_s = models.FloatField(null=True)
    outcome = models.CharField(max_length=16, blank=True, default="")
    revision = models.IntegerField(null=True)

    class Meta:
        indexes = [models.Index(fields=["trace", "at_s"], name="trace_request_time")]


class TraceCursor(models.Model):
    """How far the pull has read one gateway's ring of one deployment: its process (`started`, which a restart
    changes) and the last sequence number stored. A shared gateway keeps a ring per deployment, each numbered on its
    own, so its cursors are one per deployment it serves."""

    gateway_id = models.BigIntegerField()  # the gateway's Worker row
    deployment_id = models.BigIntegerField()
    started = models.FloatField()
    last = models.BigIntegerField(default=0)
    lost = models.BigIntegerField(default=0)  # records the ring dropped before the pull read them
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gateway_id", "deployment_id"], name="trace_cursor_unique")]


class ChangeGate(models.Model):
    """A deployment's opt-in change gate (gate.py): an operator's change whose replay of the last `window_s` of the
    recorded trace falls short of the objectives is refused with a 409, unless acknowledged."""

    deployment = models.OneToOneField("controlplane.Deployment", on_delete=models.CASCADE, primary_key=True,
                                      related_name="+")
    enabled = models.BooleanField(default=False)
    window_s = models.PositiveIntegerField(default=86400)
    updated_at = models.DateTimeField(auto_now=True)
