"""A vLLM revision's engine settings: the Tandem settings that mean the same thing to vLLM, mapped to its flags and
environment, plus `extra_args`, vLLM arguments Tandem passes on after vLLM's own parser accepted them (argcheck.py).

Checked here (pure; the control plane calls `check_part` for each part of a revision and turns VllmSettingsError
into a 400 naming the field). Tandem's own settings that vLLM has no meaning for (simulate, speculative,
interleave_prefill, matvec, weight_layout, shared_prompt, max_queue, prefill chunk sizes) are refused by name rather
than dropped: a setting an operator believes in must take effect. vLLM's own forms of some of them (its speculative
config, its KV cache dtypes) go through `extra_args`.
"""
from __future__ import annotations

import math
import re

from inference.checks import is_int, is_number

GIB = 1 << 30
# Tandem setting -> what it is for a vLLM worker (the docs' table is built from the same words).
MAPPED = {
    "engine": "the engine itself (common only)",
    "device": "cpu, cuda, cuda:N or auto: a GPU worker gets CUDA_VISIBLE_DEVICES, a CPU worker the CPU build",
    "threads": "OMP_NUM_THREADS of the CPU worker (with cpu_bind nobind, the default)",
    "cpu_bind": "VLLM_CPU_OMP_THREADS_BIND: nobind (default), auto, or cores such as 0-3 or 0,2",
    "max_num_seqs": "--max-num-seqs (also the gateway's admission slots per worker)",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size (a multiple of 16)",
    "prefix_caching": "--enable-prefix-caching / --no-enable-prefix-caching",
    "chunked_prefill": "--enable-chunked-prefill / --no-enable-chunked-prefill",
    "compile": "false: --enforce-eager (no torch.compile warm-up); absent or true: vLLM's default, compiled",
    "quantization": "none, or one of vLLM's --quantization methods (checked by vLLM's parser)",
    "kv_cache_bytes": "CPU: VLLM_CPU_KVCACHE_SPACE in whole GiB (rounded up); GPU: --kv-cache-memory-bytes",
    "kv_memory_fraction": "GPU: --gpu-memory-utilization",
    "extra_args": "more vLLM arguments, checked by vLLM's own parser when the revision is created",
    "drain_timeout": "--shutdown-timeout: seconds SIGTERM lets running requests finish",
}
COMMON_ONLY = ("engine",)
# Arguments Tandem sets itself: the model, where it listens, its key, the name the gateway asks for, its dtype.
OWNED_ARGS = ("--model", "--port", "--host", "--api-key", "--served-model-name", "--dtype", "--uds",
              "--root-path", "--disable-log-stats")
MAX_EXTRA_ARGS, MAX_EXTRA_ARG_CHARS = 64, 4096
_CPU_BIND_RE = re.compile(r"^(auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*)$")
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d{1,2}|auto)$")
_QUANTIZATION_RE = re.compile(r"^[a-z][a-z0-9_\-]{0,39}$")
_INTS = {"max_num_seqs": (1, 65_536), "max_model_len": (1, 1 << 24), "max_num_batched_tokens": (1, 1 << 24),
         "block_size": (16, 1024), "threads": (1, 1024), "kv_cache_bytes": (1, 4 << 40),
         "drain_timeout": (0, 3600)}


class VllmSettingsError(ValueError):
    """A bad vLLM setting; `key` names it within its part."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key, self.message = key, message


def check_part(part: dict, *, where: str) -> dict:
    """One part (`where`: "common" or a role) of a vLLM revision's settings, checked; VllmSettingsError names the
    first bad key."""
    cleaned = {}
    for key, value in part.items():
        if key == "dtype" and where != "common":
            cleaned[key] = value  # a role's dtype: checked by the caller against the dtypes both engines know
            continue
        if key not in MAPPED:
            raise VllmSettingsError(key, f"{where}.{key} has no meaning for a vLLM worker; a vLLM revision takes "
                                         f"{', '.join(sorted(MAPPED))} (and vLLM's own flags in extra_args)")
        if key in COMMON_ONLY and where != "common":
            raise VllmSettingsError(key, f"{where}.{key} belongs in common: both stages run one engine")
        cleaned[key] = _checked(key, value, where)
    return cleaned


def _checked(key: str, value, where: str):
    name = f"{where}.{key}"
    if key == "engine":
        return value
    if key in ("prefix_caching", "chunked_prefill", "compile"):
        if not isinstance(value, bool):
            raise VllmSettingsError(key, f"{name} must be true or false, not {value!r}")
        return value
    if key == "device":
        if not isinstance(value, str) or not _DEVICE_RE.match(value):
            raise VllmSettingsError(key, f"{name} {value!r} must be cpu, cuda, cuda:N or auto")
        return value
    if key == "cpu_bind":
        if not isinstance(value, str) or not _CPU_BIND_RE.match(value):
            raise VllmSettingsError(key, f"{name} {value!r} must be nobind, auto, or CPU ids such as 0-3 or 0,2")
        return value
    if key == "quantization":
        if not isinstance(value, str) or not _QUANTIZATION_RE.match(value):
            raise VllmSettingsError(key, f"{name} {value!r} must be none or a vLLM quantization method name")
        return value
    if key == "kv_memory_fraction":
        if not is_number(value) or not 0 < value <= 1:
            raise VllmSettingsError(key, f"{name} must be a number above 0 and at most 1, not {value!r}")
        return value
    if key == "extra_args":
        return check_extra_args(value, name)
    if key == "kv_cache_bytes" and value == "auto":
        return value
    low, high = _INTS[key]
    if not is_int(value) or not low <= value <= high:
        raise VllmSettingsError(key, f"{name} must be an integer in {low}..{high}, not {value!r}")
    if key == "block_size" and value % 16:
        raise VllmSettingsError(key, f"{name} must be a multiple of 16 for vLLM, not {value}")
    return value


def check_extra_args(value, name: str = "extra_args") -> list[str]:
    """A list of command-line words, none of them one Tandem sets itself. vLLM's parser judges the rest."""
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise VllmSettingsError("extra_args", f"{name} must be a list of strings (command-line words such as "
                                              f"[\"--enable-lora\", \"--max-loras\", \"2\"]), not {value!r}")
    if len(value) > MAX_EXTRA_ARGS or any(len(arg) > MAX_EXTRA_ARG_CHARS or "\x00" in arg for arg in value):
        raise VllmSettingsError("extra_args", f"{name} holds at most {MAX_EXTRA_ARGS} words of at most "
                                              f"{MAX_EXTRA_ARG_CHARS} characters, without NUL")
    for arg in value:
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in OWNED_ARGS:
            raise VllmSettingsError("extra_args", f"{name} sets {flag}, which Tandem sets itself (the model, dtype, "
                                                  "port, host, key and served name come from the revision)")
    return list(value)


def flags_and_env(settings: dict, *, dtype: str, on_gpu: bool) -> tuple[list[str], dict[str, str]]:
    """The vLLM flags and environment of one worker's settings (a role's part over common, already checked), its
    dtype resolved by the caller; extra_args last, so that vLLM's parser sees them as the operator wrote them."""
    flags = ["--dtype", dtype]
    env: dict[str, str] = {}
    for key, flag in (("max_num_seqs", "--max-num-seqs"), ("max_model_len", "--max-model-len"),
                      ("max_num_batched_tokens", "--max-num-batched-tokens"), ("block_size", "--block-size"),
                      ("drain_timeout", "--shutdown-timeout")):
        if settings.get(key) is not None:
            flags += [flag, str(settings[key])]
    for key, flag in (("prefix_caching", "enable-prefix-caching"), ("chunked_prefill", "enable-chunked-prefill")):
        if key in settings:
            flags.append(f"--{flag}" if settings[key] else f"--no-{flag}")
    if settings.get("compile") is False:
        flags.append("--enforce-eager")
    if settings.get("quantization") not in (None, "none"):
        flags += ["--quantization", settings["quantization"]]
    kv_bytes = settings.get("kv_cache_bytes")
    if on_gpu:
        if isinstance(kv_bytes, int):
            flags += ["--kv-cache-memory-bytes", str(kv_bytes)]
        if settings.get("kv_memory_fraction") is not None:
            flags += ["--gpu-memory-utilization", f"{settings['kv_memory_fraction']:g}"]
    else:
        if isinstance(kv_bytes, int):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_bytes / GIB)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = settings.get("cpu_bind", "nobind")
    return flags + list(settings.get("extra_args") or ()), env
