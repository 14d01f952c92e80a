"""The roofline arithmetic: a worker's share of its host's figures, each stage's efficiency over its window, and the
parameter count read from safetensors headers."""
from __future__ import annotations

import json
import struct

import pytest

from inference.roofline import (StageRoofline, count_parameters, decode_efficiency, format_gflops_flag,
                                parse_gflops_flag, peaks_for_threads, precision_key, prefill_efficiency)

HOST = {"one_thread": {"threads": 1, "matmul_gflops": {"float32": 50.0, "int8": 100.0}, "read_gbs": 10.0},
        "all_cores": {"threads": 4, "matmul_gflops": {"float32": 150.0, "int8": 400.0}, "read_gbs": 25.0}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_prefill_efficiency_counts_two_flops_per_parameter_and_token():
    # 1e8 parameters x 1,000 tokens x 2 = 2e11 FLOPs in 2 s = 100 GFLOP/s, against a 400 GFLOP/s peak.
    assert prefill_efficiency(num_parameters=100_000_000, num_tokens=1000, seconds=2.0,
                              peak_gflops=400.0) == pytest.approx(0.25)


def test_decode_efficiency_is_the_weights_read_time_over_the_step_time():
    # 500 MB at 10 GB/s take 50 ms: a 100 ms step is at half the bandwidth limit.
    assert decode_efficiency(weight_bytes=500_000_000, seconds=0.1, read_gbs=10.0) == pytest.approx(0.5)


def test_a_worker_gets_one_threads_figures_times_its_threads_up_to_the_whole_host():
    assert peaks_for_threads(HOST, 1).matmul_gflops == {"float32": 50.0, "int8": 100.0}
    two = peaks_for_threads(HOST, 2)
    assert two.matmul_gflops == {"float32": 100.0, "int8": 200.0} and two.read_gbs == 20.0
    eight = peaks_for_threads(HOST, 8)
    assert eight.matmul_gflops == {"float32": 150.0, "int8": 400.0} and eight.read_gbs == 25.0


def test_a_host_that_measured_less_at_all_cores_than_at_one_caps_at_one_threads_figure():
    busy = {**HOST, "all_cores": {"threads": 2, "matmul_gflops": {"float32": 40.0, "int8": 90.0}, "read_gbs": 8.0}}
    peaks = peaks_for_threads(busy, 1)
    assert peaks.matmul_gflops == {"float32": 50.0, "int8": 100.0} and peaks.read_gbs == 10.0


def test_an_unmeasured_host_gives_no_figures():
    assert peaks_for_threads({}, 2) is None
    assert peaks_for_threads(None, 2) is None


def test_int8_weights_run_at_the_peak_of_their_kernel():
    assert precision_key("float32", "int8") == "int8"
    assert precision_key("float32", "int8", "matvec") == "float32"  # Tandem's kernel: prompts through float GEMM
    assert precision_key("bfloat16", "int8", "weight_only") == "bfloat16"
    assert precision_key("bfloat16", "none") == "bfloat16"


def test_the_flag_round_trips_and_a_bad_item_is_named():
    assert parse_gflops_flag(format_gflops_flag({"float32": 57.9, "int8": 80.0})) == {"float32": 57.9, "int8": 80.0}
    with pytest.raises(ValueError, match="'float32=fast'"):
        parse_gflops_flag("float32=fast")
    with pytest.raises(ValueError, match="'int8=-1'"):
        parse_gflops_flag("float32=1,int8=-1")


def _roofline(clock: Clock) -> StageRoofline:
    return StageRoofline(num_parameters=100_000_000, weight_bytes=400_000_000, peak_gflops=400.0, read_gbs=10.0,
                         precision="float32", window_s=60.0, clock=clock)


def test_each_stage_is_judged_over_its_own_steps():
    clock = Clock()
    roofline = _roofline(clock)
    assert roofline.efficiency("prefill") is None and roofline.efficiency("decode") is None
    # A 64-token prefill chunk: 1.28e10 FLOPs in 0.128 s = 100 GFLOP/s, a quarter of the peak.
    assert roofline.observe_step(num_tokens=64, num_prefill_tokens=64, seconds=0.128) == "prefill"
    # A decode step: 400 MB in 0.08 s = 5 GB/s, half the bandwidth.
    assert roofline.observe_step(num_tokens=4, num_prefill_tokens=0, seconds=0.08) == "decode"
    assert roofline.efficiency("prefill") == pytest.approx(0.25)
    assert roofline.efficiency("decode") == pytest.approx(0.5)
    snapshot = roofline.snapshot()
    assert snapshot["prefill_efficiency"] == 0.25 and snapshot["decode_efficiency"] == 0.5
    assert snapshot["peak_gflops"] == 400.0 and snapshot["read_gbs"] == 10.0


def test_a_mixed_step_counts_for_prefill_when_mostly_prompt_and_for_neither_when_mostly_decode():
    roofline = _roofline(Clock())
    assert roofline.observe_step(num_tokens=64, num_prefill_tokens=60, seconds=0.1) == "prefill"
    assert roofline.observe_step(num_tokens=64, num_prefill_tokens=4, seconds=0.1) is None
    assert roofline.efficiency("decode") is None


def test_steps_older_than_the_window_no_longer_count():
    clock = Clock()
    roofline = _roofline(clock)
    roofline.observe_step(num_tokens=1, num_prefill_tokens=0, seconds=0.4)  # slow: 0.1 of the bandwidth
    clock.now = 61.0
    roofline.observe_step(num_tokens=1, num_prefill_tokens=0, seconds=0.08)  # 0.5
    assert roofline.efficiency("decode") == pytest.approx(0.5)


def test_a_stage_without_its_host_figure_reports_none():
    roofline = StageRoofline(num_parameters=10, weight_bytes=10, peak_gflops=None, read_gbs=10.0,
                             precision="bfloat16")
    roofline.observe_step(num_tokens=8, num_prefill_tokens=8, seconds=0.1)
    assert roofline.efficiency("prefill") is None


def test_parameters_are_counted_from_the_safetensors_headers(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "embed": {"dtype": "F32", "shape": [100, 8], "data_offsets": [0, 0]},
              "norm": {"dtype": "F32", "shape": [8], "data_offsets": [0, 0]}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert count_parameters(tmp_path) == 808
