"""What sampling costs a decode step: the engine's sampler against the one it replaced (torch.multinomial, and a sort
of the whole vocabulary for top-k / top-p), in the same run. One JSON.

- `sampler`: one call over the model's own logits (recorded over the bench's written prompts), per (setting, rows),
  the median over the recorded steps;
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
from bench.lib.common import ROOT, bootstrap, environment, model_dir, ratio  # noqa: E402

PROMPTS = ROOT / "bench" / "data" / "greedy_prompts.json"  # written for this project

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
    p.add_argument("--prompt-tokens", type=int, default=64, help="at most, from the written prompts")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def text_prompts(engine, num: int, num_tokens: int) -> list[list[int]]:
    """The bench's written prompts (bench/data/greedy_prompts.json), cycled to `num`, each cut to `num_tokens`."""
    texts = json.loads(PROMPTS.read_text())["prompts"]
    encoded = [engine.tokenizer.encode(text)[:num_tokens] for text in texts]
    return [encoded[i % len(encoded)] for i in range(num)]


def recorded_logits(engine, prompts: list[list[int]], num_tokens: int) -> list:
    """The logits the sampler saw at each step of a greedy run over `prompts` (the model's real distributions)."""
    from inference.engine import SamplingParams

    runner, seen = engine.model_runner, []
    sampler = runner.sampler

    def record(logits, seqs):
        seen.append(logits.clone())
        return sampler(logits, seqs)

    runner.sampler = record
    try:
        engine.generate(prompts, SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    finally:
        runner.sampler = sampler
    return seen


def sampler_section(engine, args) -> dict:
    """Both samplers over the model's own logits, per setting and rows; and how often the nucleus of top_p lay
    within the candidates (else the whole vocabulary is sorted)."""
    import torch

    from inference.engine.sampler import CANDIDATES, Sampler
    from inference.engine.sequence import SamplingParams, Sequence

    rows_wanted = [int(r) for r in args.rows.split(",")]
    steps = [x for x in recorded_logits(engine, text_prompts(engine, max(rows_wanted), args.prompt_tokens), 16)
             if x.shape[0] == max(rows_wanted)]
    out: dict = {"steps": len(steps)}
    for rows in rows_wanted:
        for name, setting in SETTINGS.items():
            seqs = [Sequence(f"r{i}", [1, 2, 3], SamplingParams(**setting)) for i in range(rows)]
            best = {}
            for label, sampler in (("new", Sampler(torch.device("cpu"))), ("old", OldSampler("cpu"))):
                sampler(steps[0][:rows], seqs)
                times = []
                for _ in range(args.repeats):
                    for logits in steps:
                        start = time.perf_counter()
                        sampler(logits[:rows], seqs)
                        times.append(time.perf_counter() - start)
                best[label] = sorted(times)[len(times) // 2] * 1e3  # the median over steps and repeats
            out[f"{name}@{rows}"] = {"new_ms": round(best["new"], 3), "old_ms": round(best["old"], 3),
                                     "old_over_new": ratio(best["old"], best["new"])}
    within = 0
    for logits in steps:
        probs = torch.softmax(logits / 0.7, dim=-1).sort(dim=-1, descending=True).values
        within += int((probs[:, :CANDIDATES].sum(dim=-1) > 0.9).sum())
    out["top_p_0.9_nucleus_within_candidates"] = ratio(within, sum(x.shape[0] for x in steps))
    return out


def decode_section(engine, args) -> dict:
    from inference.engine import SamplingParams

    runner = engine.model_runner
    new_sampler, old_sampler = runner.sampler, OldSampler(runner.device)
    prompts = text_prompts(engine, args.batch, args.prompt_tokens)

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
    from inference.engine import Config, LLMEngine

    engine = LLMEngine(Config(model=path, dtype="float32", threads=args.threads, kv_cache_bytes=256 << 20,
                              prefix_caching=False))
    doc["sampler"] = sampler_section(engine, args)
    doc["decode"] = decode_section(engine, args)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
