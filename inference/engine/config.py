"""One validated configuration for an engine (a worker process holds exactly one engine)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from inference.checks import is_int

ROLES = ("prefill", "decode", "colocated")
DTYPES = ("float32", "bfloat16", "float16")
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+)$")


@dataclass(slots=True)
class Config:
    model: str | Path
    role: str = "colocated"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    kv_cache_bytes: int = 64 << 20
    block_size: int = 16
    max_num_seqs: int = 64
    # The prefill token budget: the most prompt tokens one prefill step computes. One prompt longer than this still
    # runs, alone in its step, so that no admissible request waits forever.
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: from the model config

    def __post_init__(self) -> None:
        self.model = str(self.model)
        if not Path(self.model).is_dir():
            raise ValueError(f"model must be a local model folder, got {self.model!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not isinstance(self.device, str) or not _DEVICE_RE.match(self.device):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {self.threads!r}")
        for name in ("kv_cache_bytes", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_model_len is not None and (not is_int(self.max_model_len) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}")

