"""What changed between two revisions: model path, dtype and each engine setting (pure; no database)."""
from __future__ import annotations

import json
from dataclasses import dataclass

MISSING = object()


@dataclass(frozen=True, slots=True)
class Change:
    field: str  # "model_path", "dtype" or "engine_settings.<key>"
    before: str  # "" when the setting is absent from the older revision
    after: str  # "" when absent from the newer one
    kind: str  # "added" | "removed" | "changed"


def _show(value) -> str:
    if value is MISSING:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _change(field: str, before, after) -> Change | None:
    if before == after:
        return None
    kind = "added" if before is MISSING else "removed" if after is MISSING else "changed"
    return Change(field, _show(before), _show(after), kind)


def revision_diff(before, after) -> list[Change]:
    """The differences from revision `before` to revision `after` (objects or dicts with model_path, dtype,
    engine_settings), engine settings key by key in name order. Identical revisions give []."""
    def get(revision, name, default=MISSING):
        if isinstance(revision, dict):
            return revision.get(name, default)
        return getattr(revision, name, default)

    changes = [_change("model_path", get(before, "model_path"), get(after, "model_path")),
               _change("dtype", get(before, "dtype"), get(after, "dtype"))]
    old = get(before, "engine_settings", None) or {}
    new = get(after, "engine_settings", None) or {}
    for key in sorted(set(old) | set(new)):
        changes.append(_change(f"engine_settings.{key}", old.get(key, MISSING), new.get(key, MISSING)))
    return [change for change in changes if change is not None]
