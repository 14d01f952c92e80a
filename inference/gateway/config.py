"""Gateway settings: one validated Config, built from the command line."""
from __future__ import annotations

import os

import argparse
import json
import math
from pathlib import Path
from dataclasses import dataclass, field
from enum import Enum

from inference.gateway.admission import DEFAULT_DEADLINES, DEFAULT_HEADROOM, DEFAULT_MAX_QUEUED
from inference.gateway.admission_settings import parse_deadline
from inference.gateway.preemption import (
    DEFAULT_MARGIN, DEFAULT_MAX_PREEMPTIONS, DEFAULT_MIN_TOKENS_LEFT, PreemptionSettings,
)
from inference.gateway.prefix_affinity import DEFAULT_NUM_CHARS
from inference.gateway.trace_log import DEFAULT_SIZE as DEFAULT_TRACE_SIZE
from inference.sampling_params import SAMPLING_DEFAULT_FIELDS, SamplingError, check_sampling_defaults
from inference.weights import parse_weight, weight_problem
from inference.worker_secret import KEY_ENV

SCRAPE_TOKEN_ENV = "TANDEM_SCRAPE_TOKEN"
# A shared gateway's worker keys, one per deployment it serves: a JSON object of deployment name → key
# (inference.worker_secret; a per-deployment gateway's one key is KEY_ENV).
WORKER_KEYS_ENV = "TANDEM_WORKER_KEYS"


class Mode(str, Enum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


def _split_urls(value: str | None) -> list[str]:
    if not value:
        return []
    return [url.strip().rstrip("/") for url in value.split(",") if url.strip()]


def _split_weights(items: list[str] | None) -> dict[str, float]:
    """--worker-weight URL=WEIGHT (repeatable) → {URL: weight}; ValueError naming the bad item."""
    weights: dict[str, float] = {}
    for item in items or []:
        url, sep, text = item.rpartition("=")
        url = url.strip().rstrip("/")
        if not sep or not url:
            raise ValueError(f"--worker-weight {item!r}: write URL=WEIGHT, e.g. http://127.0.0.1:8001=3")
        try:
            weight = parse_weight(text)
        except ValueError as exc:
            raise ValueError(f"--worker-weight {item!r}: the weight {exc}") from None
        if url in weights:
            raise ValueError(f"--worker-weight names {url} twice")
        weights[url] = weight
    return weights


def _worker_keys(text: str | None) -> dict[str, str]:
    """WORKER_KEYS_ENV's JSON object of deployment name → key; ValueError (without the keys) for anything else."""
    if not text:
        return {}
    try:
        keys = json.loads(text)
    except ValueError:
        keys = None
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        raise ValueError(f"${WORKER_KEYS_ENV} must be a JSON object of deployment name → worker key")
    return keys


@dataclass(slots=True)
class Config:
    port: int
    host: str = "127.0.0.1"
    prefill_urls: list[str] = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)
    colocated_urls: list[str] = field(default_factory=list)
    # Static mode: URL → routing weight (nginx's `weight=`); a listed worker not named here weighs 1. With
    # --control-plane the membership carries the weights.
    worker_weights: dict[str, float] = field(default_factory=dict)
    control_plane_url: str | None = None
    deployment: str | None = None
    # A shared gateway (shared_membership.py): its name at the control plane, which answers the memberships of every
    # deployment it serves in one poll; requests go to a deployment by their `model`. Exclusive with `deployment`.
    shared_gateway: str | None = None
    token: str | None = None
    served_model_name: str | None = None
    max_body_bytes: int = 1 << 20
    request_timeout: float = 300.0
    max_outstanding_per_worker: int = 256
    # Admission slots per streaming worker beyond the max_num_seqs its /health reports (routing.worker_capacity).
    worker_capacity_headroom: int = DEFAULT_HEADROOM
    # How often every worker's /health is probed and how long one probe may take.
    health_interval: float = 1.0
    health_timeout: float = 1.0
    membership_interval: float = 2.0
    connect_timeout: float = 2.0
    # How many times one request may move to another worker pair when its worker dies mid-stream (token_stream.py).
    max_migrations: int = 2
    # Prefix affinity (prefix_affinity.py): route requests that begin alike to one worker where the workers report
    # prefix caching; the key is the request's first `prefix_affinity_chars` characters (a chat's up to its first
    # user message).
    prefix_affinity: bool = True
    prefix_affinity_chars: int = DEFAULT_NUM_CHARS
    # Filled into a request that leaves them out (temperature, top_p, top_k, max_tokens). With --control-plane the
    # deployment's, from each membership poll, instead.
    sampling_defaults: dict = field(default_factory=dict)
    # The deployment's ITL objective (P99 seconds), sent to the workers with each request: it bounds their decode
    # batch (inference/engine/batch_limit.py). With --control-plane the deployment's objectives, polled, instead.
    itl_objective_s: float | None = None
    # Admission (admission.py): how many requests may wait for a slot (0: none, a full fleet answers 429 at once),
    # and how long a request of each class may wait before it is shed with 503.
    max_queued: int = DEFAULT_MAX_QUEUED
    queue_deadlines: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    # Preemption (preemption.py): how often one request may be preempted (0: never), how far behind (virtual token
    # counter) a waiting tenant must be to preempt one of its band, and how few tokens left protect a request.
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    # The request trace the control plane pulls for replays (trace_log.py): records kept, share of requests sampled.
    trace_size: int = DEFAULT_TRACE_SIZE
    trace_sample: float = 1.0
    # Where tenants' rpm/tpm bucket levels are kept across a restart (quota_state.py); None: in memory only.
    quota_state: Path | None = None
    # The deployment's worker key (inference.worker_secret): each request to a worker carries the secret of the
    # worker's revision derived from it. From the environment only; None: the workers are sent no secret.
    worker_key: str | None = field(default=None, repr=False)
    # A shared gateway's: deployment name → its worker key (WORKER_KEYS_ENV); a deployment it does not name is sent
    # no secret.
    worker_keys: dict[str, str] = field(default_factory=dict, repr=False)
    # Who may read /metrics and the fleet in /health and /v1/models (operator_views.py): the bearer of this token.
    # From the environment only; None: everyone (a gateway started by hand).
    scrape_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        static_disagg = bool(self.prefill_urls or self.decode_urls)
        sources = [static_disagg, bool(self.colocated_urls), bool(self.control_plane_url)]
        if sum(sources) != 1:
            raise ValueError("give exactly one of --prefill/--decode, --colocated, or --control-plane")
        if static_disagg and not (self.prefill_urls and self.decode_urls):
            raise ValueError("--prefill and --decode must both be given (comma-separated URLs)")
        if self.control_plane_url and not ((self.deployment or self.shared_gateway) and self.token):
            raise ValueError("--control-plane needs --deployment (or --shared-gateway) and --token")
        if self.shared_gateway is not None:
            if not self.control_plane_url:
                raise ValueError("--shared-gateway needs --control-plane: the control plane says what it serves")
            if self.deployment or self.served_model_name:
                raise ValueError("--shared-gateway serves the deployments the control plane attaches to it: give "
                                 "neither --deployment nor --served-model-name")
        for url in [*self.prefill_urls, *self.decode_urls, *self.colocated_urls, self.control_plane_url or "http://"]:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker and control-plane URLs must start with http:// or https://, got {url!r}")
        listed = {*self.prefill_urls, *self.decode_urls, *self.colocated_urls}
        for url, weight in self.worker_weights.items():
            if self.control_plane_url:
                raise ValueError("--worker-weight is for static workers; with --control-plane the weights come from "
                                 "the control plane (pool routing_weights, node label tandem.weight)")
            if url not in listed:
                raise ValueError(f"--worker-weight {url}: not a worker given with --prefill, --decode or --colocated")
            problem = weight_problem(weight)
            if problem:
                raise ValueError(f"--worker-weight {url}: the weight {problem}")
        if self.max_body_bytes < 1024:
            raise ValueError("--max-body-bytes must be at least 1024")
        if self.max_outstanding_per_worker < 1:
            raise ValueError("--max-outstanding-per-worker must be at least 1")
        if self.worker_capacity_headroom < 0:
            raise ValueError("--worker-capacity-headroom must be at least 0")
        if self.max_queued < 0:
            raise ValueError("--admission-queue must be at least 0")
        self.queue_deadlines = {**DEFAULT_DEADLINES, **self.queue_deadlines}
        if set(self.queue_deadlines) != set(DEFAULT_DEADLINES) or not all(
                math.isfinite(s) and s > 0 for s in self.queue_deadlines.values()):
            raise ValueError(f"--queue-deadline takes the classes {', '.join(DEFAULT_DEADLINES)}, each > 0 seconds")
        if self.preemption.max_preemptions < 0:
            raise ValueError("--max-preemptions must be at least 0")
        if not (math.isfinite(self.preemption.margin) and self.preemption.margin >= 0):
            raise ValueError("--preempt-margin must be a number >= 0")
        if self.preemption.min_tokens_left < 0:
            raise ValueError("--preempt-min-tokens-left must be at least 0")
        if self.max_migrations < 0:
            raise ValueError("--max-migrations must be at least 0")
        if self.trace_size < 0:
            raise ValueError("--trace-size must be at least 0 (0: no trace)")
        if not 0 <= self.trace_sample <= 1:
            raise ValueError("--trace-sample must be within 0..1")
        if self.prefix_affinity_chars < 1:
            raise ValueError("--prefix-affinity-chars must be at least 1")
        for name in ("request_timeout", "health_interval", "health_timeout", "membership_interval", "connect_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.itl_objective_s is not None:
            if self.control_plane_url:
                raise ValueError("--itl-objective is for a static gateway: with --control-plane the deployment's "
                                 "objectives apply")
            if not 0 < self.itl_objective_s <= 3600:
                raise ValueError("--itl-objective must be a number of seconds in (0, 3600]")
        if self.sampling_defaults and self.control_plane_url:
            raise ValueError("--default-* sampling flags are for a static gateway: with --control-plane the "
                             "deployment's sampling_defaults apply")
        try:
            self.sampling_defaults = check_sampling_defaults(self.sampling_defaults)
        except SamplingError as exc:
            raise ValueError(f"--default-{exc.param.replace('_', '-')}: {exc.requirement}") from None
        if self.served_model_name is None and self.shared_gateway is None:
            self.served_model_name = self.deployment or "tandem"
        if self.control_plane_url:
            self.control_plane_url = self.control_plane_url.rstrip("/")

    @property
    def static_mode(self) -> Mode | None:
        """The mode fixed by the command line, or None when the control plane says it."""
        if self.colocated_urls:
            return Mode.COLOCATED
        if self.prefill_urls:
            return Mode.DISAGGREGATED
        return None


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m inference.gateway",
                                     description="Tandem's OpenAI-compatible gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--prefill", help="comma-separated prefill worker URLs")
    parser.add_argument("--decode", help="comma-separated decode worker URLs")
    parser.add_argument("--colocated", help="comma-separated colocated worker URLs")
    parser.add_argument("--worker-weight", action="append", metavar="URL=WEIGHT",
                        help="a static worker's routing weight (repeatable; default 1), as nginx's weight=: the "
                             "gateway picks the worker with the least (outstanding + 1) / weight, e.g. "
                             "--worker-weight http://127.0.0.1:8001=3 (a number above 0, at most 100)")
    parser.add_argument("--control-plane", help="control plane base URL; membership is polled from it")
    parser.add_argument("--deployment", help="deployment name at the control plane")
    parser.add_argument("--shared-gateway", metavar="NAME",
                        help="serve every deployment the control plane attaches to shared gateway NAME, each by its "
                             "model name (instead of --deployment)")
    # The environment keeps the token out of `ps` (the node agent passes it so); --token is for a shell.
    parser.add_argument("--token", default=os.environ.get("TANDEM_CONTROL_PLANE_TOKEN"),
                        help="API token for the control plane (default: $TANDEM_CONTROL_PLANE_TOKEN)")
    parser.add_argument("--served-model-name", help="the `model` clients send (default: the deployment, else tandem)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--request-timeout", type=float, default=300.0, help="overall seconds per request")
    parser.add_argument("--max-outstanding-per-worker", type=int, default=256,
                        help="requests one worker may hold at most (an upper bound on the admission slots below, "
                             "and the only one for a worker whose /health reports no max_num_seqs)")
    parser.add_argument("--worker-capacity-headroom", type=int, default=DEFAULT_HEADROOM, metavar="N",
                        help="admission slots per streaming worker beyond the max_num_seqs its /health reports: "
                             "beyond that, requests wait in the gateway's fair queue, not the worker's FIFO "
                             f"(default {DEFAULT_HEADROOM}: keeps the worker's batch full between a request's end and "
                             "the next one's arrival)")
    parser.add_argument("--itl-objective", type=float, default=None, metavar="SECONDS",
                        help="static gateway: the deployment's ITL objective (P99), which bounds the workers' decode "
                             "batch (default: none)")
    parser.add_argument("--health-interval", type=float, default=1.0, help="seconds between worker health probes")
    parser.add_argument("--health-timeout", type=float, default=1.0)
    parser.add_argument("--membership-interval", type=float, default=2.0, help="seconds between control-plane polls")
    parser.add_argument("--connect-timeout", type=float, default=2.0)
    parser.add_argument("--max-migrations", type=int, default=2,
                        help="times one request may move to another worker pair when its worker dies mid-stream "
                             "(0: never; the stream then ends with an error event)")
    for name, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("max_tokens", int)):
        parser.add_argument(f"--default-{name.replace('_', '-')}", dest=f"default_{name}", type=kind, default=None,
                            help=f"{name} for a request that leaves it out (a static gateway's sampling default)")
    parser.add_argument("--prefix-affinity", action=argparse.BooleanOptionalAction, default=True,
                        help="send requests that begin alike to the worker that has their prefix cached, within a "
                             "bounded load (where the workers report prefix caching); on by default")
    parser.add_argument("--prefix-affinity-chars", type=int, default=DEFAULT_NUM_CHARS,
                        help="how many leading characters of a prompt (a chat: of its messages up to the first user "
                             "message) make the affinity key")
    parser.add_argument("--admission-queue", type=int, default=DEFAULT_MAX_QUEUED, metavar="N",
                        help="requests that may wait for a free slot when every worker holds its max_num_seqs + "
                             "--worker-capacity-headroom (0: none, answer 429 at once)")
    parser.add_argument("--queue-deadline", action="append", metavar="CLASS=SECONDS",
                        help="how long a request of a priority class may wait in the admission queue before a 503 "
                             "(repeatable; defaults: " + ", ".join(f"{c}={s:g}" for c, s in DEFAULT_DEADLINES.items())
                             + ")")
    parser.add_argument("--max-preemptions", type=int, default=DEFAULT_MAX_PREEMPTIONS, metavar="N",
                        help="times one running request may be preempted (stopped at its worker, resumed later with "
                             "the tokens it sent) for a waiting request that outranks it: a higher class, or a tenant "
                             f"served less by --preempt-margin (default {DEFAULT_MAX_PREEMPTIONS}; 0: never preempt)")
    parser.add_argument("--preempt-margin", type=float, default=DEFAULT_MARGIN, metavar="UNITS",
                        help="how far a waiting tenant's virtual token counter (prompt tokens + 2 x completion tokens) "
                             "must be below a running request's tenant's, in the same class, to preempt it (default "
                             f"{DEFAULT_MARGIN:g})")
    parser.add_argument("--preempt-min-tokens-left", type=int, default=DEFAULT_MIN_TOKENS_LEFT, metavar="N",
                        help="a request with fewer tokens of its max_tokens left is not preempted (default "
                             f"{DEFAULT_MIN_TOKENS_LEFT})")
    parser.add_argument("--trace-size", type=int, default=DEFAULT_TRACE_SIZE, metavar="N",
                        help="requests kept in the trace the control plane pulls for replays (0: no trace)")
    parser.add_argument("--trace-sample", type=float, default=1.0, metavar="SHARE",
                        help="share of requests recorded in the trace (0..1)")
    parser.add_argument("--quota-state", type=Path, metavar="FILE",
                        help="keep tenants' requests/tokens-per-minute usage in FILE across a restart (written every "
                             "second and at stop; default: none, a restarted gateway gives every tenant a fresh "
                             "minute)")
    args = parser.parse_args(argv)
    try:
        queue_deadlines = dict(parse_deadline(item) for item in args.queue_deadline or ())
    except ValueError as exc:
        parser.error(str(exc))
    sampling_defaults = {name: getattr(args, f"default_{name}") for name in SAMPLING_DEFAULT_FIELDS
                         if getattr(args, f"default_{name}") is not None}
    try:
        return Config(
            port=args.port, host=args.host,
            prefill_urls=_split_urls(args.prefill), decode_urls=_split_urls(args.decode),
            colocated_urls=_split_urls(args.colocated), worker_weights=_split_weights(args.worker_weight),
            control_plane_url=args.control_plane, deployment=args.deployment, shared_gateway=args.shared_gateway,
            token=args.token,
            served_model_name=args.served_model_name, max_body_bytes=args.max_body_bytes,
            request_timeout=args.request_timeout, max_outstanding_per_worker=args.max_outstanding_per_worker,
            worker_capacity_headroom=args.worker_capacity_headroom,
            health_interval=args.health_interval, health_timeout=args.health_timeout,
            membership_interval=args.membership_interval, connect_timeout=args.connect_timeout,
            max_migrations=args.max_migrations, sampling_defaults=sampling_defaults,
            itl_objective_s=args.itl_objective,
            prefix_affinity=args.prefix_affinity, prefix_affinity_chars=args.prefix_affinity_chars,
            max_queued=args.admission_queue, queue_deadlines=queue_deadlines, quota_state=args.quota_state,
            trace_size=args.trace_size, trace_sample=args.trace_sample,
            preemption=PreemptionSettings(args.max_preemptions, args.preempt_margin, args.preempt_min_tokens_left),
            # Never a flag: `ps` shows a command line.
            worker_key=os.environ.get(KEY_ENV) or None,
            worker_keys=_worker_keys(os.environ.get(WORKER_KEYS_ENV)),
            scrape_token=os.environ.get(SCRAPE_TOKEN_ENV) or None,
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
