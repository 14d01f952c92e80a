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

from inference.engine.config import DTYPES, Config, ConfigError
from inference.engine.settings import ENGINE_SETTINGS
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


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """A flag per engine setting a revision may set (inference.engine.settings): `--name-with-dashes`; a setting on
    by default also has `--no-...`."""
    types = {"int": int, "fraction": float, "bytes": parse_kv_cache_bytes}
    for setting in ENGINE_SETTINGS:
        flag = "--" + setting.name.replace("_", "-")
        if setting.kind == "bool":
            action = argparse.BooleanOptionalAction if setting.default else "store_true"
            p.add_argument(flag, dest=setting.name, action=action, default=setting.default, help=setting.help)
        elif setting.kind == "choice":
            p.add_argument(flag, default=setting.default, choices=setting.choices, help=setting.help)
        else:
            p.add_argument(flag, type=types[setting.kind], default=setting.default, help=setting.help)


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
    add_setting_flags(p)
    p.add_argument("--kv-memory-budget", type=parse_size, default=None,
                   help="for --kv-cache-bytes auto: this worker's share of its host's KV memory (e.g. 512M), "
                        "instead of --kv-memory-fraction of the free memory; the node agent sets it for the workers "
                        "it places on a CPU host")
    p.add_argument("--shared-prompt", default=None, metavar="TEXT",
                   help="the deployment's shared prompt (a system prompt all tenants send): with prefix caching, "
                        "its blocks are reused across tenants, whose other blocks are keyed with their tenant "
                        "(the request's cache_salt)")
    p.add_argument("--speculative", type=parse_speculative_flag, default=None, metavar="JSON",
                   help="speculative decoding (decode and colocated roles): "
                        "'{\"method\": \"ngram\", \"num_tokens\": 4}' (prompt lookup; ngram_max, ngram_min) or "
                        "'{\"method\": \"layers\", \"num_tokens\": 3, \"layers\": 8}' (the first layers draft); "
                        "off by default")
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
