"""Engine settings in parts: common plus one per role of the deployment's mode. Messages name the part and the key;
a flat dict is common; dtype is the revision's, so it may be set in common but not per role."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models.deployments import engine_settings_for_role
from controlplane.services.validation import revision_dtype, validate_engine_settings

DISAGGREGATED = ("prefill", "decode")


def _refused(settings, roles=DISAGGREGATED) -> ControlPlaneError:
    with pytest.raises(ControlPlaneError) as err:
        validate_engine_settings(settings, roles=roles)
    assert err.value.status == 400
    return err.value


def test_parts_are_kept_and_an_empty_role_part_is_dropped():
    settings = {"common": {"threads": 1}, "prefill": {"max_num_batched_tokens": 8192}, "decode": {}}
    assert validate_engine_settings(settings, roles=DISAGGREGATED) == {
        "common": {"threads": 1}, "prefill": {"max_num_batched_tokens": 8192}}


def test_a_flat_dict_is_read_as_common():
    assert validate_engine_settings({"max_num_seqs": 8}, roles=("colocated",)) == {"common": {"max_num_seqs": 8}}


@pytest.mark.parametrize("value", [0, -3, "256", True, 2.5])
def test_a_bad_value_names_the_role_and_the_key(value):
    error = _refused({"decode": {"max_num_seqs": value}})
    assert error.message.startswith("decode.max_num_seqs must be a positive integer")
    assert error.extra["field"] == "engine_settings.decode.max_num_seqs"


def test_an_unknown_key_is_refused_listing_the_allowed_ones():
    error = _refused({"prefill": {"max_num_seq": 8}})
    assert error.message.startswith("prefill.max_num_seq is not an engine setting; allowed: ")
    assert "max_num_seqs" in error.message
    assert _refused({"common": {"max_num_seq": 8}}).extra["field"] == "engine_settings.common.max_num_seq"
    assert _refused({"max_num_seq": 8}).message.startswith("common.max_num_seq is not an engine setting")


def test_a_role_the_deployment_does_not_have_is_refused():
    error = _refused({"prefill": {"max_num_seqs": 8}}, roles=("colocated",))
    assert "prefill" in error.message and "colocated" in error.message
    assert error.extra["field"] == "engine_settings.prefill"
    assert _refused({"colocated": {}}, roles=DISAGGREGATED).extra["field"] == "engine_settings.colocated"


def test_flat_keys_beside_role_parts_are_refused():
    error = _refused({"threads": 1, "decode": {"max_num_seqs": 8}})
    assert "common" in error.message and error.extra["field"] == "engine_settings.threads"


@pytest.mark.parametrize("part", [[], "x", 3])
def test_a_part_must_be_an_object(part):
    assert _refused({"decode": part}).extra["field"] == "engine_settings.decode"


def test_a_role_may_run_its_own_dtype_and_a_bad_one_is_refused_naming_it():
    settings = validate_engine_settings({"prefill": {"dtype": "float32"}, "decode": {"dtype": "bfloat16"}},
                                        roles=DISAGGREGATED)
    assert settings["prefill"] == {"dtype": "float32"} and settings["decode"] == {"dtype": "bfloat16"}
    error = _refused({"decode": {"dtype": "int4"}})
    assert error.extra["field"] == "engine_settings.decode.dtype" and "'int4' is not one of" in error.message


def test_common_dtype_becomes_the_revisions_dtype_and_must_agree_with_the_field():
    settings = validate_engine_settings({"common": {"dtype": "bfloat16", "threads": 1}}, roles=DISAGGREGATED)
    assert revision_dtype(None, settings) == "bfloat16"
    assert settings == {"common": {"threads": 1}}  # stored once, as the revision's dtype
    assert revision_dtype("bfloat16", {"common": {"dtype": "bfloat16"}}) == "bfloat16"
    assert revision_dtype("float32", {"common": {}}) == "float32"
    assert revision_dtype(None, {"common": {}}) is None
    with pytest.raises(ControlPlaneError) as err:
        revision_dtype("float32", {"common": {"dtype": "bfloat16"}})
    assert err.value.extra["field"] == "engine_settings.common.dtype"
    with pytest.raises(ControlPlaneError) as err:
        revision_dtype(None, {"common": {"dtype": "int4"}})
    assert "common.dtype 'int4'" in err.value.message


def test_a_workers_settings_are_common_overridden_by_its_role():
    stored = {"common": {"threads": 1, "max_num_seqs": 64}, "decode": {"max_num_seqs": 256}}
    assert engine_settings_for_role(stored, "decode") == {"threads": 1, "max_num_seqs": 256}
    assert engine_settings_for_role(stored, "prefill") == {"threads": 1, "max_num_seqs": 64}
    assert engine_settings_for_role({"threads": 2}, "decode") == {"threads": 2}  # a flat dict of before 0009
    assert engine_settings_for_role({}, "decode") == {}
