"""Domain checks shared by the write services, so that the API, the dashboard and alert rules refuse the same
things with the same messages. Type checks of HTTP input stay in the API's serializers."""
from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from controlplane.errors import invalid
from inference.checks import is_number
from inference.engine.config import DTYPES as ENGINE_DTYPES

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# "auto": the model config's own dtype, resolved by each worker when it loads the model (float32 where the config
# names none). The same choices as the worker's --dtype.
DTYPES = ENGINE_DTYPES
DEFAULT_DTYPE = "auto"
DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d{1,2}|auto)$")
# The largest KV pool one worker may ask for: 4 TiB is beyond any single host; past it a value is a typo.
MAX_KV_CACHE_BYTES = 4 << 40

# key → (minimum, maximum) for the integer engine settings the workers accept.
_INT_SETTINGS = {
    "kv_cache_bytes": (1, MAX_KV_CACHE_BYTES),
    "block_size": (1, 1024),
    "max_num_seqs": (1, 65_536),
    "max_num_batched_tokens": (1, 1 << 24),
    "prefill_chunk_size": (1, 1 << 24),
    "max_model_len": (1, 1 << 24),
    "max_queue": (1, 1 << 20),
    "threads": (1, 1024),
}
# Integer settings that also take "auto": the worker chooses (kv_cache_bytes: a share of the memory free once the
# model is loaded, the worker's default).
_AUTO_SETTINGS = {"kv_cache_bytes"}
# key -> what it means, for the boolean engine settings (worker flags without a value).
_BOOL_SETTINGS = {"allow_slow_float16": "run dtype float16 even on a CPU without fast float16",
                  "chunked_prefill": "prefill long prompts in chunks (on unless false)"}
# key -> (exclusive minimum, maximum) for the fractional engine settings.
_FRACTION_SETTINGS = {"kv_memory_fraction": (0, 1)}
ENGINE_SETTING_KEYS = tuple(sorted([*_INT_SETTINGS, *_BOOL_SETTINGS, *_FRACTION_SETTINGS, "device"]))


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


def validate_engine_settings(engine_settings) -> dict:
    if engine_settings is None:
        return {}
    if not isinstance(engine_settings, dict):
        raise invalid("engine_settings must be an object", field="engine_settings")
    unknown = sorted(set(engine_settings) - set(ENGINE_SETTING_KEYS))
    if unknown:
        raise invalid(f"engine_settings has unknown keys {unknown}; allowed: {list(ENGINE_SETTING_KEYS)}",
                      field="engine_settings")
    cleaned = {}
    for key, value in engine_settings.items():
        if key == "device":
            if not isinstance(value, str) or not DEVICE_RE.match(value):
                raise invalid(f"engine_settings.device {value!r} must be cpu, cuda, cuda:N or auto",
                              field="engine_settings.device")
        elif key in _BOOL_SETTINGS:
            if not isinstance(value, bool):
                raise invalid(f"engine_settings.{key} must be true or false, not {value!r}",
                              field=f"engine_settings.{key}")
        elif key in _FRACTION_SETTINGS:
            low, high = _FRACTION_SETTINGS[key]
            if not is_number(value) or not low < value <= high:
                raise invalid(f"engine_settings.{key} must be a number above {low} and at most {high}, not "
                              f"{value!r}", field=f"engine_settings.{key}")
        elif key in _AUTO_SETTINGS and value == "auto":
            pass
        else:
            low, high = _INT_SETTINGS[key]
            # bool is an int in Python; true is never a meant number of anything.
            if isinstance(value, bool) or not isinstance(value, int):
                either = " or auto" if key in _AUTO_SETTINGS else ""
                raise invalid(f"engine_settings.{key} must be an integer{either}, not {value!r}",
                              field=f"engine_settings.{key}")
            if not low <= value <= high:
                raise invalid(f"engine_settings.{key}={value} is outside {low}..{high}", field=f"engine_settings.{key}")
        cleaned[key] = value
    return cleaned


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
