"""Shared helpers for the benchmarks: import path, model folders, prompts, timing, JSON output.

The scripts run both as `python bench/<group>/x.py` and `python -m bench.<group>.x`; the first puts bench/<group>/
(not the repo root) on sys.path, so each script inserts the root (`Path(__file__).resolve().parents[2]`) before it
imports `bench.lib`, and `bootstrap()` makes sure of it before anything imports `inference`.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
MODEL_NAMES = ("tiny", "smollm2")


def bootstrap(threads: int | None = None) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


def model_dir(name_or_path: str) -> Path:
    """`tiny` / `smollm2` are built on demand under var/models (instant when already there); else a folder path."""
    from inference.models import DEFAULT_MODELS_DIR

    if name_or_path == "tiny":
        from inference.models.tiny import prepare_tiny

        return prepare_tiny(DEFAULT_MODELS_DIR / "tiny")
    if name_or_path == "smollm2":
        from inference.models.smollm2 import prepare_smollm2

        # The saved dtype only matters for disk and load time; every benchmark casts to the dtype it runs in.
        return prepare_smollm2(DEFAULT_MODELS_DIR / "smollm2-135m", dtype="bfloat16")
    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model must be one of {MODEL_NAMES} or a model folder, got {name_or_path!r}")
    return path


def random_prompts(num_prompts: int, num_tokens: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Distinct prompts of exact token length, drawn away from the low ids where special tokens live."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    low = min(100, vocab_size // 4)
    return torch.randint(low, vocab_size, (num_prompts, num_tokens), generator=gen).tolist()


class Timer:
    """`with Timer() as t: ...` then t.seconds; synchronizes CUDA so that queued kernels are counted."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "Timer":
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()


def environment() -> dict:
    """The host a figure ran on (the CPU's vendor and flags too: no figure on one CPU stands for another)."""
    import torch

    from inference.hardware import cpu_vendor

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_avg": load,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu_vendor": cpu_vendor(), "cpu_flags": cpu_flags_of_interest(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def cpu_flags_of_interest() -> list[str]:
    """The CPU flags a figure depends on (vector and matrix units), for every bench's document."""
    from inference.hardware import cpu_flags

    return sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")) or f in ("bf16", "asimdhp"))


def run_sections(name: str, args, sections: dict) -> dict:
    """One bench's document: `sections` (name -> fn(args) -> dict) run where named in args.sections, at
    args.threads torch threads, with the CPU's flags and the environment."""
    bootstrap(args.threads)
    import torch

    doc = {"benchmark": name, "threads": torch.get_num_threads(), "cpu_flags": cpu_flags_of_interest()}
    for section, fn in sections.items():
        if section in args.sections:
            doc[section] = fn(args)
    doc["environment"] = environment()
    return doc


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def emit(doc: dict) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))


def setup_django(var_dir: str, database_url: str | None) -> None:
    """For the control-plane benchmarks: Django on a fresh TANDEM_VAR_DIR (or DATABASE_URL), migrated."""
    os.environ["TANDEM_VAR_DIR"] = var_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
