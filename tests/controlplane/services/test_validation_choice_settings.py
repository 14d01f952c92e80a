"""The revision engine settings that name one of a few choices take the worker's choices, in common or in a role's
part: `weight_layout` (auto, as_loaded, transposed), `matvec` (auto, tandem, torch) and `kv_cache_dtype` (auto,
float32, bfloat16, float16); anything else is a 400 naming the setting, the value and the choices. A 16-bit KV cache
beside a 16-bit model of the other kind (or float32 beside one) is a 400 where the dtype is known."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.services.validation import ENGINE_SETTING_KEYS, check_kv_cache_dtype, validate_engine_settings

CHOICES = {"weight_layout": ("auto", "as_loaded", "transposed"), "matvec": ("auto", "tandem", "torch"),
           "kv_cache_dtype": ("auto", "float32", "bfloat16", "float16")}


@pytest.mark.parametrize("key, value", [(key, value) for key, values in CHOICES.items() for value in values])
def test_a_valid_choice_is_kept(key, value):
    assert key in ENGINE_SETTING_KEYS
    assert validate_engine_settings({key: value}) == {"common": {key: value}}
    assert validate_engine_settings({"decode": {key: value}}) == {"common": {}, "decode": {key: value}}


@pytest.mark.parametrize("key", CHOICES)
@pytest.mark.parametrize("value", ["columns", "AUTO", "", None, 1, ["auto"]])
def test_another_value_is_400_naming_the_value_and_the_choices(key, value):
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({key: value})
    assert err.value.status == 400
    assert err.value.extra["field"] == f"engine_settings.common.{key}"
    assert repr(value) in err.value.message and ", ".join(CHOICES[key]) in err.value.message


@pytest.mark.parametrize("dtype, settings, field", [
    ("bfloat16", {"kv_cache_dtype": "float16"}, "engine_settings.common.kv_cache_dtype"),
    ("bfloat16", {"decode": {"kv_cache_dtype": "float32"}}, "engine_settings.decode.kv_cache_dtype"),
    ("float32", {"decode": {"dtype": "float16", "kv_cache_dtype": "bfloat16"}},
     "engine_settings.decode.kv_cache_dtype"),
    ("float32", {"common": {"kv_cache_dtype": "float16"}, "decode": {"dtype": "bfloat16"}},
     "engine_settings.decode.kv_cache_dtype"),
])
def test_a_kv_cache_dtype_that_cannot_suit_the_dtype_is_400_naming_both(dtype, settings, field):
    with pytest.raises(ControlPlaneError) as err:
        check_kv_cache_dtype(dtype, validate_engine_settings(settings))
    assert err.value.status == 400 and err.value.extra["field"] == field
    assert "does not suit" in err.value.message and "float16 or bfloat16 beside float32" in err.value.message


@pytest.mark.parametrize("dtype, settings", [
    ("float32", {"kv_cache_dtype": "float16"}), ("float32", {"decode": {"kv_cache_dtype": "bfloat16"}}),
    ("auto", {"kv_cache_dtype": "float16"}), ("bfloat16", {"kv_cache_dtype": "bfloat16"}),
    ("bfloat16", {"kv_cache_dtype": "auto"}),
    ("bfloat16", {"prefill": {"dtype": "float32", "kv_cache_dtype": "float16"}}),
])
def test_a_kv_cache_dtype_that_suits_or_may_suit_the_dtype_is_kept(dtype, settings):
    check_kv_cache_dtype(dtype, validate_engine_settings(settings))  # auto: the worker checks what it resolves
