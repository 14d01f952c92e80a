from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class SharedGateway(models.Model):
    """One gateway process serving several deployments, each by its model name (docs/gateway.md, "Shared gateway").
    A deployment attached to it (Deployment.shared_gateway) has no gateway of its own."""

    name = models.SlugField(max_length=63, unique=True)
    port = models.PositiveIntegerField(unique=True)
    node = models.ForeignKey("controlplane.Node", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="shared_gateways")
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def url(self) -> str:
        host = self.node.hostname if self.node is not None and self.node.hostname else "127.0.0.1"
        return f"http://{host}:{self.port}"
