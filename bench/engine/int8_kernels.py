"""INT8's two CPU kernels in the engine, on this CPU: which one `matvec: auto` should pick here.

The engine's INT8 linears run either Tandem's int8 kernel (`matvec: tandem`; inference/engine/kernels/int8_matvec.c: int16
activations, AVX2) or fbgemm's dynamic int8 linear (`matvec: torch`); `auto` takes the kernel on a decode worker
and on a CPU without an int8 dot product (VNNI), fbgemm for prefill and colocated workers on one with it
(quantization.default_kernel). This runs both engines on the same
model and prompts, in interleaved rounds (best kept), and prints per kernel:

- the single-stream decode step (a prompt of `--prompt-tokens`, `--new-tokens` greedy tokens; the step is the time of
  N tokens minus that of one, over N - 1, so the prefill is left out);
- decode tokens/s with `--concurrency` requests decoding together: the steps after every request has its first
  token, timed alone (the tokens they make over their time; a subtraction of two whole runs, as the single stream's,
  swung widely between rounds: a busy spell in the shorter run's prefill inflates it);
- prefill tokens/s of one `--prefill-tokens` prompt (the kernel dequantizes each weight into torch's float GEMM for
  steps of 128 tokens or more);
- the greedy tokens of the two, compared (they round differently, so they may part at a near-tie);

and each kernel's figures over fbgemm's, with what `auto` picks on this CPU and why. On a CPU with AVX512-VNNI also
`tandem_avx2`: Tandem's kernel with VNNI's multiply-add switched off (its AVX2 madd and add, the same values; VNNI
runs the steps of 4 tokens or more), in the same rounds, and `vnni_over_avx2`.

    python bench/engine/int8_kernels.py              # SmolLM2, 1 thread
    python bench/engine/int8_kernels.py --threads 2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import Timer, bootstrap, emit, environment, model_dir, random_prompts, ratio  # noqa: E402

# matvec setting: the INT8 linears it runs ("auto": what a colocated worker takes here, `split` on a CPU with VNNI)
KERNELS = {"tandem": "Tandem's int8 kernel", "torch": "fbgemm", "auto": "auto"}
ROLES = ("prefill", "decode", "colocated")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prefill-tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best of each is kept")
    return p.parse_args(argv)


def make_engine(path: Path, matvec: str, args, quantization: str = "int8"):
    """Prefix caching off: the rounds repeat their prompts, and each must be prefilled again."""
    from inference.engine import Config, LLMEngine

    return LLMEngine(Config(model=path, role="colocated", device="cpu", dtype="float32", threads=args.threads,
                            quantization=quantization, matvec=matvec, kv_cache_bytes=256 << 20, prefix_caching=False,
                            max_num_seqs=max(64, args.concurrency),
                            max_num_batched_tokens=max(2048, args.prefill_tokens)))


def run(args) -> dict:
    bootstrap(args.threads)
    import torch

    from inference.engine import SamplingParams
    from inference.engine.quantization import INT8_KERNEL_NAMES, default_kernel, kernel_note
    from inference.hardware import cpu_flags

    from inference.engine.kernels import int8_linear

    path = model_dir(args.model)
    engines = {m: make_engine(path, m, args) for m in KERNELS}
    kernels = {m: e.model_runner.int8_kernel for m, e in engines.items()}
    engines["float32"] = make_engine(path, "auto", args, quantization="none")  # what INT8 must never be slower than
    library = int8_linear.load()[0]
    vnni = library is not None and library.vnni
    # (engine, VNNI on or off for its rounds; None: as it is)
    runs = {m: (e, True if m == "tandem" and vnni else None) for m, e in engines.items()}
    if vnni:
        runs["tandem_avx2"] = (engines["tandem"], False)
        kernels["tandem_avx2"] = kernels["tandem"]
    vocab = engines["torch"].model_runner.model.config.vocab_size
    one = random_prompts(1, args.prompt_tokens, vocab, seed=1)
    many = random_prompts(args.concurrency, args.prompt_tokens, vocab, seed=2)
    long = random_prompts(1, args.prefill_tokens, vocab, seed=3)

    def timed(engine, prompts, max_tokens) -> tuple[float, list[list[int]]]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        with Timer("cpu") as t:
            out = engine.generate(prompts, params)
        return t.seconds, out

    counter = iter(range(10**9))

    def decode_tok_s(engine, prompts, max_tokens) -> float:
        """Tokens over time of the steps after every request has its first token."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        ids = [f"c{next(counter)}" for _ in prompts]
        for request_id, prompt in zip(ids, prompts):
            engine.add_request(request_id, prompt, params)
        started: set[str] = set()
        while len(started) < len(ids):
            started |= {o.request_id for o in engine.step() if o.new_token_ids}
        made = 0
        with Timer("cpu") as t:
            while engine.has_unfinished():
                made += sum(len(o.new_token_ids) for o in engine.step())
        return made / max(t.seconds, 1e-9)

    for e in engines.values():  # first calls pay for lazy init; keep them out of the timings
        timed(e, one, 4)
    best: dict[str, dict[str, float]] = {m: {} for m in runs}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.repeats):
        for m, (e, use_vnni) in runs.items():
            if use_vnni is not None:
                library.use_vnni(use_vnni)
            b = best[m]
            s1, _ = timed(e, one, 1)
            sn, out = timed(e, one, args.new_tokens)
            tokens[m] = out[0]
            b["step_ms"] = min(b.get("step_ms", 1e9), 1000 * max(sn - s1, 0.0) / (args.new_tokens - 1))
            b["concurrent_decode_tok_s"] = max(b.get("concurrent_decode_tok_s", 0.0),
                                               decode_tok_s(e, many, args.new_tokens))
            sp, _ = timed(e, long, 1)
            b["prefill_tok_s"] = max(b.get("prefill_tok_s", 0.0), args.prefill_tokens / sp)
    if vnni:
        library.use_vnni(True)
    results = {m: {"kernel": INT8_KERNEL_NAMES[kernels[m]] if m in kernels else "float32 weights",
                   **{k: round(v, 2) for k, v in best[m].items()}} for m in runs}
    a, b = tokens["tandem"], tokens["torch"]
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    auto = {role: default_kernel(torch.device("cpu"), "auto", role=role) for role in ROLES}
    return {"benchmark": "int8_kernels", "model": args.model, "threads": args.threads,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "concurrency": args.concurrency,
            "prefill_tokens": args.prefill_tokens, "results": results,
            "tandem_over_fbgemm": {
                "step_time": ratio(best["tandem"]["step_ms"], best["torch"]["step_ms"]),
                "concurrent_decode_tok_s": ratio(best["tandem"]["concurrent_decode_tok_s"],
                                                 best["torch"]["concurrent_decode_tok_s"]),
                "prefill_tok_s": ratio(best["tandem"]["prefill_tok_s"], best["torch"]["prefill_tok_s"])},
            "vnni_over_avx2": {
                "step_time": ratio(best["tandem"]["step_ms"], best["tandem_avx2"]["step_ms"]),
                "concurrent_decode_tok_s": ratio(best["tandem"]["concurrent_decode_tok_s"],
                                                 best["tandem_avx2"]["concurrent_decode_tok_s"]),
                "prefill_tok_s": ratio(best["tandem"]["prefill_tok_s"], best["tandem_avx2"]["prefill_tok_s"]),
                "greedy_tokens_identical": tokens["tandem"] == tokens["tandem_avx2"]} if vnni else None,
            "auto_over_float32": {key: ratio(best["auto"][key], best["float32"][key]) for key in best["auto"]},
            "auto_over_fbgemm": {key: ratio(best["auto"][key], best["torch"][key]) for key in best["auto"]},
            "greedy_tokens_identical_until": agree,
            "auto_picks": {role: kernel_note(auto[role], "auto", role=role) for role in ROLES},
            "cpu_flags": sorted(cpu_flags()), "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
