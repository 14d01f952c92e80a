"""The domain checks every caller (API, dashboard, alert rules) shares."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.services.validation import (validate_dtype, validate_engine_settings, validate_model_path,
                                              validate_name, validate_replica_bounds)


@pytest.mark.parametrize("path", ["", "   ", "/tmp/a\x00b", None, 42])
def test_a_model_path_that_cannot_be_a_folder_is_refused(path):
    with pytest.raises(ControlPlaneError) as err:
        validate_model_path(path)
    assert err.value.extra["field"] == "model_path"


def test_a_model_path_too_long_for_the_filesystem_is_refused_cleanly(tmp_path):
    with pytest.raises(ControlPlaneError) as err:
        validate_model_path(str(tmp_path / ("x" * 5000)))
    assert err.value.status == 400


def test_engine_settings_keep_valid_values_as_given():
    settings = {"device": "cuda:1", "threads": 4, "kv_cache_bytes": 1 << 30, "block_size": 16, "max_num_seqs": 32,
                "allow_slow_float16": True}
    assert validate_engine_settings(settings) == {"common": settings}
    assert validate_engine_settings(None) == {"common": {}}


def test_kv_cache_bytes_may_be_auto_and_the_fraction_a_share():
    settings = {"kv_cache_bytes": "auto", "kv_memory_fraction": 0.5}
    assert validate_engine_settings(settings) == {"common": settings}


@pytest.mark.parametrize("settings, field", [
    ({"kv_cache_bytes": "automatic"}, "engine_settings.common.kv_cache_bytes"),
    ({"kv_memory_fraction": 0}, "engine_settings.common.kv_memory_fraction"),
    ({"kv_memory_fraction": 1.5}, "engine_settings.common.kv_memory_fraction"),
    ({"kv_memory_fraction": "0.5"}, "engine_settings.common.kv_memory_fraction"),
    ({"kv_memory_fraction": True}, "engine_settings.common.kv_memory_fraction"),
])
def test_bad_kv_settings_are_refused(settings, field):
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings(settings)
    assert err.value.extra["field"] == field


@pytest.mark.parametrize("value", [[], "x", 1])
def test_engine_settings_must_be_an_object(value):
    with pytest.raises(ControlPlaneError):
        validate_engine_settings(value)


@pytest.mark.parametrize("name", ["demo", "a", "llama-3-8b", "x" * 63])
def test_slug_names_are_accepted(name):
    assert validate_name(name) == name


def test_min_above_max_is_refused_with_both_numbers():
    with pytest.raises(ControlPlaneError) as err:
        validate_replica_bounds("decode", replicas=2, min_replicas=5, max_replicas=3)
    assert "min_replicas (5) for decode is above max_replicas (3)" in err.value.message


@pytest.mark.parametrize("value", [1, "true", None])
@pytest.mark.parametrize("key", ["allow_slow_float16", "chunked_prefill"])
def test_boolean_settings_must_be_booleans(key, value):
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({key: value})
    assert err.value.extra["field"] == f"engine_settings.common.{key}"


def test_chunked_prefill_and_its_chunk_size_are_engine_settings():
    settings = {"chunked_prefill": False, "prefill_chunk_size": 512, "prefill_chunk_size_alone": 2048}
    assert validate_engine_settings(settings) == {"common": settings}
    assert validate_engine_settings({"prefill": settings}, roles=("prefill", "decode")) == {"common": {}, "prefill": settings}
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({"prefill_chunk_size": 0})
    assert err.value.extra["field"] == "engine_settings.common.prefill_chunk_size"


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16", "float16"])
def test_the_dtypes_are_the_workers_own(dtype):
    assert validate_dtype(dtype) == dtype


def test_an_unknown_dtype_is_refused_listing_the_choices():
    with pytest.raises(ControlPlaneError) as err:
        validate_dtype("int4")
    assert err.value.message == "dtype 'int4' is not one of auto, float32, bfloat16, float16"
