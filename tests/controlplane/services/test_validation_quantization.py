"""The revision engine setting `quantization` takes the worker's choices (none, int8); anything else is a 400 naming
the setting, the value and the choices."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.services.validation import ENGINE_SETTING_KEYS, validate_engine_settings


@pytest.mark.parametrize("value", ["none", "int8"])
def test_quantization_keeps_a_valid_choice(value):
    assert "quantization" in ENGINE_SETTING_KEYS
    assert validate_engine_settings({"quantization": value, "threads": 2}) == {"common": {"quantization": value, "threads": 2}}


@pytest.mark.parametrize("value", ["int4", "INT8", "", None, 8, True, ["int8"]])
def test_another_quantization_is_400_naming_the_value_and_the_choices(value):
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings({"quantization": value})
    assert err.value.status == 400
    assert err.value.extra["field"] == "engine_settings.common.quantization"
    assert repr(value) in err.value.message and "none, int8" in err.value.message
