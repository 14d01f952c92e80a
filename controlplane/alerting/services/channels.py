"""Notification channels (admins)."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.alerting.models import Channel
from controlplane.alerting.webhooks.transport import destination_refused
from controlplane.errors import conflict, invalid


def _check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise invalid("url must be an http:// or https:// URL", field="url")
    refused = destination_refused(url)
    if refused is not None:
        raise invalid(f"url: {refused}", field="url")


def channel_create(*, name: str, kind: str, url: str, secrets: list[str], enabled: bool = True) -> Channel:
    _check_url(url)
    try:
        with transaction.atomic():
            return Channel.objects.create(name=name, kind=kind, url=url, secrets=list(secrets), enabled=enabled)
    except IntegrityError:
        raise conflict(f"a channel named {name!r} already exists", field="name") from None


def channel_update(*, channel: Channel, **fields) -> Channel:
    """Change fields; enabling a channel again clears the reason it was disabled for."""
    if "url" in fields:
        _check_url(fields["url"])
    if "secrets" in fields:
        fields["secrets"] = list(fields["secrets"])
    for name, value in fields.items():
        setattr(channel, name, value)
    if fields.get("enabled") is True:
        channel.disabled_reason, channel.disabled_at = "", None
    elif fields.get("enabled") is False and not channel.disabled_reason:
        channel.disabled_reason, channel.disabled_at = "disabled by an admin", timezone.now()
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise conflict(f"a channel named {channel.name!r} already exists", field="name") from None
    return channel
