"""Tell the notification channels that a chaos run ended aborted or failed: one delivery per enabled channel, sent
by the alerting app's delivery task (bounded tries, timeout, the outcome on the delivery row), carrying the verdict,
its reasons and the report's address. A run that passed tells nobody: it is what a game day expects."""
from __future__ import annotations

from django.conf import settings

from controlplane.alerting.models import ChannelKind
from controlplane.alerting.services.notifications import channels_notify


def report_urls(run) -> dict:
    base = settings.TANDEM_PUBLIC_URL
    name = run.deployment.name
    return {"report_url": f"{base}/deployments/{name}/chaos/runs/{run.pk}",
            "report_json_url": f"{base}/api/v1/deployments/{name}/chaos/runs/{run.pk}/report"}


def _payload(kind: str, summary: dict) -> dict:
    reasons = "; ".join(summary["reasons"]) or "no reason recorded"
    text = (f"Chaos run {summary['chaos_run']} ({summary['experiment']}) of {summary['deployment']} "
            f"{summary['verdict']}: {reasons}. Report: {summary['report_url']}")
    if kind == ChannelKind.SLACK:
        return {"text": text}
    return {"version": "1", "kind": f"chaos_run_{summary['verdict']}", "text": text, **summary}


def run_end_notify(*, run, report: dict) -> list[int]:
    """Queue the deliveries inside the run's finishing transaction (each is sent after commit; a run finished twice
    queues once: the deliveries' idempotency keys). Returns their ids."""
    summary = {"deployment": run.deployment.name, "chaos_run": run.pk, "experiment": report["experiment"],
               "verdict": report["verdict"], "reasons": report["reasons"], "recovery_s": report["recovery_s"],
               "started_at": report["started_at"], "finished_at": report["finished_at"],
               "requests": report["requests"], **report_urls(run)}
    return channels_notify(idempotency_key=f"chaos-{run.pk}-ended", event=report["verdict"],
                           payload=lambda kind: _payload(kind, summary))
