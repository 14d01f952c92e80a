"""dashboards.diff: what changed between two revisions, setting by setting (pure)."""
from __future__ import annotations

from dashboards.diff import Change, revision_diff


def test_it_lists_changed_added_and_removed_settings_in_name_order():
    before = {"model_path": "/m/a", "dtype": "float32", "engine_settings": {"threads": 1, "block_size": 16}}
    after = {"model_path": "/m/b", "dtype": "float32", "engine_settings": {"threads": 2, "max_num_seqs": 8}}
    assert revision_diff(before, after) == [
        Change("model_path", "/m/a", "/m/b", "changed"),
        Change("engine_settings.block_size", "16", "", "removed"),
        Change("engine_settings.max_num_seqs", "", "8", "added"),
        Change("engine_settings.threads", "1", "2", "changed"),
    ]


def test_identical_revisions_have_no_difference():
    same = {"model_path": "/m", "dtype": "bfloat16", "engine_settings": {"device": "cpu"}}
    assert revision_diff(same, dict(same)) == []


def test_nested_settings_are_compared_as_json():
    before = {"model_path": "/m", "dtype": "float32", "engine_settings": {"x": {"a": 1}}}
    after = {"model_path": "/m", "dtype": "float32", "engine_settings": {"x": {"a": 2}}}
    assert revision_diff(before, after) == [Change("engine_settings.x", '{"a": 1}', '{"a": 2}', "changed")]
