"""API tokens: issued with a random key that is shown once, stored as its SHA-256, looked up by that hash.

A lookup by hash takes the same time whatever part of a guessed key is right (the index compares digests of
unrelated values), so no constant-time scan over every token is needed.
"""
from __future__ import annotations

import hashlib
import secrets

from django.db import transaction

from controlplane.models import ApiToken


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_issue(*, user, name: str, replace: bool = False) -> str:
    """A new token for `user`; returns its key (the only time it is seen). `replace` revokes the user's other
    tokens of the same name first (a rotation)."""
    key = secrets.token_hex(20)  # 160 random bits, 40 hex characters (the format of DRF's keys)
    with transaction.atomic():
        if replace:
            ApiToken.objects.filter(user=user, name=name).delete()
        ApiToken.objects.create(user=user, name=name[:100], key_hash=key_hash(key), prefix=key[:6])
    return key


def token_revoke_all(*, user) -> int:
    num_deleted, _ = ApiToken.objects.filter(user=user).delete()
    return num_deleted


def token_user(key: str):
    """The active user a key belongs to, else None."""
    token = ApiToken.objects.select_related("user").filter(key_hash=key_hash(key), user__is_active=True).first()
    return None if token is None else token.user
