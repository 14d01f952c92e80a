"""A rollout's report: the numbers per variant of each analysis run (an A/B experiment's one run), with counts and
the significance note, as JSON or CSV."""
from __future__ import annotations

import csv
import io

from controlplane.rollouts.models import Rollout

REPORT_METRICS = ("requests", "errors", "server_errors", "error_ratio", "server_error_ratio", "ttft_p99_seconds",
                  "itl_p99_seconds", "e2e_p99_seconds", "tokens_per_request")


def rollout_report(rollout: Rollout) -> dict:
    stable_name, tried_name = rollout.variants
    revisions = {stable_name: rollout.stable_revision.number, tried_name: rollout.revision.number}
    runs = []
    for run in rollout.analysis_runs.all():
        runs.append({
            "step": run.step_index + 1, "verdict": run.verdict,
            "window_start": run.started_at.isoformat(),
            "window_end": run.evaluated_at.isoformat() if run.evaluated_at else None,
            "variants": {name: {"revision": revisions[name],
                                **{metric: (run.metrics.get(name) or {}).get(metric) for metric in REPORT_METRICS}}
                         for name in (stable_name, tried_name)},
            "failures": run.failures, "note": run.note,
            "significance": run.significance,
        })
    return {"rollout": rollout.pk, "deployment": rollout.deployment.name, "strategy": rollout.strategy,
            "status": rollout.status, "variants": revisions, "analysis_runs": runs}


def rollout_report_csv(rollout: Rollout) -> str:
    """One row per (analysis run, variant); the significance note on each row of its run."""
    report = rollout_report(rollout)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["rollout", "step", "verdict", "window_start", "window_end", "variant", "revision",
                     *REPORT_METRICS, "significance"])
    for run in report["analysis_runs"]:
        for name, numbers in run["variants"].items():
            writer.writerow([report["rollout"], run["step"], run["verdict"], run["window_start"], run["window_end"],
                             name, numbers["revision"], *("" if numbers[m] is None else numbers[m]
                                                          for m in REPORT_METRICS),
                             (run["significance"] or {}).get("note", "")])
    return out.getvalue()
