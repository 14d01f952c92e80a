"""Silences: which alerts they mute, and creating/expiring them (operators)."""
from __future__ import annotations

import re
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.alerting.models import Silence
from controlplane.errors import invalid

MATCHER_KEYS = {"name", "value", "is_regex", "is_equal"}


def matcher_matches(matcher: dict, labels: dict[str, str]) -> bool:
    """Alertmanager's matcher: equality or a regex anchored at both ends; is_equal false negates. A missing label
    reads as the empty string (so `team=""` matches alerts without a team)."""
    value = str(labels.get(matcher.get("name", ""), ""))
    wanted = str(matcher.get("value", ""))
    if matcher.get("is_regex"):
        try:
            found = re.fullmatch(wanted, value) is not None
        except re.error:
            return False  # rows are validated on write; a broken one must not break evaluation
    else:
        found = value == wanted
    return found if matcher.get("is_equal", True) else not found


def silence_for(labels: dict[str, str], *, now: datetime | None = None,
                silences: list[Silence] | None = None) -> Silence | None:
    """The first active silence whose matchers all match `labels`, or None."""
    now = now or timezone.now()
    if silences is None:
        silences = list(active_silences(now=now))
    for silence in silences:
        matchers = silence.matchers if isinstance(silence.matchers, list) else []
        if silence.is_active(now) and matchers and all(
                isinstance(m, dict) and matcher_matches(m, labels) for m in matchers):
            return silence
    return None


def active_silences(*, now: datetime | None = None):
    now = now or timezone.now()
    return Silence.objects.filter(starts_at__lte=now, ends_at__gt=now)


def validate_matchers(matchers) -> list[dict]:
    if not isinstance(matchers, list) or not matchers:
        raise invalid("matchers must be a non-empty list of {name, value, is_regex, is_equal}", field="matchers")
    clean = []
    for index, matcher in enumerate(matchers):
        where = f"matchers[{index}]"
        if not isinstance(matcher, dict):
            raise invalid(f"{where} must be an object", field=where)
        unknown = set(matcher) - MATCHER_KEYS
        if unknown:
            raise invalid(f"{where} has unknown keys {sorted(unknown)}", field=where)
        name, value = matcher.get("name"), matcher.get("value")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise invalid(f"{where}.name must be a label name", field=f"{where}.name")
        if not isinstance(value, str):
            raise invalid(f"{where}.value must be a string", field=f"{where}.value")
        is_regex, is_equal = matcher.get("is_regex", False), matcher.get("is_equal", True)
        if not isinstance(is_regex, bool) or not isinstance(is_equal, bool):
            raise invalid(f"{where}.is_regex and is_equal must be booleans", field=where)
        if is_regex:
            try:
                re.compile(value)
            except re.error as exc:
                raise invalid(f"{where}.value is not a valid regex: {exc}", field=f"{where}.value") from None
        clean.append({"name": name, "value": value, "is_regex": is_regex, "is_equal": is_equal})
    return clean


def silence_create(*, matchers, ends_at: datetime, comment: str, created_by, starts_at: datetime | None = None
                   ) -> Silence:
    matchers = validate_matchers(matchers)
    starts_at = starts_at or timezone.now()
    if ends_at <= starts_at:
        raise invalid("ends_at must be after starts_at", field="ends_at")
    if not comment or not comment.strip():
        raise invalid("a silence needs a comment saying why", field="comment")
    return Silence.objects.create(matchers=matchers, starts_at=starts_at, ends_at=ends_at, comment=comment,
                                  created_by=created_by)


def silence_expire(*, silence: Silence) -> Silence:
    """End a silence now (an expired one stays as it is)."""
    now = timezone.now()
    with transaction.atomic():
        Silence.objects.filter(pk=silence.pk, ends_at__gt=now).update(ends_at=now)
    silence.refresh_from_db()
    return silence
