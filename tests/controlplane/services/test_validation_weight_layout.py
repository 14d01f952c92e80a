"""The revision engine setting `weight_layout` takes the worker's choices (auto, as_loaded, transposed), in common or
in a role's part; anything else is a 400 naming the setting, the value and the choices."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.services.validation import ENGINE_SETTING_KEYS, validate_engine_settings


@pytest.mark.parametrize("value", ["auto", "as_loaded", "transposed"])
def test_weight_layout_keeps_a_valid_choice(value):
    assert "weight_layout" in ENGINE_SETTING_KEYS
    assert validate_engine_settings({"weight_layout": value}) == {"common": {"weight_layout": value}}


@pytest.mark.parametrize("value", ["columns", "AUTO", "", None, 1, ["auto"]])
def test_another_weight_layout_is_400_naming_the_value_and_the_choices(value):
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({"weight_layout": value})
    assert err.value.status == 400
    assert err.value.extra["field"] == "engine_settings.common.weight_layout"
    assert repr(value) in err.value.message and "auto, as_loaded, transposed" in err.value.message
