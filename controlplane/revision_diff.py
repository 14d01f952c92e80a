"""What changed between two revisions: model path, dtype and each engine setting of each part (common, then the
roles), e.g. `decode.max_num_seqs: 64 → 256`. Pure; shown by the API and the dashboard alike."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from controlplane.models.deployments import engine_settings_parts

MISSING = object()
# Parts in the order an operator reads them: what every worker gets, then each stage.
PART_ORDER = ("common", "prefill", "decode", "colocated")


@dataclass(frozen=True, slots=True)
class Change:
    field: str  # "model_path", "dtype" or "<part>.<key>" ("common.threads", "decode.max_num_seqs")
    before: str  # "" when the setting is absent from the older revision
    after: str  # "" when absent from the newer one
    kind: str  # "added" | "removed" | "changed"

    def __str__(self) -> str:
        return f"{self.field}: {self.before or '(not set)'} → {self.after or '(not set)'}"

    def as_dict(self) -> dict:
        return {**asdict(self), "text": str(self)}


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
    engine_settings): engine settings part by part (common, prefill, decode, colocated), key by key in name order
    within a part. A flat dict of settings (stored before per-role parts) is common. Identical revisions give []."""
    def get(revision, name, default=MISSING):
        if isinstance(revision, dict):
            return revision.get(name, default)
        return getattr(revision, name, default)

    changes = [_change("model_path", get(before, "model_path"), get(after, "model_path")),
               _change("dtype", get(before, "dtype"), get(after, "dtype"))]
    old = engine_settings_parts(get(before, "engine_settings", None))
    new = engine_settings_parts(get(after, "engine_settings", None))
    parts = sorted(set(old) | set(new), key=lambda part: (PART_ORDER.index(part) if part in PART_ORDER
                                                          else len(PART_ORDER), part))
    for part in parts:
        old_part, new_part = old.get(part, {}), new.get(part, {})
        for key in sorted(set(old_part) | set(new_part)):
            changes.append(_change(f"{part}.{key}", old_part.get(key, MISSING), new_part.get(key, MISSING)))
    return [change for change in changes if change is not None]
