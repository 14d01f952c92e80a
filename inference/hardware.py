"""What the host's CPU computes natively, read from its flags (torch-free: the control plane asks too, e.g. which
dtype to save the demo model in, without loading torch into its processes).

The flags are read, not timed: a timed probe on a shared, busy host gave a different answer from run to run.
"""
from __future__ import annotations

import functools
from pathlib import Path

# As /proc/cpuinfo spells them (x86 `flags`, Arm `Features`).
FAST_FLOAT16_CPU_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})
NATIVE_BFLOAT16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# An int8 dot product that accumulates in 32 bits (VNNI, AMX-INT8, Arm's dot product): where INT8 weights run at full
# 8-bit precision and pay in decode (inference/engine/quantization.py keeps the same set).
INT8_DOT_PRODUCT_CPU_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})
# What Tandem's int8 kernel (inference/engine/kernels/int8_matvec.c: int16 activations) runs on: where a CPU without an int8
# dot product still decodes INT8 weights faster than float32 ones.
INT8_KERNEL_CPU_FLAGS = frozenset({"avx2", "fma"})


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


def cpu_vendor() -> str:
    """/proc/cpuinfo's `vendor_id` (GenuineIntel, AuthenticAMD, ...); "" where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return ""


def cpu_has_native_bfloat16() -> bool:
    return bool(cpu_flags() & NATIVE_BFLOAT16_CPU_FLAGS)


def cpu_has_int8_dot_product() -> bool:
    return bool(cpu_flags() & INT8_DOT_PRODUCT_CPU_FLAGS)


def cpu_decodes_int8_fast() -> bool:
    """INT8 weights step faster than float32 here: an int8 dot product (fbgemm) or Tandem's int8 kernel's AVX2."""
    return cpu_has_int8_dot_product() or INT8_KERNEL_CPU_FLAGS <= cpu_flags()
