"""The change gate (controlplane/change_gate.py's provider): with a deployment's gate on, an operator's change is
replayed on the last `window_s` of its recorded trace before it is applied; a change whose predicted SLO attainment
is below the attainment target and below the deployment's as it stands is refused with a 409 that carries the
prediction, unless the request acknowledges it. A change the what-if cannot read (a bound the service will refuse
with its own message) and a window without traffic pass: there is nothing to predict."""
from __future__ import annotations

from django.conf import settings
from django.db.models import Max

from controlplane.change_gate import GATE_REFUSED
from controlplane.errors import ControlPlaneError, invalid
from controlplane.models import Deployment
from controlplane.replay.models import RECORDED, ChangeGate, Trace, TraceRequest
from controlplane.replay.whatif import what_if

MAX_WINDOW_S = 30 * 86400


def gate_of(deployment: Deployment) -> dict:
    row = ChangeGate.objects.filter(deployment=deployment).first()
    return {"enabled": bool(row and row.enabled), "window_s": row.window_s if row else 86400}


def gate_set(deployment: Deployment, *, enabled: bool | None = None, window_s: int | None = None) -> dict:
    if window_s is not None and not 60 <= window_s <= MAX_WINDOW_S:
        raise invalid(f"window_s must be within 60..{MAX_WINDOW_S} seconds, not {window_s}", field="window_s")
    row, _ = ChangeGate.objects.get_or_create(deployment=deployment)
    if enabled is not None:
        row.enabled = enabled
    if window_s is not None:
        row.window_s = window_s
    row.save()
    return gate_of(deployment)


def check(deployment: Deployment, change: dict, acknowledged: bool) -> None:
    gate = ChangeGate.objects.filter(deployment=deployment, enabled=True).first()
    if gate is None or acknowledged:
        return
    trace = Trace.objects.filter(deployment=deployment, name=RECORDED).first()
    last = TraceRequest.objects.filter(trace=trace).aggregate(last=Max("at_s"))["last"] if trace else None
    if last is None:
        return
    try:
        report = what_if(deployment, trace, change=change, since_s=_since(trace, last - gate.window_s))
    except ControlPlaneError as exc:
        if exc.status == 400:
            return
        raise
    verdict = report["verdict"]
    if verdict["meets_objective"] or not verdict["worse"]:
        return
    before, after = report["before"], report["after"]
    raise ControlPlaneError(
        f"the change gate predicts this change falls short of {deployment.name}'s objectives: replayed on the "
        f"last {gate.window_s} s of its recorded traffic ({report['trace']['requests']} requests), "
        f"{_pct(verdict['attainment_after'])} of requests would meet TTFT P99 ≤ {report['objectives']['ttft_p99_s']} s "
        f"and ITL P99 ≤ {report['objectives']['itl_p99_s']} s (now {_pct(verdict['attainment_before'])}; target "
        f"{_pct(report['objectives']['attainment_target'])}). Send acknowledge_prediction: true to apply it anyway.",
        status=409, code=GATE_REFUSED, extra={"prediction": {"attainment_before": verdict["attainment_before"], "attainment_after": verdict["attainment_after"],
                    "ttft_p99_s": {"before": before["ttft_s"]["p99"], "after": after["ttft_s"]["p99"]},
                    "itl_p99_s": {"before": before["itl_s"]["p99"], "after": after["itl_s"]["p99"]},
                    "shed": {"before": sum(before["shed"].values()), "after": sum(after["shed"].values())},
                    "window_s": gate.window_s, "requests": report["trace"]["requests"]}})


def _since(trace: Trace, since_s: float) -> float:
    """The window's start, moved later where the window holds more than TANDEM_GATE_MAX_REQUESTS: the gate answers
    within the request that asked, so it replays the newest of a busy day's requests, not all of them."""
    limit = settings.TANDEM_GATE_MAX_REQUESTS
    edge = (TraceRequest.objects.filter(trace=trace, at_s__gte=since_s).order_by("-at_s")
            .values_list("at_s", flat=True)[limit - 1:limit].first())
    return since_s if edge is None else max(since_s, edge)


def _pct(share: float | None) -> str:
    return "none" if share is None else f"{100 * share:.1f} %"
