"""Measure this host's roofline: the matmul peak per precision it runs and the read bandwidth (torch, CPU).

`python -m inference.roofline_measure` prints one JSON document (the shape `inference.roofline.peaks_for_threads`
reads, stored as Node.roofline): the figures at one thread and at all of the host's cores. The node agent runs it
as a child process at registration and on demand, so that the agent itself never imports torch; the bench
(`bench/engine/stage_limits.py`) imports the same functions.

Precisions: float32 (the faster of `torch.matmul`, MKL's sgemm, and oneDNN's linear, the GEMM the engine's float32
steps of many tokens run: inference/engine/gemm.py; MKL alone would put a prefill above its own peak); bfloat16 only
where the CPU computes it natively (`inference.hardware`: without it one matmul
takes seconds and no worker should run it); int8 through fbgemm's dynamic-quantization linear, the kernel of the
engine's INT8 weights. Each figure is the best of a few tries of one matmul (the bench's shape, with a prompt of
`rows` tokens); the read bandwidth is a float32 tensor far larger than any cache, summed. About a second per thread
count on a laptop core.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
import warnings

import torch

from inference.hardware import cpu_flags, cpu_has_native_bfloat16
from inference.roofline import disturbance

# A prompt of `rows` tokens through SmolLM2's MLP up projection (576 -> 1536).
MATMUL_SHAPE = (2048, 576, 1536)
READ_TENSOR_BYTES = 256 << 20


def _best_seconds(fn, tries: int) -> float:
    fn()  # the first call pays for lazy init and packing caches
    best = math.inf
    for _ in range(tries):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def matmul_gflops(*, shape: tuple[int, int, int] = MATMUL_SHAPE, tries: int = 3,
                  bfloat16: bool | None = None, int8_int_mm: bool = False) -> dict[str, float]:
    """GFLOP/s of one matmul of `shape` (m, k, n) per precision, best of `tries`. `bfloat16`: measure it (default:
    where native); `int8_int_mm`: also torch._int_mm (the bench's extra kernel)."""
    m, k, n = shape
    flops = 2 * m * k * n

    def gflops(fn, num_tries: int = tries) -> float:
        return round(flops / _best_seconds(fn, num_tries) / 1e9, 1)

    a32, b32 = torch.randn(m, k), torch.randn(k, n)
    peaks = {"float32": gflops(lambda: a32 @ b32)}
    if torch.backends.mkldnn.is_available():
        w32 = b32.t().contiguous()  # [n, k], a linear's weight as loaded
        try:
            onednn = gflops(lambda: torch.ops.mkldnn._linear_pointwise(a32, w32, None, "none", [], ""))
        except (RuntimeError, AttributeError):  # a torch build without oneDNN's linear
            onednn = 0.0
        peaks["float32"] = max(peaks["float32"], onednn)
    if cpu_has_native_bfloat16() if bfloat16 is None else bfloat16:
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        # Without native bfloat16 one try tells (it converts inside and runs far slower).
        peaks["bfloat16"] = gflops(lambda: a16 @ b16, tries if cpu_has_native_bfloat16() else 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(torch.randn(n, k), torch.rand(n).double() / 100 + 1e-3,
                                        torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, None)
    peaks["int8"] = gflops(lambda: torch.ops.quantized.linear_dynamic(a32, packed, False))
    if int8_int_mm:
        a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8)
        b8 = torch.randint(-127, 128, (n, k), dtype=torch.int8).t()
        peaks["int8_int_mm"] = gflops(lambda: torch._int_mm(a8, b8))
    return peaks


def memory_bandwidth(num_bytes: int = READ_TENSOR_BYTES, tries: int = 3) -> dict:
    """Bytes per second this process reads (sum of a float32 tensor far larger than any cache) and copies."""
    x = torch.ones(num_bytes // 4)
    y = torch.empty_like(x)
    best_read = _best_seconds(lambda: x.sum(), tries)
    best_copy = _best_seconds(lambda: y.copy_(x), tries)
    return {"read_bytes_per_s": round(num_bytes / best_read), "copy_bytes_per_s": round(2 * num_bytes / best_copy),
            "tensor_bytes": num_bytes, "threads": torch.get_num_threads()}


def measure_at(threads: int, *, rows: int, tries: int) -> dict:
    """{"threads", "matmul_gflops", "read_gbs"} with torch on `threads` threads."""
    torch.set_num_threads(threads)
    shape = (rows, MATMUL_SHAPE[1], MATMUL_SHAPE[2])
    read = memory_bandwidth(tries=tries)
    return {"threads": threads, "matmul_gflops": matmul_gflops(shape=shape, tries=tries),
            "read_gbs": round(read["read_bytes_per_s"] / 1e9, 2)}


def _busy_cpu_seconds() -> float | None:
    """CPU seconds the whole host spent busy since boot (/proc/stat), or None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def others_during(fn):
    """(fn(), the cores other processes kept busy on average while it ran, or None where that cannot be read)."""
    busy, own, started = _busy_cpu_seconds(), _own_cpu_seconds(), time.monotonic()
    result = fn()
    wall = time.monotonic() - started
    busy_after = _busy_cpu_seconds()
    if busy is None or busy_after is None or wall <= 0:
        return result, None
    others = (busy_after - busy) - (_own_cpu_seconds() - own)
    return result, round(max(0.0, others) / wall, 2)


def host_roofline(*, rows: int = 1024, tries: int = 3) -> dict:
    """The document Node.roofline holds: one thread and all cores (one entry where the host has one core), how busy
    other processes kept the host meanwhile (`others_cores`), and `disturbed`: why the figures read low, or None."""
    started = time.perf_counter()
    num_cores = os.cpu_count() or 1

    def measure() -> tuple[dict, dict]:
        one = measure_at(1, rows=rows, tries=tries)
        return one, measure_at(num_cores, rows=rows, tries=tries) if num_cores > 1 else one

    (one, full), others = others_during(measure)
    doc = {"source": "measured", "device": "cpu", "cpu_count": num_cores,
           "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")) or f == "bf16"),
           "native_bfloat16": cpu_has_native_bfloat16(), "one_thread": one, "all_cores": full,
           "others_cores": others, "seconds": round(time.perf_counter() - started, 2)}
    doc["disturbed"] = disturbance(doc)
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.roofline_measure", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024, help="prompt tokens of the timed matmul (default 1024)")
    p.add_argument("--tries", type=int, default=3, help="best of this many tries per figure (default 3)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.tries < 1:
        p.error("--rows and --tries must be >= 1")
    json.dump(host_roofline(rows=args.rows, tries=args.tries), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
