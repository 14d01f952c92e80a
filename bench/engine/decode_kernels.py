"""One-token linears at a model's shapes, per kernel and dtype, against a plain read of the same bytes.

A single-stream decode step multiplies one token by every weight once: each linear is a matrix-vector product whose
floor is the time to read its weight from memory. This measures, for SmolLM2's shapes (q/o 576->576, k/v 576->192,
fused q/k/v 576->960, gate/up 576->1536, down 1536->576, lm_head 576->49152), how near each kernel torch offers
comes to that floor:

- float32 and bfloat16: Tandem's kernel (`tandem_matvec_<isa>`, inference/engine/kernels/matvec.c: the engine's default where
  it builds), `F.linear` over the [N, K] weight, `torch.mv` and `torch.addmv` on it,
  a matmul over the weight stored transposed ([K, N] in memory), oneDNN's prepacked linear
  (`mkldnn._reorder_linear_weight` + `mkldnn._linear_pointwise`, what inductor's freezing uses), `mkldnn_linear` on
  an mkldnn weight, and (float32) MKL's packed GEMM (`mkl._mkl_linear`);
- INT8: the engine's fbgemm linear (activations quantized per call, `quantized::linear_dynamic`) and the bare fbgemm
  call, Tandem's INT8 kernel (`tandem_int8_<isa>`, inference/engine/kernels/int8_matvec.c: int16 activations, the engine's
  with `matvec: tandem`), `torch._int_mm`, and weight-only `torch._weight_int8pack_mm` (int8 weight, per-channel
  scale, float input).

Weights come from memory, not from cache: each shape is held in enough copies to exceed any last-level cache and the
copies are called in turn (as a step calls 30 layers' weights). Kernels are timed in interleaved rounds (best round
kept), with this thread's CPU time beside wall time; `read` is a float32 tensor of the same bytes per copy, summed.

    python bench/engine/decode_kernels.py --threads 1
    python bench/engine/decode_kernels.py --threads 2 --dtypes float32
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment  # noqa: E402

# name: (out_features N, in_features K), SmolLM2-135M's.
SHAPES = {"q_o": (576, 576), "k_v": (192, 576), "qkv_fused": (960, 576), "gate_up": (1536, 576),
          "down": (576, 1536), "lm_head": (49152, 576)}
COPY_BYTES = 192 << 20  # per shape and kernel: beyond any last-level cache here
DTYPES = ("float32", "bfloat16", "int8")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds, the best kept")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.shapes = [s for s in args.shapes.split(",") if s]
    return args


def kernels(dtype: str, n: int, k: int, num_copies: int) -> dict:
    """{kernel: (call(i) running copy i once, weight bytes of one copy)} for one shape and dtype."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.05 for _ in range(num_copies)]
    x32 = torch.randn(1, k, generator=gen)
    out: dict = {}
    if dtype in ("float32", "bfloat16"):
        torch_dtype = getattr(torch, dtype)
        ws = [w.to(torch_dtype) for w in weights]
        x = x32.to(torch_dtype)
        xv = x[0]
        nbytes = ws[0].nbytes
        out["linear"] = (lambda i: F.linear(x, ws[i]), nbytes)
        out["mv"] = (lambda i: torch.mv(ws[i], xv), nbytes)
        zero = torch.zeros(n, dtype=torch_dtype)
        out["addmv"] = (lambda i: torch.addmv(zero, ws[i], xv), nbytes)
        wts = [w.t().contiguous() for w in ws]  # [K, N] in memory
        out["matmul_transposed"] = (lambda i: x @ wts[i], nbytes)
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in ws]
        out["mkldnn_prepacked"] = (lambda i: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], ""),
                                   nbytes)
        try:
            mk = [w.to_mkldnn() for w in ws]
            out["mkldnn_linear"] = (lambda i: torch._C._nn.mkldnn_linear(x.to_mkldnn(), mk[i], None).to_dense(),
                                    nbytes)
        except RuntimeError:
            pass
        if dtype == "float32":
            mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in ws]
            out["mkl_packed"] = (lambda i: torch.ops.mkl._mkl_linear(x, mkl[i], ws[i], None, 1), nbytes)
        from torch import nn

        from inference.engine.kernels import matvec

        library = matvec.load()[0]
        if library is not None:  # Tandem's kernel (the engine's matvec setting), as the engine calls it
            linears = []
            for w in ws:
                linear = nn.Linear(k, n, bias=False, dtype=torch_dtype).requires_grad_(False)
                linear.weight = nn.Parameter(w, requires_grad=False)
                linears.append(matvec.matvec_projection(library, linear))
            out[f"tandem_matvec_{library.isa}"] = (lambda i: linears[i](x), nbytes)
        return out
    from inference.engine.quantization import FbgemmInt8Linear, quantize_per_row

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = [FbgemmInt8Linear(w) for w in weights]
    nbytes = engine[0].num_packed_bytes
    out["fbgemm_engine"] = (lambda i: engine[i](x32), nbytes)
    anchored = torch.cat((x32, torch.tensor([[-1.0, 1.0]])), dim=1)
    out["fbgemm_linear_dynamic"] = (lambda i: torch.ops.quantized.linear_dynamic(anchored, engine[i]._packed, False),
                                    nbytes)
    rows = [quantize_per_row(w) for w in weights]
    w8 = [r[0] for r in rows]
    scales = [r[1] for r in rows]
    from inference.engine.kernels.int8_linear import MatVecInt8Linear
    from inference.engine.kernels.int8_linear import load as load_int8

    int8_library = load_int8()[0]
    if int8_library is not None:  # as the engine calls it
        tandem = [MatVecInt8Linear(int8_library, w, s) for w, s in rows]
        out[f"tandem_int8_{int8_library.isa}"] = (lambda i: tandem[i](x32), w8[0].nbytes)
    x8 = torch.randint(-127, 128, (1, k), dtype=torch.int8, generator=gen)
    try:
        torch._int_mm(x8, w8[0].t())
        out["int_mm"] = (lambda i: torch._int_mm(x8, w8[i].t()), w8[0].nbytes)
    except RuntimeError:
        pass
    for name, xw in (("weight_int8pack_mm_float32", x32), ("weight_int8pack_mm_bfloat16", x32.bfloat16())):
        s = [sc.to(xw.dtype) for sc in scales]
        try:
            torch._weight_int8pack_mm(xw, w8[0], s[0])
        except RuntimeError:
            continue
        out[name] = (lambda i, xw=xw, s=s: torch._weight_int8pack_mm(xw, w8[i], s[i]), w8[0].nbytes)
    return out


def measure(fns: dict, num_copies: int, rounds: int) -> dict:
    """Per kernel: best seconds per call (wall and this thread's CPU time), one round = every copy once."""
    best_wall = {name: math.inf for name in fns}
    best_cpu = {name: math.inf for name in fns}
    for name, fn in fns.items():  # warm: lazy init, first-touch of pages
        for i in range(num_copies):
            fn(i)
    for _ in range(rounds):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            for i in range(num_copies):
                fn(i)
            best_cpu[name] = min(best_cpu[name], (time.thread_time() - cpu) / num_copies)
            best_wall[name] = min(best_wall[name], (time.perf_counter() - wall) / num_copies)
    return {name: (best_wall[name], best_cpu[name]) for name in fns}


def run(args) -> dict:
    bootstrap(args.threads)
    import torch

    from bench.lib.common import cpu_flags_of_interest

    doc = {"benchmark": "decode_kernels", "threads": torch.get_num_threads(), "rounds": args.rounds,
           "cpu_flags": cpu_flags_of_interest(), "results": {}}
    for dtype in args.dtypes:
        for shape in args.shapes:
            n, k = SHAPES[shape]
            item = {"float32": 4, "bfloat16": 2, "int8": 1}[dtype]
            num_copies = max(2, math.ceil(COPY_BYTES / (n * k * item)))
            fns = kernels(dtype, n, k, num_copies)
            nbytes = {name: b for name, (_, b) in fns.items()}
            reads = [torch.ones(nbytes[next(iter(fns))] // 4) for _ in range(num_copies)]
            calls = {name: fn for name, (fn, _) in fns.items()} | {"read": lambda i: reads[i].sum()}
            nbytes["read"] = reads[0].nbytes
            times = measure(calls, num_copies, args.rounds)
            read_s = times["read"][0]
            doc["results"][f"{dtype}/{shape}"] = {
                name: {"us": round(wall * 1e6, 1), "cpu_us": round(cpu * 1e6, 1),
                       "gb_s": round(nbytes[name] / wall / 1e9, 2), "vs_read": round(wall / read_s, 2)}
                for name, (wall, cpu) in times.items()}
            del fns, calls, reads
    doc["environment"] = environment()
    return doc


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
