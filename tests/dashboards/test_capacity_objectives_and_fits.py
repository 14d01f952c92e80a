"""The capacity page plans for the deployment's own objectives, writes fitted curves in words (units, 3 significant
digits) instead of raw dicts, and serves its profile section alone for the in-place update after a profile run."""
from __future__ import annotations

import re

import pytest

from controlplane.capacity.models import Profile
from dashboards.profiles import duration_text, fit_lines

FITS = {"prefill": {"a": 0.012345678901234567, "b": 0.0031234567890123456, "c": 0.0},
        "decode": {"a": 0.010987654321098765, "b": 0.00051234567890123456, "c": 1.2345678901234567e-07}}


@pytest.fixture
def profiled(deployment):
    revision = deployment.current_revision
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": FITS["prefill"]},
                           points={"prefill": [{"prompt_tokens": n, "batch": 1, "batch_tokens": n,
                                                "latency_s": 0.0123 + 0.0031 * n, "source": "synthetic"}
                                               for n in (16, 64, 256)]})
    Profile.objects.create(revision=revision, role="decode", fits={"decode": FITS["decode"]},
                           points={"decode": [{"batch": b, "context": 64, "step_s": 0.011 + 5e-4 * b,
                                               "source": "synthetic"} for b in (1, 4, 8)]})
    return deployment


def _input(html: str, name: str) -> dict:
    tag = re.search(rf'<input[^>]*name="{name}"[^>]*>', html).group(0)
    return dict(re.findall(r'(\w+)="([^"]*)"', tag))


def test_the_plan_form_starts_from_the_deployments_objectives(deployment, client_for, viewer):
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    # The demo's defaults: TTFT 10 s, ITL 1 s (not 1000 and 200 ms).
    assert _input(html, "ttft_p99_ms")["value"] == "10000"
    itl = _input(html, "itl_p99_ms")
    assert itl["value"] == "1000" and float(itl["max"]) >= 1000


def test_objectives_set_on_the_deployment_page_are_the_capacity_pages_defaults(deployment, client_for, viewer,
                                                                               operator):
    from controlplane.services import deployment_objectives_set

    deployment_objectives_set(deployment=deployment, objectives={"ttft_p99_seconds": 2.5, "itl_p99_seconds": 0.3},
                              actor=operator)
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    assert _input(html, "ttft_p99_ms")["value"] == "2500"
    assert _input(html, "itl_p99_ms")["value"] == "300"


def test_durations_are_written_in_a_readable_unit_with_3_significant_digits():
    assert duration_text(3.912345) == "3.91 s"
    assert duration_text(0.012345678901234567) == "12.3 ms"
    assert duration_text(0.0031234567890123456) == "3.12 ms"
    assert duration_text(4.1e-6) == "4.1 µs"
    assert duration_text(1.2345678901234567e-07) == "123 ns"
    assert duration_text(0.0) == "0 s"


def test_fits_are_written_as_formulas():
    assert fit_lines(FITS) == [
        ("prefill", "one prompt of n tokens ≈ 12.3 ms + 3.12 ms/token·n"),
        ("decode", "a step of B sequences of context L ≈ 11 ms + 512 µs·B + 123 ns·B·L"),
    ]
    assert fit_lines({"kv_transfer": {"seconds_per_token": 2e-6}, "overhead": {"request_s": 0.003}}) == [
        ("KV transfer", "2 µs/prompt token"), ("overhead", "3 ms per request")]


def test_the_profile_table_shows_the_formulas_not_python_dicts(profiled, client_for, viewer):
    html = client_for(viewer).get("/deployments/demo/capacity/").content.decode()
    table = html[html.index('id="profile-table"'):html.index("</table>", html.index('id="profile-table"'))]
    assert "12.3 ms + 3.12 ms/token·n" in table
    assert "11 ms + 512 µs·B + 123 ns·B·L" in table
    assert "{" not in table and "0.0123456789" not in table


def test_the_profile_section_is_served_alone_for_the_in_place_update(profiled, client_for, viewer):
    response = client_for(viewer).get("/deployments/demo/capacity/profiles")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'id="profile-body" data-has-profile="1"' in html and 'id="chart-prefill"' in html
    assert 'id="profile-figures"' in html


def test_without_a_profile_the_section_says_so_and_has_no_plot(deployment, client_for, viewer):
    html = client_for(viewer).get("/deployments/demo/capacity/profiles").content.decode()
    assert 'data-has-profile="0"' in html and "no capacity plan" in html and 'id="chart-prefill"' not in html
