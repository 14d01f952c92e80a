"""The capacity page puts the live points against the fitted curves and warns, naming the stage and the numbers,
when live traffic and a profile's fit disagree by more than 2× (a quick profile on a busy host fitted 3.9 s per
prefill step while prompts of that length took 0.4 s live): the planner would size pools from the wrong curve."""
from __future__ import annotations

import json
import re

import pytest

from controlplane.capacity.models import Profile
from controlplane.capacity.sizing.calibration import fit_vs_live


def test_a_live_point_far_below_the_prefill_fit_disagrees():
    check = fit_vs_live("prefill", {"a": 0.1, "b": 0.0038, "c": 0.0},
                        {"batch_tokens": 1000, "latency_s": 0.4, "source": "live"})
    assert check["fitted_s"] == pytest.approx(3.9)
    assert check["ratio"] == pytest.approx(0.4 / 3.9) and check["disagrees"]


def test_a_live_point_within_2x_of_the_decode_fit_agrees_and_beyond_it_disagrees():
    fit = {"a": 0.01, "b": 0.001, "c": 0.0}
    near = fit_vs_live("decode", fit, {"batch": 4, "context": 200, "step_s": 0.025})
    far = fit_vs_live("decode", fit, {"batch": 4, "context": 200, "step_s": 0.029})
    assert near["ratio"] == pytest.approx(25 / 14) and not near["disagrees"]
    assert far["disagrees"]


def test_a_fit_that_predicts_nothing_disagrees_with_any_live_point():
    check = fit_vs_live("decode", {"a": 0.0, "b": 0.0, "c": 0.0}, {"batch": 2, "context": 10, "step_s": 0.02})
    assert check["ratio"] is None and check["disagrees"]


@pytest.fixture
def slow_prefill_profile(deployment):
    """A prefill fit of 3.9 s for a 1000-token prompt, and a decode fit of 14 ms at 4 sequences."""
    revision = deployment.current_revision
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.1, "b": 0.0038, "c": 0.0}},
                           points={"prefill": [{"prompt_tokens": n, "batch": 1, "batch_tokens": n,
                                                "latency_s": 0.1 + 0.0038 * n, "source": "synthetic"}
                                               for n in (250, 500, 1000)]})
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 0.001, "c": 0.0}},
                           points={"decode": [{"batch": b, "context": 200, "step_s": 0.01 + 0.001 * b,
                                               "source": "synthetic"} for b in (1, 4, 8)]})
    return deployment


def _live_traffic(deployment, seed_samples, make_worker, *, ttft_p50: float, itl_p50: float) -> None:
    """Five minutes of 2 requests/s of 1000-token prompts and 100-token answers, 4 running on one decode worker."""
    make_worker(deployment, "decode")
    for metric, role, value in (("qps", "prefill", 2.0), ("prompt_tokens_per_second", "prefill", 2000.0),
                                ("generation_tokens_per_second", "decode", 200.0),
                                ("ttft_p50_seconds", "prefill", ttft_p50), ("itl_p50_seconds", "decode", itl_p50),
                                ("itl_p99_seconds", "decode", itl_p50 * 2), ("requests_running", "decode", 4.0)):
        seed_samples(deployment, metric, [value] * 12, role=role, step_s=20)


def _figures(html: str) -> dict:
    return json.loads(re.search(r'<script id="profile-figures" type="application/json">(.*?)</script>', html,
                                re.S).group(1))


def test_the_page_warns_when_live_ttft_contradicts_the_prefill_fit(slow_prefill_profile, seed_samples, make_worker,
                                                                   client_for, viewer):
    _live_traffic(slow_prefill_profile, seed_samples, make_worker, ttft_p50=0.4, itl_p50=0.015)
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    warning = html[html.index('id="profile-disagrees"'):html.index("</div>", html.index('id="profile-disagrees"'))]
    assert "Live P50 time to first token of 1000-token prompts in the last 5 minutes is 400 ms" in warning
    assert "the prefill profile (default) predicts 3.9 s: 1/9.8 of the fit" in warning
    assert "inter-token" not in warning  # decode agrees: 15 ms live against 14 ms fitted
    assert "Run a new profile" in warning
    assert 'data-disagrees="1"' in html
    # The live points of the last minutes are drawn against the curves.
    live = [t for t in _figures(html)["prefill"] if t["name"].startswith("live now")]
    assert live and live[0]["x"] == [1000] and live[0]["y"] == [pytest.approx(400.0)]
    assert any(t["name"].startswith("live now") for t in _figures(html)["decode"])


def test_no_warning_when_live_traffic_agrees_with_the_profile(slow_prefill_profile, seed_samples, make_worker,
                                                              client_for, viewer):
    _live_traffic(slow_prefill_profile, seed_samples, make_worker, ttft_p50=4.5, itl_p50=0.015)
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    assert 'id="profile-disagrees"' not in html and 'data-disagrees="0"' in html
    assert 'id="profile-agrees"' in html


def test_without_traffic_now_the_newest_stored_live_point_is_checked(slow_prefill_profile, client_for, viewer):
    profile = Profile.objects.get(role="decode")
    profile.points["decode"].append({"batch": 4, "context": 200, "step_s": 0.09, "source": "live", "ts": 1.0})
    profile.save(update_fields=["points"])
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    warning = html[html.index('id="profile-disagrees"'):html.index("</div>", html.index('id="profile-disagrees"'))]
    assert "P50 inter-token latency at 4 sequences of context 200 in the newest live point stored is 90 ms" in warning
    assert "predicts 14 ms: 6.4× the fit" in warning
