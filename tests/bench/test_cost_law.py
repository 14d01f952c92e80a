"""The fleet cost law: a component's cost as a + b x workers, fitted over the measured sizes and summed per side."""
from __future__ import annotations

from bench.fleet.cost_law import fit, laws, sizing


def _entry(workers: int, web: float, gateways: float, sim: float) -> dict:
    cpu = {"web": {"cores": web}, "gateways": {"cores": gateways}, "sim_hosts": {"cores": sim}}
    return {"workers": workers, "cpu_by_component": cpu, "rss_mib_by_process": {"web": 100 + workers / 10}}


def test_a_line_is_found_and_one_size_is_no_law():
    law = fit([(100, 0.15), (500, 0.35), (1000, 0.6)])
    assert (law["a"], law["b_per_worker"], law["max_residual"]) == (0.1, 0.0005, 0.0)
    assert fit([(100, 0.1), (100, 0.2)]) is None


def test_the_sizing_adds_the_control_plane_not_the_simulated_hosts():
    found = laws([_entry(100, 0.15, 0.02, 0.3), _entry(1000, 0.6, 0.11, 3.0)])
    row1000, row10000 = sizing(found, [1000, 10000], largest=1000)
    assert row1000 == {"workers": 1000, "extrapolated": False, "control_plane_cores": 0.6,
                       "control_plane_cores_by_component": {"web": 0.6}, "control_plane_rss_mib": 200,
                       "gateway_cores": 0.11}
    assert row10000["extrapolated"] is True
    assert row10000["control_plane_cores"] == 5.1 and row10000["control_plane_rss_mib"] == 1100
