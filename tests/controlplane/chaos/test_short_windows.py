"""A gateway window shorter than the scrape interval is read over the interval: its numbers are the increase between
two scrapes, and a window that ends a few seconds after the newest scrape would otherwise hold none to start from
(no data, which never passes). The run's report names each widened window, and faults shorter than the interval."""
from __future__ import annotations

import time

from controlplane.chaos.readings import check_values
from controlplane.chaos.report import run_report
from controlplane.chaos.services import run_start
from controlplane.chaos.validation import validate_hypothesis
from tests.controlplane.chaos.conftest import chaos_pass
from tests.controlplane.chaos.test_driver import steady_history


def test_a_window_shorter_than_the_scrape_interval_is_read_over_it(world, gateway, settings):
    deployment = world["deployment"]
    checks = validate_hypothesis([{"metric": "error_ratio", "max": 0.05, "window_s": 1}],
                                 {"prefill", "decode", "gateway"})
    t = time.time()
    gateway.serve(10)
    chaos_pass(now=t - 8)
    gateway.serve(20, errors=1)
    chaos_pass(now=t - 3)
    settings.TANDEM_SCRAPE_INTERVAL_S = 5
    assert check_values(deployment.pk, checks, now=t) == [1 / 11]  # from t - 8 to t - 3
    settings.TANDEM_SCRAPE_INTERVAL_S = 1
    assert check_values(deployment.pk, checks, now=t) == [None]  # no scrape in its own window to read from


def test_the_report_names_each_widened_window(experiment, gateway, operator, agent_inline, settings,
                                              django_capture_on_commit_callbacks):
    settings.TANDEM_SCRAPE_INTERVAL_S = 10
    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    assert run_report(run)["widened"] == [
        "hypothesis[0] error_ratio: its window of 5 s is read over 10 s, the scrape interval",
        "hypothesis[1] ttft_p99_seconds: its window of 5 s is read over 10 s, the scrape interval",
        "abort_conditions[0] error_ratio: its window of 5 s is read over 10 s, the scrape interval",
        "the faults last 5 s, less than the scrape interval of 10 s: the gateway's numbers of the fault are read "
        "over the scrapes around it"]
    settings.TANDEM_SCRAPE_INTERVAL_S = 5
    assert run_report(run)["widened"] == []
