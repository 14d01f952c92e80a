"""Domain checks shared by the write services, so that the API, the dashboard and alert rules refuse the same
things with the same messages. Type checks of HTTP input stay in the API's serializers."""
from __future__ import annotations

import json
import re
from pathlib import Path

from django.conf import settings

from controlplane.errors import invalid
from controlplane.models import PoolRole
from inference.checks import is_number
from inference.engines import DEFAULT_ENGINE, ENGINE_SETTING, ENGINES, TANDEM, engine_of
from inference.engines.vllm import environment as vllm_environment
from inference.engines.vllm import settings as vllm_settings
from inference.engine.config import DTYPES as ENGINE_DTYPES
from inference.sampling_params import SamplingError, check_sampling_defaults
from inference.engine import settings as engine_settings
from inference.engine.speculation_policy import SpeculativeError, parse_speculative
from inference.worker.sim_profile import ProfileError, load_profile

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# "auto": the model config's own dtype, resolved by each worker when it loads the model (float32 where the config
# names none). The same choices as the worker's --dtype.
DTYPES = ENGINE_DTYPES
DEFAULT_DTYPE = "auto"
DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d{1,2}|auto)$")
# The engine settings with a value of one kind (numbers, booleans, choices): declared once, in
# inference/engine/settings.py, with their bounds; the others are checked here, each its own way.
# "speculative": null or an object (the engine's own check, inference/engine/speculation_policy.py); decode and colocated
# workers only: a prefill part refuses it, and prefill workers are started without the common part's.
SPECULATIVE = "speculative"
# "simulate": a profile (a built-in name or a JSON file); the workers are simulated (inference.worker.sim).
# "shared_prompt": a system prompt every tenant may send, whose prefix-cache blocks all tenants reuse (the others are
# each tenant's own: docs/tenants.md); it travels as a worker flag, so a character a command line cannot hold is
# refused, and its length is bounded well below what one argument may carry.
SHARED_PROMPT, MAX_SHARED_PROMPT_CHARS = "shared_prompt", 32_768
ENGINE_SETTING_KEYS = tuple(sorted([*engine_settings.BY_NAME, "device", "simulate", SPECULATIVE, SHARED_PROMPT]))
# `dtype` in common is the revision's dtype (revision_dtype moves it there); in a role's part it overrides it for that
# role's workers (prefill float32 on a CPU without BF16 arithmetic, decode bfloat16, say): the gateway names the
# decode worker's dtype in each prefill request and the prefill worker converts its KV to it (docs/contracts.md).
ROLE_DTYPE = "dtype"
# Revision.engine_settings is {"common": {...}, <role>: {...}}: a role's part overrides common for its workers.
COMMON = "common"
ALL_ROLES = tuple(PoolRole.values)


def each_object(items: list, *, field: str):
    """(where, item) for each entry of a list of JSON objects, `where` naming it ("actions[2]"); 400 naming the
    first entry that is not an object."""
    for index, item in enumerate(items):
        where = f"{field}[{index}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object", field=where)
        yield where, item


def validate_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid(
            f"name {name!r} must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or "
            "digit (it is also the OpenAI model name clients send)", field="name")
    return name


def validate_dtype(dtype) -> str:
    if dtype not in DTYPES:
        raise invalid(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", field="dtype")
    return dtype


def validate_model_path(model_path) -> str:
    """An existing folder with a config.json, returned absolute.

    Checked on the web host's filesystem: in the single-host case the node agent sees the same files; with several
    hosts the folder must exist at the same path on every node (a shared mount), as the README says.
    """
    if not isinstance(model_path, str) or not model_path.strip() or "\x00" in model_path:
        raise invalid("model_path must be a folder path", field="model_path")
    path = Path(model_path.strip())
    if not path.is_absolute():
        path = settings.BASE_DIR / path
    try:
        is_dir = path.is_dir()
        has_config = is_dir and (path / "config.json").is_file()
    except OSError as exc:  # e.g. a name too long for the filesystem
        raise invalid(f"model_path {model_path!r} cannot be read: {exc.strerror}", field="model_path") from None
    if not is_dir:
        raise invalid(f"model_path {str(path)!r} is not an existing folder", field="model_path")
    if not has_config:
        raise invalid(f"model_path {str(path)!r} has no config.json: it is not a Hugging Face model folder",
                      field="model_path")
    return str(path.resolve())


def _setting_value(key: str, value, *, where: str):
    """One engine setting of one part (`where` is "common" or a role), checked; 400 naming part and key."""
    name, field = f"{where}.{key}", f"engine_settings.{where}.{key}"
    if key == SPECULATIVE:
        if where == PoolRole.PREFILL:
            raise invalid(f"{name} is for decode and colocated workers: a prefill worker samples only the first "
                          "token (set it in common or decode)", field=field)
        try:
            spec = parse_speculative(value)
        except SpeculativeError as exc:
            raise invalid(f"{name}.{exc}" if exc.key else f"{name} {exc}",
                          field=f"{field}.{exc.key}" if exc.key else field) from None
        return spec.as_dict() if spec is not None else None
    elif key == "device":
        if not isinstance(value, str) or not DEVICE_RE.match(value):
            raise invalid(f"{name} {value!r} must be cpu, cuda, cuda:N or auto", field=field)
    elif key == SHARED_PROMPT:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_SHARED_PROMPT_CHARS or "\x00" in value:
            raise invalid(f"{name} must be a text of 1-{MAX_SHARED_PROMPT_CHARS} characters without NUL",
                          field=field)
    elif key == "simulate":
        if not isinstance(value, str):
            raise invalid(f"{name} must be a profile name or file, not {value!r}", field=field)
        try:
            load_profile(value)
        except ProfileError as exc:
            raise invalid(f"{name}: {exc}", field=field) from None
    else:
        setting = engine_settings.BY_NAME[key]
        if setting.kind == "choice" and value not in setting.choices:
            raise invalid(f"{name} {value!r} is not one of {', '.join(setting.choices)}", field=field)
        problem = engine_settings.check(setting, value)
        if problem is not None:
            raise invalid(f"{name} {problem}, not {value!r}", field=field)
    return value


def _settings_part(part, *, where: str) -> dict:
    if part is None:
        return {}
    if not isinstance(part, dict):
        raise invalid(f"engine_settings.{where} must be an object of engine settings", field=f"engine_settings.{where}")
    allowed = [*ENGINE_SETTING_KEYS, ROLE_DTYPE, *([ENGINE_SETTING] if where == COMMON else [])]
    for key in part:
        if key not in allowed:
            raise invalid(f"{where}.{key} is not an engine setting; allowed: {', '.join(sorted(allowed))}",
                          field=f"engine_settings.{where}.{key}")
        if key == ROLE_DTYPE and where != COMMON and part[key] not in DTYPES:
            raise invalid(f"{where}.dtype {part[key]!r} is not one of {', '.join(DTYPES)}",
                          field=f"engine_settings.{where}.dtype")
    return {key: value if key in (ROLE_DTYPE, ENGINE_SETTING) else _setting_value(key, value, where=where)
            for key, value in part.items()}


def validate_engine_settings(engine_settings, *, roles: tuple[str, ...] = ALL_ROLES) -> dict:
    """Engine settings → `{"common": {...}, <role>: {...}}` (a role part only where it has keys), checked.

    A role's part overrides common for that role's workers. `roles` are the deployment's (its mode's): a part for
    another role is a 400 naming it. A flat dict of settings (the shape before per-role parts) is read as common.
    `dtype` in common is the revision's (the caller moves it there: `revision_dtype`); in a role's part it is that
    role's dtype.
    """
    if engine_settings is None:
        return {COMMON: {}}
    if not isinstance(engine_settings, dict):
        raise invalid("engine_settings must be an object", field="engine_settings")
    parts = set(engine_settings) & {COMMON, *ALL_ROLES}
    if not parts:
        engine_settings = {COMMON: engine_settings}
    else:
        flat = sorted(set(engine_settings) - parts)
        if flat:
            raise invalid(f"engine_settings mixes settings {flat} with per-role parts {sorted(parts)}: put shared "
                          "settings in common", field=f"engine_settings.{flat[0]}")
    engine = _engine(engine_settings.get(COMMON))
    if engine != TANDEM:
        return validate_other_engine(engine, engine_settings, roles=roles)
    cleaned = {COMMON: _settings_part(engine_settings.get(COMMON), where=COMMON)}
    for role in ALL_ROLES:
        if role not in engine_settings:
            continue
        if role not in roles:
            raise invalid(f"engine_settings.{role}: this deployment has no {role} workers (its roles: "
                          f"{', '.join(roles)})", field=f"engine_settings.{role}")
        part = _settings_part(engine_settings[role], where=role)
        if part:
            cleaned[role] = part
    return cleaned


def _engine(common) -> str:
    engine = common.get(ENGINE_SETTING, DEFAULT_ENGINE) if isinstance(common, dict) else DEFAULT_ENGINE
    if engine not in ENGINES:
        raise invalid(f"common.engine {engine!r} is not one of {', '.join(ENGINES)}",
                      field="engine_settings.common.engine")
    return engine


def validate_other_engine(engine: str, engine_settings: dict, *, roles: tuple[str, ...]) -> dict:
    """The settings of a revision that runs vLLM (inference/engines/vllm/settings.py): its own set of settings, and
    its extra arguments and quantization method judged by vLLM's own parser (the control plane's vLLM interpreter,
    TANDEM_VLLM_PYTHON), so that a bad value is a 400 here rather than a worker that exits at every start."""
    if PoolRole.PREFILL in roles or PoolRole.DECODE in roles:
        raise invalid(f"engine {engine} serves colocated deployments: a disaggregated pair needs a vLLM KV connector, "
                      "and none of those vLLM ships hands a KV cache over on its CPU build (docs/engines.md says "
                      "what was tried and how to check one on a GPU)", field="engine_settings.common.engine")
    cleaned = {}
    for where in (COMMON, *ALL_ROLES):
        part = engine_settings.get(where)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise invalid(f"engine_settings.{where} must be an object of engine settings",
                          field=f"engine_settings.{where}")
        if where != COMMON and where not in roles:
            raise invalid(f"engine_settings.{where}: this deployment has no {where} workers (its roles: "
                          f"{', '.join(roles)})", field=f"engine_settings.{where}")
        if where != COMMON and part.get(ROLE_DTYPE, DEFAULT_DTYPE) not in DTYPES:
            raise invalid(f"{where}.dtype {part[ROLE_DTYPE]!r} is not one of {', '.join(DTYPES)}",
                          field=f"engine_settings.{where}.dtype")
        try:
            checked = vllm_settings.check_part({k: v for k, v in part.items() if k != ROLE_DTYPE or where != COMMON},
                                               where=where)
        except vllm_settings.VllmSettingsError as exc:
            raise invalid(exc.message, field=f"engine_settings.{where}.{exc.key}") from None
        if where == COMMON and ROLE_DTYPE in part:
            checked[ROLE_DTYPE] = part[ROLE_DTYPE]  # the revision's dtype: revision_dtype moves it to its field
        if checked or where == COMMON:
            cleaned[where] = checked
        parser_args = [*(["--quantization", checked["quantization"]]
                         if checked.get("quantization", "none") != "none" else []),
                       *checked.get("extra_args", ())]
        if parser_args:
            try:
                vllm_environment.check_args(settings.TANDEM_VLLM_PYTHON, parser_args)
            except vllm_environment.VllmArgsError as exc:
                field = "extra_args" if checked.get("extra_args") else "quantization"
                raise invalid(f"{where}.{field}: vLLM refuses {' '.join(parser_args)}: {exc}",
                              field=f"engine_settings.{where}.{field}") from None
    return cleaned


def check_model_context(model_path: str, engine_settings: dict) -> None:
    """400 where a vLLM revision asks for a longer context than its model's (config.json's max_position_embeddings):
    vLLM refuses that at every start. Tandem's own workers cap it to the model's themselves."""
    if engine_of(engine_settings) == TANDEM:
        return
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return  # validate_model_path has said what is wrong with the folder
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    for where, part in engine_settings.items():
        wanted = part.get("max_model_len") if isinstance(part, dict) else None
        if is_number(limit) and wanted is not None and wanted > limit:
            raise invalid(f"{where}.max_model_len {wanted} is longer than the model's context of {int(limit)} "
                          f"tokens (max_position_embeddings): vLLM refuses it", field=f"engine_settings.{where}"
                          ".max_model_len")


def revision_dtype(dtype: str | None, engine_settings: dict) -> str | None:
    """The revision's dtype from the `dtype` field and/or `engine_settings.common.dtype` (removed from it here):
    the field stays the one place a revision's dtype is stored. Both given and different is a 400. None: neither."""
    common_dtype = engine_settings[COMMON].pop("dtype", None)
    if common_dtype is not None:
        if common_dtype not in DTYPES:
            raise invalid(f"common.dtype {common_dtype!r} is not one of {', '.join(DTYPES)}",
                          field="engine_settings.common.dtype")
        if dtype is not None and dtype != common_dtype:
            raise invalid(f"dtype {dtype!r} and common.dtype {common_dtype!r} disagree: give one of them",
                          field="engine_settings.common.dtype")
        return common_dtype
    return validate_dtype(dtype) if dtype is not None else None


def check_kv_cache_dtype(dtype: str | None, engine_settings: dict) -> None:
    """400 where a role's KV cache dtype cannot suit its dtype: a 16-bit cache only beside float32 (or the model's
    own). Where the dtype is auto, the worker resolves it and refuses a mismatch when it starts."""
    common = engine_settings.get(COMMON) or {}
    for role, part in engine_settings.items():
        if role not in (COMMON, *ALL_ROLES) or not isinstance(part, dict):
            continue  # not a part (validate_engine_settings refuses such keys in what it is given)
        role_dtype = part.get(ROLE_DTYPE) if role != COMMON else None
        model_dtype = role_dtype or dtype
        kv = part.get("kv_cache_dtype", common.get("kv_cache_dtype"))
        if kv in (None, "auto") or model_dtype in (None, "auto") or kv == model_dtype or model_dtype == "float32":
            continue
        raise invalid(f"{role}.kv_cache_dtype {kv} does not suit {role if role_dtype else 'the revision'}'s dtype "
                      f"{model_dtype}: the KV cache holds the model's dtype (auto, or {model_dtype}), or float16 or "
                      "bfloat16 beside float32", field=f"engine_settings.{role}.kv_cache_dtype")


def validate_sampling_defaults(defaults) -> dict:
    """A deployment's sampling defaults (temperature, top_p, top_k, max_tokens; a null leaves one unset), checked
    by the gateway's own rules for a request's fields, so that a default never makes a request invalid."""
    if defaults is None:
        return {}
    if not isinstance(defaults, dict):
        raise invalid("sampling_defaults must be an object", field="sampling_defaults")
    try:
        return check_sampling_defaults(defaults)
    except SamplingError as exc:
        raise invalid(f"sampling_defaults.{exc}", field=f"sampling_defaults.{exc.param}") from None


def validate_port(port, *, field: str = "gateway_port") -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise invalid(f"{field} {port!r} must be an integer in 1024..65535", field=field)
    return port


def validate_replica_bounds(role: str, *, replicas: int, min_replicas: int, max_replicas: int) -> None:
    limit = settings.TANDEM_MAX_REPLICAS_LIMIT
    for label, value in (("replicas", replicas), ("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(f"{label} for {role} must be a non-negative integer, not {value!r}", field=label)
    if max_replicas > limit:
        raise invalid(f"max_replicas for {role} is {max_replicas}, above the limit of {limit} per pool",
                      field="max_replicas")
    if min_replicas > max_replicas:
        raise invalid(f"min_replicas ({min_replicas}) for {role} is above max_replicas ({max_replicas})",
                      field="min_replicas")
    if not min_replicas <= replicas <= max_replicas:
        raise invalid(
            f"replicas for {role} must be between {min_replicas} and {max_replicas} (min..max), not {replicas}",
            field="replicas", min_replicas=min_replicas, max_replicas=max_replicas)
