"""The worker's command line, parsed into one validated WorkerConfig (`python -m inference.worker --help`).

The engine's settings form the engine's own `Config`, checked there; `WorkerConfig` holds it and adds what the HTTP
server needs. A bad value of either exits 2 with a message that names the flag. With `--simulate PROFILE` the engine's
part is the profile's `SimSettings` instead (no model folder needed); the server's part is the same and checked alike.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from inference.engine.config import (DTYPES, KV_CACHE_DTYPES, MATVECS, QUANTIZATIONS, WEIGHT_LAYOUTS, Config,
                                     ConfigError)
from inference import roofline
from inference.roles import Role
from inference.worker.sim_profile import ProfileError, SimSettings, load_profile
from inference.worker_secret import SECRET_ENV

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
ENGINE_FIELDS = tuple(f.name for f in fields(Config))  # the flags that make the engine's Config


@dataclass(slots=True)
class WorkerConfig:
    engine: Config | SimSettings  # SimSettings: a simulated worker (--simulate PROFILE)
    port: int
    host: str = "127.0.0.1"
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
    # The host's roofline for this worker's threads, from its node agent (inference.roofline): matmul GFLOP/s per
    # precision and read GB/s. The worker reports its efficiency against them; without them it reports none.
    host_peak_gflops: dict[str, float] | None = None
    host_bandwidth_gbs: float | None = None
    # Where the worker copies its model folder before loading it (inference.model_snapshot): a running worker then
    # maps files nobody rewrites. None: it maps the folder itself.
    model_snapshots: str | None = None
    # The checksum of the files its revision was first served from (inference.model_snapshot.checksum; the node agent
    # passes it): a folder holding other files now is served from their snapshot, or not at all. None: no check.
    model_checksum: str | None = None
    # The revision's worker secret (inference.worker_secret), from the environment, never a flag: the request
    # endpoints refuse a request without it. None: they answer anyone (a worker started by hand).
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("port", f"must be in 0..65535, got {self.port}")
        if self.max_body_bytes < 1:
            raise ConfigError("max_body_bytes", f"must be >= 1, got {self.max_body_bytes}")
        if self.max_queue < 0:
            raise ConfigError("max_queue", f"must be >= 0, got {self.max_queue}")
        for name in ("drain_timeout", "kv_push_timeout", "stream_claim_timeout", "stall_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, f"must be > 0 seconds, got {getattr(self, name)}")
        if self.host_bandwidth_gbs is not None and not self.host_bandwidth_gbs > 0:
            raise ConfigError("host_bandwidth_gbs", f"must be > 0, got {self.host_bandwidth_gbs}")

    @property
    def simulated(self) -> bool:
        return isinstance(self.engine, SimSettings)

    @property
    def model_name(self) -> str:
        return Path(self.engine.model).resolve().name or str(self.engine.model)

    @property
    def max_in_flight(self) -> int:
        return self.engine.max_num_seqs + self.max_queue


def parse_kv_cache_bytes(text: str) -> int | str:
    """'auto' or a size (parse_size)."""
    if text.strip().lower() == "auto":
        return "auto"
    if not _SIZE_RE.match(text):
        raise argparse.ArgumentTypeError(f"not a size or auto: {text!r} (use e.g. auto, 67108864, 64M, 1GiB)")
    return parse_size(text)


def parse_size(text: str) -> int:
    """'67108864', '64M', '64MiB', '1g' -> bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 67108864, 64M, 1GiB)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]


def parse_speculative_flag(text: str) -> dict | None:
    """--speculative: a JSON object (checked by the engine's Config), or none/null/off."""
    if text.strip().lower() in ("none", "null", "off"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r} (e.g. '{{\"method\": \"ngram\", "
                                         f"\"num_tokens\": 4}}')") from None


def parse_gflops_flag(text: str) -> dict[str, float]:
    try:
        return roofline.parse_gflops_flag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference.worker",
                                description="A Tandem inference worker: prefill, decode or colocated.")
    p.add_argument("--role", required=True, choices=[role.value for role in Role])
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto (default): the model config's dtype, float32 where it names none")
    p.add_argument("--quantization", default="none", choices=QUANTIZATIONS,
                   help="none (default), or int8: linear layers and embeddings in int8 with per-channel scales "
                        "(about a quarter of the float32 weight memory; outputs not bit-identical)")
    p.add_argument("--weight-layout", default="auto", choices=WEIGHT_LAYOUTS,
                   help="how the float linears' weights lie in memory: auto (default: transposed for float32 on a "
                        "CPU, where one-token matmuls read them faster; as loaded elsewhere), as_loaded, or "
                        "transposed (greedy tokens identical, values not bit-identical)")
    p.add_argument("--matvec", default="auto", choices=MATVECS,
                   help="the kernel of the float linears in decode steps on a CPU: auto (default: Tandem's kernel "
                        "where it runs, float32 or bfloat16 with AVX2+FMA or AVX-512F and a C compiler; torch's "
                        "matmul elsewhere), tandem, or torch (greedy tokens identical, values not bit-identical); "
                        "the same for the decode rows' attention (Tandem's paged kernel or torch's SDPA); INT8 "
                        "linears: Tandem's int8 kernel (auto: on a decode worker or a CPU without VNNI) or fbgemm")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the KV cache's dtype: auto (default: the model's), or float16 or bfloat16 beside a float32 "
                        "model (half the bytes per token, each value rounded once; outputs not bit-identical)")
    p.add_argument("--allow-slow-float16", action="store_true",
                   help="run --dtype float16 even on a CPU without fast float16 (refused otherwise: it crawls)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--kv-cache-bytes", type=parse_kv_cache_bytes, default="auto",
                   help="KV pool size, e.g. 64M, or auto (default): --kv-memory-fraction of the memory free after "
                        "the weights load, at least one full context where memory allows, at most --max-num-seqs "
                        "of them")
    p.add_argument("--kv-memory-fraction", type=float, default=None,
                   help="for --kv-cache-bytes auto: the share of free memory for the KV pool (default 0.2 of "
                        "available RAM on CPU, 0.8 of free GPU memory on CUDA)")
    p.add_argument("--kv-memory-budget", type=parse_size, default=None,
                   help="for --kv-cache-bytes auto: this worker's share of its host's KV memory (e.g. 512M), "
                        "instead of --kv-memory-fraction of the free memory; the node agent sets it for the workers "
                        "it places on a CPU host")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-seqs", type=int, default=64, help="largest running batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="prefill token budget per step")
    p.add_argument("--chunked-prefill", dest="chunked_prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="prefill long prompts in chunks, interleaved with running decodes (colocated) and with other "
                        "prompts, shortest first (prefill); on by default")
    p.add_argument("--interleave-prefill", dest="interleave_prefill", action=argparse.BooleanOptionalAction,
                   default=True,
                   help="colocated: prefill a request that arrives during a decode step between that step's layers, "
                        "so that its first token does not wait for the step's end (with --chunked-prefill: a prompt "
                        "that fits --prefill-chunk-size); on by default")
    p.add_argument("--prefill-chunk-size", type=int, default=None,
                   help="with --chunked-prefill: the most tokens one step feeds (decodes and prefill chunks "
                        "together) beside running decodes, at most --max-num-batched-tokens (default: 64 on a CPU, "
                        "512 on CUDA)")
    p.add_argument("--prefill-chunk-size-alone", type=int, default=None,
                   help="with --chunked-prefill: the most tokens a step without decodes feeds (every step of a "
                        "prefill worker, a colocated one's while no stream is past its prefill), at least "
                        "--prefill-chunk-size (default: 4 x --prefill-chunk-size)")
    p.add_argument("--prefix-caching", dest="prefix_caching", action=argparse.BooleanOptionalAction, default=True,
                   help="keep full KV blocks keyed by their prefix after a request ends, so that later requests "
                        "sharing it compute only the rest (colocated and prefill; a decode worker has no use for "
                        "it); on by default")
    p.add_argument("--shared-prompt", default=None, metavar="TEXT",
                   help="the deployment's shared prompt (a system prompt all tenants send): with prefix caching, "
                        "its blocks are reused across tenants, whose other blocks are keyed with their tenant "
                        "(the request's cache_salt)")
    p.add_argument("--max-model-len", type=int, default=None, help="default: from the model config")
    p.add_argument("--speculative", type=parse_speculative_flag, default=None, metavar="JSON",
                   help="speculative decoding (decode and colocated roles): "
                        "'{\"method\": \"ngram\", \"num_tokens\": 4}' (prompt lookup; ngram_max, ngram_min) or "
                        "'{\"method\": \"layers\", \"num_tokens\": 3, \"layers\": 8}' (the first layers draft); "
                        "off by default")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode step (inductor on a CPU, which needs a C++ compiler, else eager "
                        "with the reason on /info; CUDA graphs on CUDA), warmed up before the worker is ready")
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
    p.add_argument("--host-peak-gflops", type=parse_gflops_flag, default=None, metavar="PRECISION=GFLOPS,...",
                   help="the host's matmul peak for this worker's threads per precision, e.g. float32=57.9,int8=80 "
                        "(the node agent passes its measurement): the worker reports its prefill efficiency "
                        "against it")
    p.add_argument("--host-bandwidth-gbs", type=float, default=None, metavar="GB/S",
                   help="the host's read bandwidth for this worker's threads (the node agent passes it): the worker "
                        "reports its decode efficiency against it")
    p.add_argument("--model-snapshots", metavar="DIR", default=None,
                   help="copy the model folder into DIR/<fingerprint>/ (once, shared by workers of the same files) "
                        "and load that: rewriting the folder under load then kills no running worker (SIGBUS "
                        "from its mapped weights); the node agent passes var/model-snapshots")
    p.add_argument("--model-checksum", metavar="CHECKSUM", default=None,
                   help="the checksum of the files this revision was first served from (the node agent passes it): "
                        "a model folder that holds other files now is served from the snapshot of those, and the "
                        "worker refuses to start where there is none")
    p.add_argument("--simulate", metavar="PROFILE", default=None,
                   help="run a simulated worker: no model, latencies from PROFILE (a JSON file or a built-in name "
                        "such as tiny-cpu; docs/simulated-worker.md); --model then only names what it serves")
    return p


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    """The command line as a WorkerConfig; a bad value exits 2 with the usage line and a message naming the flag."""
    parser = build_parser()
    try:
        return worker_config({**vars(parser.parse_args(argv)), "secret": os.environ.get(SECRET_ENV) or None})
    except ProfileError as exc:
        parser.error(f"--simulate {exc}")
    except ConfigError as exc:
        parser.error(f"--{exc.field.replace('_', '-')} {exc.requirement}")  # exits 2 with the usage line
    raise AssertionError("unreachable: parser.error exits")


def worker_config(args: dict) -> WorkerConfig:
    """A WorkerConfig from the parsed flags (build_parser); raises ConfigError, or ProfileError for --simulate.

    With --simulate the engine is simulated: the profile must describe the role, and of the engine's flags only
    --role, --model and --max-num-seqs are used."""
    args = dict(args)
    simulate = args.pop("simulate")
    # An engine setting without a flag (yet) keeps the Config's default.
    engine_args = {name: args.pop(name) for name in ENGINE_FIELDS if name in args}
    if simulate:
        profile = load_profile(simulate)
        profile.role(engine_args["role"])  # the profile must describe this role
        engine = SimSettings(profile=profile, role=Role(engine_args["role"]), model=engine_args["model"],
                             max_num_seqs=engine_args.get("max_num_seqs") or 64)
    else:
        engine = Config(**engine_args)
    return WorkerConfig(engine=engine, **args)
