"""A worker's stages against its host's roofline: prefill against the matmul peak, decode against the read bandwidth.

Torch-free: the node agent stores the host's figures (measured by `inference.roofline_measure` in a child process,
so that the agent never holds torch), passes a worker the ones for its threads and dtype as flags, and the worker's
engine loop times its steps against them.

- The host's figures (`Node.roofline`) are measured at one thread and at all of the host's cores. A worker with T
  threads gets `min(one thread x T, all cores)` for both the matmul peak and the read bandwidth (never less than
  one thread's): compute scales with cores until the host's all-core figure; bandwidth too, until the memory bus is
  the limit.
- Prefill efficiency: achieved FLOP/s / peak, counting 2 x parameters x tokens FLOPs per step (the matmuls of a
  dense decoder; attention's own FLOPs are left out, as in the bench).
- Decode efficiency: the weight bytes one step reads / (step time x read bandwidth): 1.0 is a step that does nothing
  but stream the weights once. KV reads are left out (small next to the weights at the batch sizes of a CPU host).
- A step counts for prefill when at least half of its tokens are prompt tokens (a chunked colocated step mixes both;
  its FLOPs count every token it fed), for decode when it has no prompt tokens; a mostly-decode mixed step counts
  for neither. Each stage's figure is over its steps of the last WINDOW_S seconds in which it ran: a gauge that
  says how the stage runs, absent until the stage has run a step.
"""
from __future__ import annotations

import json
import struct
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

WINDOW_S = 60.0
STAGES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class HostPeaks:
    """What one worker can reach on its host: matmul GFLOP/s per precision ("float32", "bfloat16", "int8") and
    read bandwidth in GB/s."""

    matmul_gflops: dict[str, float]
    read_gbs: float | None


def precision_key(dtype: str, quantization: str = "none", int8_kernel: str | None = "fbgemm") -> str:
    """The matmul peak a worker's prefill linears run at: INT8 weights on fbgemm's int8 kernel (`fbgemm`, and `split`
    for long steps) whatever the dtype; on Tandem's (`matvec`) a prompt's linears dequantize into torch's float32
    GEMM; weight-only ones run the dtype."""
    if quantization != "int8":
        return dtype
    return {"fbgemm": "int8", "split": "int8", "matvec": "float32"}.get(int8_kernel or "", dtype)


def peaks_for_threads(roofline: dict | None, threads: int) -> HostPeaks | None:
    """The peaks of a worker with `threads` threads from a Node.roofline document (None where there is none)."""
    if not roofline or "one_thread" not in roofline:
        return None
    one, full = roofline["one_thread"], roofline.get("all_cores") or roofline["one_thread"]
    threads = max(1, int(threads))

    def scaled(single: float | None, most: float | None) -> float | None:
        if single is None:
            return most
        # A busy host can measure less at all cores than at one: one thread's figure is then the cap.
        return round(min(single * threads, max(most or 0.0, single)), 1)

    gflops = {key: scaled(value, full.get("matmul_gflops", {}).get(key))
              for key, value in one.get("matmul_gflops", {}).items()}
    return HostPeaks(matmul_gflops={k: v for k, v in gflops.items() if v}, read_gbs=scaled(one.get("read_gbs"),
                                                                                         full.get("read_gbs")))


def format_gflops_flag(gflops: dict[str, float]) -> str:
    """{"float32": 57.9, "int8": 80.0} -> "float32=57.9,int8=80.0" (the worker's --host-peak-gflops)."""
    return ",".join(f"{key}={value:g}" for key, value in sorted(gflops.items()))


def parse_gflops_flag(text: str) -> dict[str, float]:
    """The inverse of format_gflops_flag; ValueError naming the bad item."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or not key.strip() or not number > 0:
            raise ValueError(f"{item!r} is not PRECISION=GFLOPS with GFLOPS > 0 (e.g. float32=57.9,int8=80)")
        out[key.strip()] = number
    return out


def prefill_efficiency(*, num_parameters: int, num_tokens: int, seconds: float, peak_gflops: float) -> float:
    """Achieved matmul FLOP/s of a prefill (2 x parameters x tokens over its time) / the peak."""
    return 2 * num_parameters * num_tokens / seconds / (peak_gflops * 1e9)


def decode_efficiency(*, weight_bytes: int, seconds: float, read_gbs: float) -> float:
    """The time to read the weights once at the read bandwidth / one decode step's time."""
    return weight_bytes / (seconds * read_gbs * 1e9)


def count_parameters(model_dir: str | Path) -> int:
    """Parameters of the model as saved (each tensor of its safetensors files once: a tied lm_head is not stored
    twice), read from the files' headers alone; 0 where the folder has no safetensors."""
    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                num = 1
                for dim in entry["shape"]:
                    num *= dim
                total += num
    return total


class StageRoofline:
    """A worker's efficiency per stage over the steps of the last WINDOW_S seconds in which that stage ran (an idle
    stage keeps the figure of its last minute of work), fed one engine step at a time by the engine thread; other
    threads read `efficiency` and `snapshot` (floats swapped whole, never a half-updated sum)."""

    def __init__(self, *, num_parameters: int, weight_bytes: int, peak_gflops: float | None, read_gbs: float | None,
                 precision: str, window_s: float = WINDOW_S, clock=time.monotonic):
        self.num_parameters, self.weight_bytes = num_parameters, weight_bytes
        self.peak_gflops, self.read_gbs, self.precision = peak_gflops, read_gbs, precision
        self.window_s, self.clock = window_s, clock
        # stage -> deque of (at, units, seconds): units are tokens fed (prefill) or steps (decode); and their sums.
        self._steps: dict[str, deque] = {stage: deque() for stage in STAGES}
        self._sums: dict[str, tuple[int, float]] = dict.fromkeys(STAGES, (0, 0.0))

    def observe_step(self, *, num_tokens: int, num_prefill_tokens: int, seconds: float) -> str | None:
        """Count one engine step; returns the stage it counted for (None: neither)."""
        if seconds <= 0 or num_tokens <= 0:
            return None
        if num_prefill_tokens > 0 and 2 * num_prefill_tokens >= num_tokens:
            stage, units = "prefill", num_tokens
        elif num_prefill_tokens == 0:
            stage, units = "decode", 1
        else:
            return None
        steps, now = self._steps[stage], self.clock()
        total_units, total_s = self._sums[stage]
        steps.append((now, units, seconds))
        total_units, total_s = total_units + units, total_s + seconds
        while steps[0][0] < now - self.window_s:
            _, old_units, old_s = steps.popleft()
            total_units, total_s = total_units - old_units, total_s - old_s
        self._sums[stage] = (total_units, total_s)
        return stage

    def efficiency(self, stage: str) -> float | None:
        """The stage's efficiency over its window; None before its first step, or without the host's figure."""
        units, seconds = self._sums[stage]
        if seconds <= 0:
            return None
        if stage == "prefill":
            return prefill_efficiency(num_parameters=self.num_parameters, num_tokens=units, seconds=seconds,
                                      peak_gflops=self.peak_gflops) if self.peak_gflops else None
        return decode_efficiency(weight_bytes=self.weight_bytes * units, seconds=seconds,
                                 read_gbs=self.read_gbs) if self.read_gbs else None

    def snapshot(self) -> dict:
        """For /info: the peaks this worker is judged against and each stage's efficiency (None: no data)."""
        return {"precision": self.precision, "peak_gflops": self.peak_gflops, "read_gbs": self.read_gbs,
                "num_parameters": self.num_parameters, "weight_bytes": self.weight_bytes, "window_s": self.window_s,
                **{f"{stage}_efficiency": _rounded(self.efficiency(stage)) for stage in STAGES}}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# Other processes' average CPU use during the measurement (cores) past which its figures are flagged as disturbed:
# they competed for the cores (and the memory bus) being measured, so the peaks read low.
DISTURBED_OTHERS_CORES = 0.5


def disturbance(doc: dict) -> str | None:
    """Why a measurement's figures read low (another process competed for the cores; all cores measured slower than
    one thread), or None."""
    reasons = []
    others = doc.get("others_cores")
    if others is not None and others > DISTURBED_OTHERS_CORES:
        reasons.append(f"other processes kept {others:g} cores busy while it ran")
    one, full = doc.get("one_thread") or {}, doc.get("all_cores") or {}
    if full.get("threads", 1) > 1:
        slower = [p for p, gflops in (one.get("matmul_gflops") or {}).items()
                  if gflops and (full.get("matmul_gflops") or {}).get(p, gflops) < gflops]
        if slower:
            reasons.append(f"all cores measured slower than one thread ({', '.join(sorted(slower))})")
    return "; ".join(reasons) or None
