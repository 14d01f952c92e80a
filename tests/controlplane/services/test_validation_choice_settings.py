"""The revision engine settings that name one of a few choices take the worker's choices, in common or in a role's
part: `weight_layout` (auto, as_loaded, transposed) and `matvec` (auto, tandem, torch); anything else is a 400 naming
the setting, the value and the choices."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.services.validation import ENGINE_SETTING_KEYS, validate_engine_settings

CHOICES = {"weight_layout": ("auto", "as_loaded", "transposed"), "matvec": ("auto", "tandem", "torch")}


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
