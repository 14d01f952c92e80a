"""What sampling costs a decode step: the engine's sampler against the one it replaced (torch.multinomial, and a sort
of the whole vocabulary for top-k / top-p), in the same run. One JSON.

- `sampler`: one call over random logits of the model's vocabulary, per (setting, rows), best of `--repeats`;
- `decode`: the float32 engine at `--batch` concurrent requests, decode tokens/s and ms per step (without the
  prefill, as faster_tokens.py) greedy and with each setting, with this sampler and with the old one swapped in.

    python bench/engine/sampling_cost.py                 # SmolLM2, one thread
    python bench/engine/sampling_cost.py --model tiny --new-tokens 16
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.faster_tokens import decode_rates  # noqa: E402
from bench.lib.common import bootstrap, environment, model_dir, random_prompts, ratio  # noqa: E402

SETTINGS = {"temperature_1": {"temperature": 1.0}, "top_p_0.9": {"temperature": 0.7, "top_p": 0.9},
            "top_k_50": {"temperature": 1.0, "top_k": 50}}


class OldSampler:
    """The sampler before (git 70f9a69): multinomial over the whole vocabulary, top-k / top-p through a full sort."""

    def __init__(self, device):
        import torch

        self.generator = torch.Generator(device=device)

    def __call__(self, logits, seqs):
        import torch

        from inference.engine.sampler import adjust_logits, step_seed

        if any(seq.params.adjusts_logits for seq in seqs):
            logits = adjust_logits(logits, seqs)
        token_ids = logits.argmax(dim=-1)
        rows = [i for i, seq in enumerate(seqs) if not seq.params.is_greedy]
        if not rows:
            return token_ids.tolist()
        sampled = [seqs[i] for i in rows]
        row_index = torch.tensor(rows)
        sub = logits.index_select(0, row_index)
        sub = sub / torch.tensor([s.params.temperature for s in sampled]).unsqueeze(1)
        order = None
        if all(s.params.top_k == 0 and s.params.top_p >= 1.0 for s in sampled):
            probs = torch.softmax(sub, dim=-1)
        else:
            vocab = sub.shape[1]
            sorted_logits, order = sub.sort(dim=-1, descending=True)
            top_k = torch.tensor([s.params.top_k or vocab for s in sampled])
            sorted_logits = sorted_logits.masked_fill(torch.arange(vocab).unsqueeze(0) >= top_k.unsqueeze(1),
                                                      float("-inf"))
            probs = torch.softmax(sorted_logits, dim=-1)
            top_p = torch.tensor([s.params.top_p for s in sampled])
            probs = probs.masked_fill(probs.cumsum(dim=-1) - probs > top_p.unsqueeze(1), 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        choice = torch.empty(len(rows), 1, dtype=torch.long)
        for j, seq in enumerate(sampled):
            generator = None
            if seq.params.seed is not None:
                self.generator.manual_seed(step_seed(seq.params.seed, seq.num_completion_tokens))
                generator = self.generator
            choice[j] = torch.multinomial(probs[j], 1, generator=generator)
        if order is not None:
            choice = order.gather(1, choice)
        token_ids[row_index] = choice.squeeze(1)
        return token_ids.tolist()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,8,32", help="sampler rows per call")
    p.add_argument("--batch", type=int, default=8, help="concurrent requests of the engine's decode")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def sampler_section(vocab: int, args) -> dict:
    import torch

    from inference.engine.sampler import Sampler
    from inference.engine.sequence import SamplingParams, Sequence

    out = {}
    for rows in [int(r) for r in args.rows.split(",")]:
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 3
        for name, setting in SETTINGS.items():
            seqs = [Sequence(f"r{i}", [1, 2, 3], SamplingParams(**setting)) for i in range(rows)]
            best = {}
            for label, sampler in (("new", Sampler(torch.device("cpu"))), ("old", OldSampler("cpu"))):
                sampler(logits, seqs)
                times = []
                for _ in range(max(5, args.repeats * 3)):
                    start = time.perf_counter()
                    sampler(logits, seqs)
                    times.append(time.perf_counter() - start)
                best[label] = min(times) * 1e3
            out[f"{name}@{rows}"] = {"new_ms": round(best["new"], 3), "old_ms": round(best["old"], 3),
                                     "old_over_new": ratio(best["old"], best["new"])}
    return out


def decode_section(path: Path, args) -> dict:
    from inference.engine import Config, LLMEngine, SamplingParams

    engine = LLMEngine(Config(model=path, dtype="float32", threads=args.threads, kv_cache_bytes=256 << 20,
                              prefix_caching=False))
    runner = engine.model_runner
    new_sampler, old_sampler = runner.sampler, OldSampler(runner.device)
    prompts = random_prompts(args.batch, args.prompt_tokens, runner.vocab_size, seed=3)

    def run_with(setting: dict, sampler):
        def run(batch, n):
            runner.sampler = sampler
            return engine.generate(batch, SamplingParams(max_tokens=n, ignore_eos=True, **setting))
        return run

    runners = {"greedy": run_with({}, new_sampler)}
    for name, setting in SETTINGS.items():
        runners[f"{name}/new"] = run_with(setting, new_sampler)
        runners[f"{name}/old"] = run_with(setting, old_sampler)
    rates = decode_rates(runners, prompts, args.new_tokens, args.repeats)
    runner.sampler = new_sampler
    for name in SETTINGS:
        rates[f"{name}/new"]["vs_old"] = ratio(rates[f"{name}/new"]["tok_s"], rates[f"{name}/old"]["tok_s"])
        rates[f"{name}/new"]["vs_greedy"] = ratio(rates[f"{name}/new"]["tok_s"], rates["greedy"]["tok_s"])
        rates[f"{name}/old"]["vs_greedy"] = ratio(rates[f"{name}/old"]["tok_s"], rates["greedy"]["tok_s"])
    return {"batch": args.batch, "rates": rates}


def main(argv=None) -> int:
    args = parse_args(argv)
    bootstrap(args.threads)
    path = model_dir(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    from inference.hardware import cpu_flags

    doc = {"bench": "sampling_cost", "model": args.model, "vocab_size": vocab, "settings": vars(args),
           "environment": environment(), "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(
               ("avx", "amx", "fma", "f16c")))}
    doc["sampler"] = sampler_section(vocab, args)
    doc["decode"] = decode_section(path, args)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
