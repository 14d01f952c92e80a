"""Where the workers are: fixed by the command line, or polled from the control plane.

The control plane answers `GET {URL}/api/v1/deployments/{NAME}/endpoints` (docs/contracts.md), parsed whole into a
DeploymentAnswer (parse_deployment) before any of it is applied. When it is unreachable or answers garbage, the
gateway keeps serving with the last good membership: a control-plane outage must not take the data plane down. A
shared gateway polls the answers of all its deployments at once (shared_membership.py), each parsed the same way.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
import re

import aiohttp

from inference.checks import is_int
from inference.engines import ENGINES
from inference.gateway.admission_settings import AdmissionSettingsError, check_admission_settings
from inference.gateway.config import Config, Mode
from inference.gateway.traffic_split import MAX_TRAFFIC_WEIGHT
from inference.gateway.routing import Router
from inference.gateway.tenant_policy import Tenancy, TenancyError, parse_tenancy
from inference.roles import Role
from inference.sampling_params import SamplingError, check_sampling_defaults
from inference.weights import weight_problem

log = logging.getLogger("tandem.gateway.membership")

# A variant name goes into a response header (X-Tandem-Variant) and a log line: short, printable ASCII, no spaces.
VARIANT_RE = re.compile(r"[\x21-\x7e]{1,32}")


def apply_static(config: Config, router: Router) -> None:
    mode = config.static_mode
    assert mode is not None
    group = {"revision": None, Role.PREFILL: config.prefill_urls, Role.DECODE: config.decode_urls,
             Role.COLOCATED: config.colocated_urls, "weights": config.worker_weights}
    router.set_groups(mode, [group])


class MembershipError(Exception):
    pass


def parse_endpoints(body: object) -> tuple[Mode, list[dict]]:
    """Check the control plane's answer before trusting it; a bad one must not wipe the last good membership."""
    if not isinstance(body, dict):
        raise MembershipError("answer is not a JSON object")
    try:
        mode = Mode(body.get("mode"))
    except ValueError:
        raise MembershipError(f"unknown mode {body.get('mode')!r}") from None
    groups = body.get("groups")
    if not isinstance(groups, list):
        raise MembershipError("'groups' is not a list")
    for group in groups:
        if not isinstance(group, dict):
            raise MembershipError("a group is not an object")
        revision = group.get("revision")
        if revision is not None and (not isinstance(revision, int) or isinstance(revision, bool)):
            raise MembershipError(f"revision {revision!r} is not an integer")
        for role in Role:
            urls = group.get(role) or []
            if not isinstance(urls, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                     for u in urls):
                raise MembershipError(f"'{role}' of revision {revision} is not a list of http(s) URLs")
        # Optional (a control plane that predates weights sends none: every worker weighs 1). URLs it names that the
        # group does not list are ignored.
        weights = group.get("weights") or {}
        if not isinstance(weights, dict):
            raise MembershipError(f"'weights' of revision {revision} is not an object of URL → weight")
        for url, weight in weights.items():
            problem = weight_problem(weight)
            if problem:
                raise MembershipError(f"the weight of {url} in revision {revision} {problem}")
        _check_split(group, revision)
        _check_kv_urls(group, revision)
        _check_engine(group, revision)
    return mode, groups


def _check_engine(group: dict, revision: object) -> None:
    """Optional `engine` (absent: tandem), and for another engine what its /health does not say: `max_num_seqs` (a
    positive integer or null) and `prefix_caching` (a boolean)."""
    engine = group.get("engine")
    if engine is not None and engine not in ENGINES:
        raise MembershipError(f"'engine' of revision {revision} is {engine!r}, not one of {', '.join(ENGINES)}")
    max_num_seqs = group.get("max_num_seqs")
    if max_num_seqs is not None and (not is_int(max_num_seqs) or max_num_seqs < 1):
        raise MembershipError(f"'max_num_seqs' of revision {revision} must be a positive integer, not "
                              f"{max_num_seqs!r}")
    if group.get("prefix_caching") not in (None, True, False):
        raise MembershipError(f"'prefix_caching' of revision {revision} must be true or false")


def _check_kv_urls(group: dict, revision: object) -> None:
    """Optional `kv_urls`: decode URL → the URL its KV pushes go to (a chaos KV fault's proxy), handed to the
    prefill worker instead of the decode URL. URLs it names that the group does not list are ignored."""
    kv_urls = group.get("kv_urls") or {}
    if not isinstance(kv_urls, dict) or not all(
            isinstance(url, str) and url.startswith(("http://", "https://")) for url in kv_urls.values()):
        raise MembershipError(f"'kv_urls' of revision {revision} is not an object of URL → http(s) URL")


def _check_split(group: dict, revision: object) -> None:
    """Optional `traffic_weight` (an integer 0..100) and `variant` (a short printable name) of a rollout's group."""
    if "traffic_weight" in group and group["traffic_weight"] is not None:
        weight = group["traffic_weight"]
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= MAX_TRAFFIC_WEIGHT:
            raise MembershipError(f"'traffic_weight' of revision {revision} must be an integer in "
                                  f"0..{MAX_TRAFFIC_WEIGHT}, not {weight!r}")
    if "variant" in group and group["variant"] is not None:
        variant = group["variant"]
        if not isinstance(variant, str) or not VARIANT_RE.fullmatch(variant):
            raise MembershipError(f"'variant' of revision {revision} must be 1-32 printable ASCII characters "
                                  f"without spaces, not {variant!r}")


def parse_sampling_defaults(body: dict) -> dict:
    """The deployment's sampling defaults from the same answer (absent: none), checked as the control plane does."""
    defaults = body.get("sampling_defaults") or {}
    if not isinstance(defaults, dict):
        raise MembershipError("'sampling_defaults' is not an object")
    try:
        return check_sampling_defaults(defaults)
    except SamplingError as exc:
        raise MembershipError(f"sampling_defaults: {exc}") from None


def parse_itl_objective(body: dict) -> float | None:
    """The deployment's ITL objective, `objectives.itl_p99_seconds` (absent or null: none)."""
    objectives = body.get("objectives")
    if objectives is None:
        return None
    if not isinstance(objectives, dict):
        raise MembershipError("'objectives' is not an object")
    value = objectives.get("itl_p99_seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise MembershipError(f"objectives.itl_p99_seconds must be seconds in (0, 3600], not {value!r}")
    return float(value)


def parse_admission(body: dict) -> dict:
    """The deployment's admission settings (admission_settings.check_admission_settings; absent or null: none, the
    gateway's flags apply)."""
    settings = body.get("admission")
    if settings is None:
        return {}
    try:
        return check_admission_settings(settings)
    except AdmissionSettingsError as exc:
        raise MembershipError(f"admission.{exc}" if exc.param != "admission" else str(exc)) from None


def parse_tenants(body: dict) -> Tenancy:
    """Whether the deployment requires a key, and the tenants' keys (hashes), classes and limits (tenant_policy.py);
    absent: open, no tenants (a control plane without tenants)."""
    try:
        return parse_tenancy(body)
    except TenancyError as exc:
        raise MembershipError(f"tenants: {exc}") from None


@dataclass(slots=True)
class DeploymentAnswer:
    """One deployment's membership answer, every part checked: what a gateway applies at once, or not at all."""

    mode: Mode
    groups: list[dict]
    sampling_defaults: dict
    itl_objective_s: float | None
    tenancy: Tenancy
    admission: dict  # its admission settings ({}: none, the gateway's flags apply)


def parse_deployment(body: object) -> DeploymentAnswer:
    """The whole answer for one deployment, or MembershipError naming what is wrong with it."""
    mode, groups = parse_endpoints(body)
    assert isinstance(body, dict)  # parse_endpoints refused anything else
    return DeploymentAnswer(mode, groups, parse_sampling_defaults(body), parse_itl_objective(body),
                            parse_tenants(body), parse_admission(body))


class ControlPlaneMembership:
    """The poll of one deployment's membership: each good answer sets the router's groups, then goes to `on_answer`
    (the deployment's sampling defaults, objective, tenants and admission: deployment.ServedDeployment)."""

    def __init__(self, config: Config, router: Router,
                 on_answer: Callable[[DeploymentAnswer], None] = lambda answer: None) -> None:
        self.config = config
        self.router = router
        self.on_answer = on_answer
        self.url = f"{config.control_plane_url}/api/v1/deployments/{config.deployment}/endpoints"
        self.headers = {"Authorization": f"Token {config.token}"}
        self.num_polls_failed = 0
        self.last_error: str | None = None

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=max(self.config.membership_interval, 5.0),
                                        connect=self.config.connect_timeout)
        try:
            async with session.get(self.url, headers=self.headers, timeout=timeout) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise MembershipError(f"HTTP {resp.status}: {text}")
                answer = parse_deployment(await resp.json(content_type=None))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, MembershipError) as exc:
            self.num_polls_failed += 1
            error = f"control plane {self.url}: {type(exc).__name__}: {exc}"
            if error != self.last_error:
                log.warning("%s (keeping the last good membership)", error)
            self.last_error = error
            if not self.router.groups:
                self.router.membership_error = error
            return
        if self.last_error:
            log.info("control plane %s answers again", self.url)
        self.last_error = None
        self.router.set_groups(answer.mode, answer.groups)
        self.on_answer(answer)

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.poll_once(session)
            await asyncio.sleep(self.config.membership_interval)
