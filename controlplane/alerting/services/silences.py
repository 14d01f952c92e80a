"""Silences: which alerts they mute, and creating/expiring them (operators).

Regex matchers run on RE2 (the google-re2 binding; Alertmanager's own Go regexp has the same semantics): matching
takes time linear in the label's length whatever the pattern, so an operator's `(.*.*)*X` cannot freeze evaluation
or the alerts page as a backtracking engine would. Patterns, values and the number of matchers are bounded too.
"""
from __future__ import annotations

import functools
import re
from datetime import datetime

import re2

from django.db import transaction
from django.utils import timezone

from controlplane.alerting.models import Silence
from controlplane.errors import invalid
from controlplane.services.validation import each_object

MATCHER_KEYS = {"name", "value", "is_regex", "is_equal"}
MAX_MATCHERS = 32
MAX_VALUE_LENGTH = 1024
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the operator's 400, not a line on the server's stderr


@functools.lru_cache(maxsize=1024)
def compile_matcher(pattern: str):
    """The compiled RE2 pattern (cached: evaluation matches the same silences every pass). Raises re2.error."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def matcher_matches(matcher: dict, labels: dict[str, str]) -> bool:
    """Alertmanager's matcher: equality or a regex anchored at both ends; is_equal false negates. A missing label
    reads as the empty string (so `team=""` matches alerts without a team)."""
    value = str(labels.get(matcher.get("name", ""), ""))
    wanted = str(matcher.get("value", ""))
    if matcher.get("is_regex"):
        try:
            found = compile_matcher(wanted).fullmatch(value) is not None
        except re2.error:
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
    if len(matchers) > MAX_MATCHERS:
        raise invalid(f"a silence takes at most {MAX_MATCHERS} matchers, not {len(matchers)}", field="matchers")
    clean = []
    for where, matcher in each_object(matchers, field="matchers"):
        unknown = set(matcher) - MATCHER_KEYS
        if unknown:
            raise invalid(f"{where} has unknown keys {sorted(unknown)}", field=where)
        name, value = matcher.get("name"), matcher.get("value")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise invalid(f"{where}.name must be a label name", field=f"{where}.name")
        if not isinstance(value, str):
            raise invalid(f"{where}.value must be a string", field=f"{where}.value")
        if len(value) > MAX_VALUE_LENGTH:
            raise invalid(f"{where}.value is longer than {MAX_VALUE_LENGTH} characters", field=f"{where}.value")
        is_regex, is_equal = matcher.get("is_regex", False), matcher.get("is_equal", True)
        if not isinstance(is_regex, bool) or not isinstance(is_equal, bool):
            raise invalid(f"{where}.is_regex and is_equal must be booleans", field=where)
        if is_regex:
            try:
                compile_matcher(value)
            except re2.error as exc:
                detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
                raise invalid(f"{where}.value is not a valid regex (RE2 syntax): {detail}",
                              field=f"{where}.value") from None
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
    with transaction.atomic():
        silence = Silence.objects.create(matchers=matchers, starts_at=starts_at, ends_at=ends_at, comment=comment,
                                         created_by=created_by)
        _record(silence, actor=created_by, verb="created",
                detail=f"until {ends_at.isoformat(timespec='seconds')}: {comment.strip()}")
    return silence


def silence_expire(*, silence: Silence, actor=None) -> Silence:
    """End a silence now (an expired one stays as it is)."""
    now = timezone.now()
    with transaction.atomic():
        if Silence.objects.filter(pk=silence.pk, ends_at__gt=now).update(ends_at=now) and actor is not None:
            _record(silence, actor=actor, verb="expired", detail=silence.comment)
    silence.refresh_from_db()
    return silence


def _record(silence: Silence, *, actor, verb: str, detail: str) -> None:
    """The audit row of a silence: muting alerts (and the actions they would take) is an operator's decision.
    Recorded succeeded, so action_create starts and finishes it at its creation time."""
    from controlplane.models import ActionKind, ActionStatus, Deployment
    from controlplane.services.actions import action_create

    if actor is None or not getattr(actor, "is_authenticated", True):
        return
    names = [m.get("value") for m in silence.matchers
             if m.get("name") == "deployment" and m.get("is_equal", True) and not m.get("is_regex")]
    deployment = Deployment.objects.filter(name=names[0]).first() if names else None
    matchers = ", ".join(f"{m.get('name')}{'=' if m.get('is_equal', True) else '!='}"
                         f"{'~' if m.get('is_regex') else ''}{m.get('value')}" for m in silence.matchers)
    action_create(kind=ActionKind.SILENCE, actor=actor, deployment=deployment,
                  reason=f"silence #{silence.pk} {verb} ({matchers}) {detail}".strip(),
                  params={"silence": silence.pk, "matchers": silence.matchers}, status=ActionStatus.SUCCEEDED)
