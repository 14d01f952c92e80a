"""controlplane.revision_diff: what changed between two revisions, part by part and setting by setting (pure)."""
from __future__ import annotations

from controlplane.revision_diff import Change, revision_diff


def test_it_lists_changed_added_and_removed_settings_in_name_order():
    before = {"model_path": "/m/a", "dtype": "float32", "engine_settings": {"common": {"threads": 1, "block_size": 16}}}
    after = {"model_path": "/m/b", "dtype": "float32",
             "engine_settings": {"common": {"threads": 2, "max_num_seqs": 8}}}
    assert revision_diff(before, after) == [
        Change("model_path", "/m/a", "/m/b", "changed"),
        Change("common.block_size", "16", "", "removed"),
        Change("common.max_num_seqs", "", "8", "added"),
        Change("common.threads", "1", "2", "changed"),
    ]


def test_per_role_changes_are_named_by_role_common_first():
    before = {"model_path": "/m", "dtype": "auto",
              "engine_settings": {"common": {"threads": 1}, "decode": {"max_num_seqs": 64}}}
    after = {"model_path": "/m", "dtype": "auto",
             "engine_settings": {"common": {"threads": 2}, "prefill": {"max_num_batched_tokens": 8192},
                                 "decode": {"max_num_seqs": 256}}}
    changes = revision_diff(before, after)
    assert [str(change) for change in changes] == [
        "common.threads: 1 → 2",
        "prefill.max_num_batched_tokens: (not set) → 8192",
        "decode.max_num_seqs: 64 → 256",
    ]
    assert changes[2].as_dict() == {"field": "decode.max_num_seqs", "before": "64", "after": "256",
                                    "kind": "changed", "text": "decode.max_num_seqs: 64 → 256"}


def test_a_setting_moved_from_common_into_a_role_shows_both_sides():
    before = {"model_path": "/m", "dtype": "auto", "engine_settings": {"common": {"max_num_seqs": 64}}}
    after = {"model_path": "/m", "dtype": "auto", "engine_settings": {"common": {}, "decode": {"max_num_seqs": 64}}}
    assert revision_diff(before, after) == [Change("common.max_num_seqs", "64", "", "removed"),
                                            Change("decode.max_num_seqs", "", "64", "added")]


def test_a_flat_dict_of_before_per_role_parts_compares_as_common():
    before = {"model_path": "/m", "dtype": "auto", "engine_settings": {"threads": 1}}
    after = {"model_path": "/m", "dtype": "auto", "engine_settings": {"common": {"threads": 1}}}
    assert revision_diff(before, after) == []


def test_identical_revisions_have_no_difference():
    same = {"model_path": "/m", "dtype": "bfloat16", "engine_settings": {"common": {"device": "cpu"}}}
    assert revision_diff(same, dict(same)) == []


def test_nested_values_are_compared_as_json():
    before = {"model_path": "/m", "dtype": "float32", "engine_settings": {"common": {"x": {"a": 1}}}}
    after = {"model_path": "/m", "dtype": "float32", "engine_settings": {"common": {"x": {"a": 2}}}}
    assert revision_diff(before, after) == [Change("common.x", '{"a": 1}', '{"a": 2}', "changed")]
