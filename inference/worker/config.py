"""The worker's command line, parsed into one validated Config (`python -m inference.worker --help`)."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

ROLES = ("prefill", "decode", "colocated")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(slots=True)
class WorkerConfig:
    role: str
    model: str
    port: int
    host: str = "127.0.0.1"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    kv_cache_bytes: int = 64 << 20
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    # Admission: at most max_num_seqs + max_queue requests in this worker (running, waiting, or received KV not yet
    # streamed); the next one gets 429 with Retry-After.
    max_queue: int = 256
    revision: str | None = None
    drain_timeout: float = 30.0
    max_body_bytes: int = 1 << 20  # JSON bodies; KV payloads are bounded by the model's layout instead
    kv_push_timeout: float = 30.0
    stream_claim_timeout: float = 30.0  # decode: a received request nobody streams within this is aborted
    # /health says dead when the engine loop has not ticked for this long. Generous: one long CPU prefill step
    # (2048 tokens of a 135M model on one loaded core) takes seconds, and a false "dead" gets a worker replaced.
    stall_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"--role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"--model must be a Hugging Face model folder (with config.json), got {self.model!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        for name in ("kv_cache_bytes", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        for name in ("drain_timeout", "kv_push_timeout", "stream_claim_timeout", "stall_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(self, name)}")

    @property
    def model_name(self) -> str:
        return Path(self.model).resolve().name

    @property
    def max_in_flight(self) -> int:
        return self.max_num_seqs + self.max_queue


def parse_size(text: str) -> int:
    """'67108864', '64M', '64MiB', '1g' -> bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 67108864, 64M, 1GiB)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference.worker",
                                description="A Tandem inference worker: prefill, decode or colocated.")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--kv-cache-bytes", type=parse_size, default=64 << 20, help="KV pool size, e.g. 64M")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=64, help="largest running batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="prefill token budget per step")
    p.add_argument("--max-model-len", type=int, default=None, help="default: from the model config")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests admitted beyond --max-num-seqs before answering 429")
    p.add_argument("--revision", default=None, help="the deployment revision this worker serves")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds SIGTERM waits for in-flight requests before aborting them")
    p.add_argument("--max-body-bytes", type=parse_size, default=1 << 20, help="largest JSON request body")
    p.add_argument("--kv-push-timeout", type=float, default=30.0, help="prefill: seconds for one KV push")
    p.add_argument("--stream-claim-timeout", type=float, default=30.0,
                   help="decode: seconds a received request waits for its stream before it is aborted")
    p.add_argument("--stall-timeout", type=float, default=30.0,
                   help="seconds without an engine-loop tick before /health reports dead")
    return p


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return WorkerConfig(**{k: v for k, v in vars(args).items()})
    except ValueError as exc:
        parser.error(str(exc))  # exits 2 with the usage line and the message
        raise  # unreachable; parser.error exits
