"""One side of bench/engine/peer_llamacpp.py, in its own process: the engine (project venv) or llama.cpp (the bench's
own venv, bench/.venv-peer, where llama-cpp-python is built from source). Prints one JSON on stdout.

    python bench/engine/peer_llamacpp_side.py engine SPEC.json
    bench/.venv-peer/bin/python bench/engine/peer_llamacpp_side.py llama SPEC.json

SPEC holds the token ids both sides run (so that they compute the same prompts), the threads and the variants:
{"threads", "new_tokens", "prompt": [ids], "concurrent_prompts": [[ids], ...], "model_dir", "variants": {...}}.

Both sides time the same three things per variant, greedy, ignoring end of sequence:
1. prefill: the time to the first token of `prompt` (the prompt computed, one token sampled); tokens/s = len / time;
2. single-stream decode: the time for `new_tokens` tokens minus the time to the first, over `new_tokens - 1`;
3. concurrent decode: the same over all `concurrent_prompts` at once (the engine's continuous batching; llama.cpp's
   parallel sequences: one context with one sequence per request, every decode step one batch of one token each, as
   llama-server's slots run them), aggregate tokens/s = requests x (new_tokens - 1) / (time - time to first tokens).
Each figure is the best of `repeats` in this process; the caller runs several rounds of both sides and keeps the best.
Only the standard library is imported at module level: the llama side runs without torch.
"""
from __future__ import annotations

import json
import sys
import time


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
        if seconds < best:
            best, out = seconds, result
    return best, out


def _figures(num_prompt_tokens: int, num_requests: int, new_tokens: int, t: dict) -> dict:
    """From the best times: prefill, single-stream and concurrent rates (see the module docstring)."""
    # A busy spell during the first-token run can make it the longer one: no figure then (None), not a wild one.
    single_decode_s = t["single_n"] - t["single_1"]
    batch_decode_s = t["batch_n"] - t["batch_1"]
    steps = new_tokens - 1
    return {
        "prefill_tok_s": round(num_prompt_tokens / t["single_1"], 2),
        "prefill_s": round(t["single_1"], 3),
        "single_decode_tok_s": round(steps / single_decode_s, 2) if single_decode_s > 0 else None,
        "single_step_ms": round(single_decode_s / steps * 1e3, 2) if single_decode_s > 0 else None,
        "concurrent_decode_tok_s": round(num_requests * steps / batch_decode_s, 2) if batch_decode_s > 0 else None,
        "concurrent_end_to_end_tok_s": round(num_requests * new_tokens / t["batch_n"], 2),
        "concurrent_first_tokens_s": round(t["batch_1"], 3),
    }


# -- the engine --------------------------------------------------------------------------------------------------

def engine_side(spec: dict) -> dict:
    import os

    os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
    import torch
    import transformers

    from inference.engine import Config, LLMEngine, SamplingParams

    torch.set_num_threads(spec["threads"])
    prompt, batch, n = spec["prompt"], spec["concurrent_prompts"], spec["new_tokens"]
    out: dict = {"torch": torch.__version__, "transformers": transformers.__version__, "variants": {}}
    for name, variant in spec["variants"].items():
        # Prefix caching off: every repeat computes its prompt again (the timings would otherwise read the cache).
        engine = LLMEngine(Config(model=spec["model_dir"], dtype=variant["dtype"],
                                  quantization=variant["quantization"], matvec=variant.get("matvec", "auto"),
                                  kv_cache_dtype=variant.get("kv_cache_dtype", "auto"),
                                  threads=spec["threads"],
                                  kv_cache_bytes=256 << 20, max_num_seqs=max(64, len(batch)),
                                  prefix_caching=False))
        params_1 = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        params_n = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        engine.generate([prompt[:32]], warm)  # lazy init, then the batch's shapes
        engine.generate([p[:8] for p in batch], warm)
        t: dict = {}
        t["single_1"], _ = _best(lambda: engine.generate([prompt], params_1), spec["repeats"])
        t["single_n"], single = _best(lambda: engine.generate([prompt], params_n), spec["repeats"])
        t["batch_1"], _ = _best(lambda: engine.generate(batch, params_1), spec["repeats"])
        t["batch_n"], outputs = _best(lambda: engine.generate(batch, params_n), spec["repeats"])
        assert len(single[0]) == n and all(len(o) == n for o in outputs), name
        out["variants"][name] = {
            **_figures(len(prompt), len(batch), n, t), "dtype": variant["dtype"],
            "quantization": variant["quantization"], "weight_bytes": engine.weight_bytes,
            "kv_cache_dtype": engine.kv_cache_dtype,
            "int8_kernel": engine.model_runner.int8_kernel,
            "prefill_chunk_size": engine.config.prefill_chunk_size, "chunked_prefill": engine.config.chunked_prefill,
            "tokens": single[0]}
        del engine
    return out


# -- llama.cpp ---------------------------------------------------------------------------------------------------

class _LlamaRunner:
    """Greedy generation through llama.cpp's C API (llama-cpp-python's ctypes bindings), several sequences at once.

    The high-level `Llama` class runs one sequence per context; the C API's batch carries a sequence id per token, so
    one context holds every request (n_seq_max of them), as llama-server's parallel slots do."""

    def __init__(self, model, *, n_ctx: int, n_seq_max: int, threads: int, n_batch: int, n_ubatch: int):
        import llama_cpp as C
        import numpy as np

        self.C, self.np = C, np
        params = C.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_ubatch
        params.n_seq_max, params.n_threads, params.n_threads_batch = n_seq_max, threads, threads
        params.no_perf = True
        self.ctx = C.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq_max})")
        self.context_params = {"n_ctx": C.llama_n_ctx(self.ctx), "n_batch": n_batch, "n_ubatch": n_ubatch,
                               "n_seq_max": n_seq_max, "kv_unified": bool(params.kv_unified),
                               "flash_attn_type": int(params.flash_attn_type), "type_k": int(params.type_k),
                               "type_v": int(params.type_v)}
        self.n_batch = n_batch
        self.n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
        self.batch = C.llama_batch_init(n_batch, 0, 1)

    def close(self) -> None:
        self.C.llama_batch_free(self.batch)
        self.C.llama_free(self.ctx)

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence, wants logits), at most n_batch of them."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = self.C.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {len(entries)} tokens")

    def _argmax(self, index: int) -> int:
        logits = self.np.ctypeslib.as_array(self.C.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """1. Clear the KV; 2. prefill every prompt, packed into batches of n_batch tokens, logits at each prompt's
        last token; 3. decode: one batch per step with each sequence's last token."""
        self.C.llama_memory_clear(self.C.llama_get_memory(self.ctx), True)
        entries = [(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
        outputs: list[list[int]] = [[] for _ in prompts]
        for start in range(0, len(entries), self.n_batch):
            chunk = entries[start:start + self.n_batch]
            self._decode(chunk)
            for i, (_, _, seq, logits) in enumerate(chunk):
                if logits:
                    outputs[seq].append(self._argmax(i))
        for _ in range(max_tokens - 1):
            self._decode([(out[-1], len(p) + len(out) - 1, seq, True)
                          for seq, (p, out) in enumerate(zip(prompts, outputs))])
            for seq in range(len(prompts)):
                outputs[seq].append(self._argmax(seq))
        return outputs


def llama_side(spec: dict) -> dict:
    import llama_cpp as C

    C.llama_backend_init()
    prompt, batch, n = spec["prompt"], spec["concurrent_prompts"], spec["new_tokens"]
    out: dict = {"llama_cpp_python": C.__version__,
                 "system_info": C.llama_print_system_info().decode(errors="replace").strip(), "variants": {}}
    for name, variant in spec["variants"].items():
        model_params = C.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = spec.get("extra_bufts", True)
        model = C.llama_model_load_from_file(variant["gguf"].encode(), model_params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {variant['gguf']}")
        sizes = {"threads": spec["threads"], "n_batch": spec["n_batch"], "n_ubatch": spec["n_ubatch"]}
        # One context per test, each sized to it: one sequence, then one per concurrent request.
        single = _LlamaRunner(model, n_ctx=len(prompt) + n + 16, n_seq_max=1, **sizes)
        single.generate([prompt[:32]], 2)  # warm-up
        t: dict = {}
        t["single_1"], _ = _best(lambda: single.generate([prompt], 1), spec["repeats"])
        t["single_n"], tokens = _best(lambda: single.generate([prompt], n), spec["repeats"])
        single_params = single.context_params
        single.close()
        per_seq = max(len(p) for p in batch) + n + 16
        parallel = _LlamaRunner(model, n_ctx=len(batch) * per_seq, n_seq_max=len(batch), **sizes)
        parallel.generate([p[:8] for p in batch], 2)  # warm-up
        t["batch_1"], _ = _best(lambda: parallel.generate(batch, 1), spec["repeats"])
        t["batch_n"], outputs = _best(lambda: parallel.generate(batch, n), spec["repeats"])
        assert all(len(o) == n for o in outputs), name
        out["variants"][name] = {**_figures(len(prompt), len(batch), n, t), "gguf": variant["gguf"],
                                 "weight_bytes": C.llama_model_size(model), "context_single": single_params,
                                 "context_concurrent": parallel.context_params,
                                 "concurrent_mode": "parallel sequences in one context (C API batch)",
                                 "tokens": tokens[0]}
        parallel.close()
        C.llama_model_free(model)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("engine", "llama"):
        print("usage: peer_llamacpp_side.py engine|llama SPEC.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    if argv[0] == "engine":
        from pathlib import Path

        root = str(Path(__file__).resolve().parents[2])
        if root not in sys.path:
            sys.path.insert(0, root)
        doc = engine_side(spec)
    else:
        doc = llama_side(spec)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
