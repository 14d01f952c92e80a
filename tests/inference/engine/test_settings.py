"""The engine settings a revision may set are declared once (inference/engine/settings.py): each is a field of the
engine's Config (or the worker's own WorkerConfig) with the same default, and a worker flag built from the
declaration that sets it; a value outside its bounds is refused with what it must be."""
from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from inference.engine.config import Config
from inference.engine.settings import BY_NAME, ENGINE_SETTINGS, check
from inference.worker.config import WorkerConfig, build_parser

DEFAULTS = {f.name: f.default for cls in (Config, WorkerConfig) for f in fields(cls) if f.default is not MISSING}
SAMPLE = {"int": ("7", 7), "fraction": ("0.5", 0.5), "bytes": ("64M", 64 << 20)}


@pytest.mark.parametrize("setting", ENGINE_SETTINGS, ids=lambda s: s.name)
def test_each_setting_is_a_field_with_its_default_and_a_flag_that_sets_it(setting):
    assert setting.name in DEFAULTS, f"{setting.name} is no field of Config or WorkerConfig"
    assert DEFAULTS[setting.name] == setting.default
    parser = build_parser()
    required = ["--role", "colocated", "--model", "m", "--port", "1"]
    flag = "--" + setting.name.replace("_", "-")
    assert getattr(parser.parse_args(required), setting.name) == setting.default
    if setting.kind == "bool":
        switched = [flag.replace("--", "--no-", 1)] if setting.default else [flag]
        assert getattr(parser.parse_args(required + switched), setting.name) is (not setting.default)
    else:
        text, value = (setting.choices[-1],) * 2 if setting.kind == "choice" else SAMPLE[setting.kind]
        assert getattr(parser.parse_args(required + [flag, text]), setting.name) == value


def test_a_value_outside_a_settings_bounds_says_what_it_must_be():
    assert check(BY_NAME["block_size"], 16) is None
    assert check(BY_NAME["block_size"], 0) == "must be a positive integer (at most 1024)"
    assert check(BY_NAME["block_size"], True) == "must be a positive integer (at most 1024)"
    assert check(BY_NAME["kv_cache_bytes"], "auto") is None
    assert "or auto" in check(BY_NAME["kv_cache_bytes"], "lots")
    assert check(BY_NAME["kv_memory_fraction"], 0) == "must be a number above 0 and at most 1"
    assert check(BY_NAME["prefix_caching"], "yes") == "must be true or false"
    assert check(BY_NAME["matvec"], "fast") == "must be one of auto, tandem, torch"
