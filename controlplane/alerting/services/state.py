"""The alert state machine of one instance, as a pure function (Prometheus' semantics), and its label fingerprint."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.alerting.models import AlertState


def fingerprint(labels: dict[str, str]) -> str:
    """A stable hash of the label set: the same labels give the same fingerprint in every process and release."""
    canonical = json.dumps(sorted((str(k), str(v)) for k, v in labels.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Step:
    state: AlertState          # the state after this evaluation
    active_at: datetime | None  # pending since (None once inactive)
    last_true_at: datetime | None


def next_state(*, state: AlertState, holds: bool, now: datetime, active_at: datetime | None,
               last_true_at: datetime | None, for_s: int, keep_firing_for_s: int) -> Step:
    """One evaluation of one instance.

    1. inactive/resolved + holds → pending (firing at once when for_s is 0), active since now.
    2. pending + holds for at least for_s since active_at → firing; pending + not holding → inactive (dropped, no
       resolve: it never fired).
    3. firing + not holding → stays firing until keep_firing_for_s after the last evaluation where it held, then
       resolved.
    """
    if holds:
        if state in (AlertState.INACTIVE, AlertState.RESOLVED):
            first = AlertState.FIRING if for_s == 0 else AlertState.PENDING
            return Step(first, now, now)
        if state == AlertState.PENDING and now - active_at >= timedelta(seconds=for_s):
            return Step(AlertState.FIRING, active_at, now)
        return Step(state, active_at, now)
    if state == AlertState.PENDING:
        return Step(AlertState.INACTIVE, None, last_true_at)
    if state == AlertState.FIRING:
        if last_true_at is not None and now - last_true_at < timedelta(seconds=keep_firing_for_s):
            return Step(AlertState.FIRING, active_at, last_true_at)
        return Step(AlertState.RESOLVED, active_at, last_true_at)
    return Step(state, active_at, last_true_at)
