"""The dtype an engine runs in: `auto` resolved from the model's own config, and float16 refused where it would crawl.

- `auto` is the dtype the model's config.json names (`dtype`, or `torch_dtype` in folders saved by transformers < 4.56),
  float32 where it names none (or one the engine does not run). A float16 model on a CPU without fast float16 runs in
  float32 instead: `auto` means "the model's precision where it runs well", never a refusal.
- An explicit `float16` on such a CPU is refused with a message that names the alternatives, unless the operator
  forces it (`allow_slow_float16`, which logs a warning).

A CPU has fast float16 when it has float16 arithmetic in hardware: AVX512-FP16 or AMX-FP16 (x86), FP16 SIMD (Arm's
`asimdhp`). Without it torch runs float16 matmuls through conversions: measured on this project's AVX512 CPU (with
BF16, no FP16), a SmolLM2-sized linear at 16-512 rows takes 3-8x the time of float32 and 6-16x that of bfloat16.
The flags are read, not timed: a timed probe on a shared, busy host gave a different answer from run to run.
"""
from __future__ import annotations

import functools
import json
import logging
import platform
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPE = "float32"  # `auto` where the model's config names no dtype
FAST_FLOAT16_CPU_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})  # as /proc/cpuinfo spells them


class SlowDtypeError(ValueError):
    """float16 was asked for on a CPU that has no fast float16."""


def model_config_dtype(model_dir: str | Path) -> str | None:
    """The dtype the model's config.json names ("bfloat16", ...), or None when it names none."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("dtype") or config.get("torch_dtype")
    return str(value).removeprefix("torch.") if value else None


def resolve_dtype(requested: str, model_dir: str | Path, device: torch.device, *,
                  allow_slow_float16: bool = False) -> str:
    """The dtype to run: `requested`, or for `auto` the model's own. Raises SlowDtypeError for an explicit float16 on
    a CPU without fast float16 (unless allowed)."""
    slow_float16 = device.type == "cpu" and not cpu_has_fast_float16()
    if requested == "auto":
        wanted = model_config_dtype(model_dir)
        if wanted not in TORCH_DTYPES:
            return DEFAULT_DTYPE
        if wanted == "float16" and slow_float16:
            log.warning("the model's dtype is float16, but this CPU has no fast float16: dtype auto runs it in "
                        "float32")
            return "float32"
        return wanted
    if requested == "float16" and slow_float16:
        if not allow_slow_float16:
            raise SlowDtypeError(
                "dtype float16 would crawl on this CPU: it has no float16 arithmetic (AVX512-FP16, AMX-FP16 or "
                "Arm FP16), so every matmul converts (3-8x slower than float32 where measured). Use dtype bfloat16 "
                "(half the memory of float32; fast on CPUs with AVX512-BF16 or AMX), float32, or auto (the model's "
                "own dtype); to run float16 anyway, set allow_slow_float16 (--allow-slow-float16)")
        log.warning("running float16 on a CPU without fast float16, as forced by allow_slow_float16: expect it to "
                    "be several times slower than float32")
    return requested


def cpu_has_fast_float16() -> bool:
    if cpu_flags() & FAST_FLOAT16_CPU_FLAGS:
        return True
    # macOS has no /proc/cpuinfo; every Apple Silicon CPU has Arm's FP16 arithmetic.
    return platform.system() == "Darwin" and platform.machine() == "arm64"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, Arm `Features`); empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)
