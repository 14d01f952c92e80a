from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone


class Node(models.Model):
    """A host with a node agent: a Celery worker consuming `queue` (`node.<name>`) that starts and stops processes."""

    name = models.SlugField(max_length=63, unique=True)
    queue = models.CharField(max_length=100, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    # Where the other hosts reach this node's workers and gateways (the agent's --address): workers bind to it and
    # the gateway and the control plane's health checks connect to it. 127.0.0.1 is right for one host only.
    address = models.CharField(max_length=255, default="127.0.0.1")
    # [{"index": 0, "name": "NVIDIA H100", "memory_total_bytes": 85899345920}]; [] on a CPU-only host.
    gpus = models.JSONField(default=list, blank=True)
    # What the agent found at registration: gpu.model, gpu.count, gpu.memory_gib, cpu.count, memory_gib.
    detected_labels = models.JSONField(default=dict, blank=True)
    # What operators set (the agent's --label, the API, the admin), e.g. {"class": "bandwidth"}; they win over
    # detected labels of the same name. Pools select nodes by labels (Pool.node_selector).
    labels = models.JSONField(default=dict, blank=True)
    # The host's roofline (inference.roofline_measure): matmul GFLOP/s per precision and read GB/s, at one thread
    # and at all cores, with "measured_at"; {} until the agent has measured. Simulated nodes carry a made-up one
    # ("source": "simulated"). Workers get their share as flags (controlplane.agent.launch).
    roofline = models.JSONField(default=dict, blank=True)
    # The engines other than Tandem's own that this host can run workers of, as its agent found them
    # (inference.engines.vllm.environment.probe): {"vllm": {"python": ..., "version": "0.32.0"}} or, where there is
    # none, {"vllm": {"python": ..., "error": "why"}}; {} until the agent has looked.
    engines = models.JSONField(default=dict, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def queue_for(name: str) -> str:
        return f"node.{name}"

    def save(self, *args, **kwargs):
        if not self.queue:
            self.queue = self.queue_for(self.name)
        super().save(*args, **kwargs)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus or [])

    @property
    def all_labels(self) -> dict[str, str]:
        return {**(self.detected_labels or {}), **(self.labels or {})}

    def matches(self, selector: dict) -> bool:
        """Whether the node carries every label of `selector` (an empty selector matches every node)."""
        labels = self.all_labels
        return all(str(labels.get(key)) == str(value) for key, value in selector.items())

    @property
    def num_cpus(self) -> int | None:
        value = (self.detected_labels or {}).get("cpu.count")
        return int(value) if value is not None and str(value).isdigit() else None

    def is_online(self, *, within: timedelta = timedelta(seconds=30)) -> bool:
        return self.last_seen_at is not None and timezone.now() - self.last_seen_at <= within
