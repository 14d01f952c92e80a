"""The dtype an engine runs in: `auto` resolved from the model's own config and the device's arithmetic, and float16
refused where it would crawl.

- `auto` is the dtype the model's config.json names (`dtype`, or `torch_dtype` in folders saved by transformers < 4.56),
  float32 where it names none (or one the engine does not run), and float32 where the device has no arithmetic for
  the named half precision: `auto` means "the model's precision where it runs well", never a refusal. The choice and
  its reason are logged and shown on the worker's /info (`dtype_reason`).
- bfloat16 is native on CUDA devices of compute capability 8.0 and up, and on CPUs with AVX512-BF16 or AMX-BF16
  (x86) or BF16 (Arm's `bf16`). Without it torch converts inside every matmul: on an AVX2+FMA CPU a bfloat16 matmul
  ran dozens of times slower than float32's, and a long prompt's forward several times slower (docs/engine.md,
  "Precision"). An explicit bfloat16 there
  still runs (half the memory; the operator chose) with a warning in the log.
- float16 is fast on CPUs with float16 arithmetic: AVX512-FP16 or AMX-FP16 (x86), FP16 SIMD (Arm's `asimdhp`).
  Without it torch runs float16 matmuls through conversions: on an AVX-512 CPU with BF16 and no FP16 a small model's
  linear takes several times float32's time and more still than bfloat16's. An
  explicit `float16` on such a CPU is refused with a message that names the alternatives, unless the operator
  forces it (`allow_slow_float16`, which logs a warning).

The flags are read, not timed: a timed probe on a shared, busy host gave a different answer from run to run.
"""
from __future__ import annotations

import json
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.hardware import FAST_FLOAT16_CPU_FLAGS, NATIVE_BFLOAT16_CPU_FLAGS, cpu_flags

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPE = "float32"  # `auto` where the model's config names no dtype
NATIVE_BFLOAT16_CUDA_CAPABILITY = (8, 0)


class SlowDtypeError(ValueError):
    """float16 was asked for on a CPU that has no fast float16."""


def model_config_dtype(model_dir: str | Path) -> str | None:
    """The dtype the model's config.json names ("bfloat16", ...), or None when it names none."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("dtype") or config.get("torch_dtype")
    return str(value).removeprefix("torch.") if value else None


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    name: str  # "float32", "bfloat16", "float16"
    reason: str  # why, in words for /info and the log


def resolve_dtype(requested: str, model_dir: str | Path, device: torch.device, *,
                  allow_slow_float16: bool = False) -> str:
    """The dtype to run (choose_dtype's name)."""
    return choose_dtype(requested, model_dir, device, allow_slow_float16=allow_slow_float16).name


def choose_dtype(requested: str, model_dir: str | Path, device: torch.device, *,
                 allow_slow_float16: bool = False) -> DtypeChoice:
    """The dtype to run and why: `requested`, or for `auto` the model's own where the device computes it natively,
    else float32. Raises SlowDtypeError for an explicit float16 on a CPU without fast float16 (unless allowed)."""
    slow_float16 = device.type == "cpu" and not cpu_has_fast_float16()
    if requested == "auto":
        wanted = model_config_dtype(model_dir)
        if wanted not in TORCH_DTYPES:
            return DtypeChoice(DEFAULT_DTYPE, f"auto: the model names no dtype the engine runs ({wanted}): "
                                              f"{DEFAULT_DTYPE}")
        if wanted == "float16" and slow_float16:
            return _logged(DtypeChoice("float32", "auto: the model's dtype is float16, but this CPU has no float16 "
                                                  "arithmetic (AVX512-FP16, AMX-FP16 or Arm FP16): float32"))
        if wanted == "bfloat16" and not has_native_bfloat16(device):
            return _logged(DtypeChoice("float32", f"auto: the model's dtype is bfloat16, but {_no_bfloat16(device)}"
                                                  ": float32, several times faster here"))
        if wanted == "bfloat16":
            return DtypeChoice("bfloat16", f"auto: the model's own dtype, native on this {device.type} "
                                           f"({_native_bfloat16_source(device)})")
        return DtypeChoice(wanted, "auto: the model's own dtype")
    if requested == "float16" and slow_float16:
        if not allow_slow_float16:
            raise SlowDtypeError(
                "dtype float16 would crawl on this CPU: it has no float16 arithmetic (AVX512-FP16, AMX-FP16 or "
                "Arm FP16), so every matmul converts (3-8x slower than float32 where measured). Use dtype float32, "
                "bfloat16 (half the memory of float32; fast on CPUs with AVX512-BF16 or AMX), or auto (the "
                "model's own dtype where this CPU runs it well); to run float16 anyway, set allow_slow_float16 "
                "(--allow-slow-float16)")
        log.warning("running float16 on a CPU without fast float16, as forced by allow_slow_float16: expect it to "
                    "be several times slower than float32")
        return DtypeChoice("float16", "asked for, forced on a CPU without float16 arithmetic")
    if requested == "bfloat16" and not has_native_bfloat16(device):
        log.warning("running bfloat16 as asked, but %s: expect matmuls several times slower than float32 "
                    "(dtype auto would pick float32 here)", _no_bfloat16(device))
        return DtypeChoice("bfloat16", f"asked for; {_no_bfloat16(device)}")
    return DtypeChoice(requested, "asked for")


def choose_dtypes(requested: str, kv_requested: str, model_dir: str | Path, device: torch.device, *,
                  allow_slow_float16: bool = False, quantization: str = "none") -> tuple[DtypeChoice, DtypeChoice]:
    """(the dtype to run, the KV cache's): choose_dtype's and choose_kv_dtype's, except that `auto` beside INT8
    weights on a CPU runs float32 activations over a cache of the dtype the model's own `auto` runs
    (int8_activations)."""
    choice = choose_dtype(requested, model_dir, device, allow_slow_float16=allow_slow_float16)
    if requested == "auto" and quantization == "int8" and device.type == "cpu":
        return int8_activations(choice), choose_kv_dtype(kv_requested, "float32", auto=choice.name)
    return choice, choose_kv_dtype(kv_requested, choice.name)


def int8_activations(model_choice: DtypeChoice) -> DtypeChoice:
    """`auto` beside INT8 weights on a CPU: float32 activations, whatever `model_choice` (the model's own under
    `auto`) is. The weights are int8 either way; Tandem's int8 kernel, which runs the decode steps, reads float32, so
    half-precision activations cost a conversion in and out of every linear, and the elementwise work of a step runs
    slower in them on a CPU. The KV cache stays in `model_choice`'s dtype (choose_kv_dtype's `auto`), so that a
    prefill worker of the model's dtype hands its K/V over unchanged."""
    if model_choice.name == "float32":
        return model_choice
    return DtypeChoice("float32", f"auto with INT8 weights on a CPU: float32 activations, which Tandem's int8 kernel "
                                  f"reads without a conversion per linear (the model's own: {model_choice.name})")


def _logged(choice: DtypeChoice) -> DtypeChoice:
    log.warning("dtype %s", choice.reason)
    return choice


def has_native_bfloat16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= NATIVE_BFLOAT16_CUDA_CAPABILITY
    return device.type == "cpu" and bool(cpu_flags() & NATIVE_BFLOAT16_CPU_FLAGS)


def _native_bfloat16_source(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"compute capability {major}.{minor}"
    return ", ".join(sorted(cpu_flags() & NATIVE_BFLOAT16_CPU_FLAGS))


def _no_bfloat16(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"this GPU (compute capability {major}.{minor}, below 8.0) has no bfloat16 arithmetic"
    return "this CPU has no bfloat16 arithmetic (AVX512-BF16, AMX-BF16 or Arm BF16)"


def cpu_has_fast_float16() -> bool:
    if cpu_flags() & FAST_FLOAT16_CPU_FLAGS:
        return True
    # macOS has no /proc/cpuinfo; every Apple Silicon CPU has Arm's FP16 arithmetic.
    return platform.system() == "Darwin" and platform.machine() == "arm64"


# The KV cache's dtype (Config.kv_cache_dtype): "auto" is the model's; a float32 model may keep K and V in half the
# bytes (float16, as llama.cpp keeps its cache by default, or bfloat16). Each value is rounded once on its way into
# the cache; attention computes in float32 as before (the paged kernel widens each row; torch's paths convert the
# rows they gather to the model's dtype). The names: config.KV_CACHE_DTYPES.


class KVDtypeError(ValueError):
    """A KV cache dtype that does not suit the model's dtype."""


def choose_kv_dtype(requested: str, dtype_name: str, *, auto: str | None = None) -> DtypeChoice:
    """The KV cache's dtype and why, for a model that runs in `dtype_name`: the model's for "auto" (`auto` where
    given: the 16-bit dtype the model's own `auto` would run, under int8_activations) or its own name; a 16-bit one
    beside float32. Raises KVDtypeError for anything else (wider than the model's, or the other 16-bit format:
    either holds values the model's would not)."""
    if requested == "auto" and auto not in (None, dtype_name):
        return DtypeChoice(auto, f"auto: {auto}, the model's own dtype, as a prefill worker without INT8 keeps it")
    if requested == "auto":
        return DtypeChoice(dtype_name, "auto: the model's dtype")
    if requested == dtype_name:
        return DtypeChoice(dtype_name, "asked for: the model's dtype")
    if dtype_name == "float32" and requested in ("bfloat16", "float16"):
        precision = "8" if requested == "bfloat16" else "11"
        return DtypeChoice(requested, f"asked for: half the bytes of the model's float32 per token, each value "
                                      f"rounded to {precision} significant bits on its way into the cache")
    raise KVDtypeError(f"kv_cache_dtype {requested} does not suit a model that runs in {dtype_name}: the cache holds "
                       f"the model's dtype (auto, or {dtype_name}), or float16 or bfloat16 beside float32")
