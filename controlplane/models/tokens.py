from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """An API token, stored as the SHA-256 of its key: the key itself is shown once, when it is issued
    (controlplane.services.tokens), and a copy of the database gives no one a working token."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # What it is for: "cli" (tandem_token), "make run", "gateway demo", ...; revoking by name rotates one use.
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    # The key's first characters, to tell tokens apart in the admin; too short to help a guess.
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["user_id", "created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name}, {self.user})"
