from __future__ import annotations

from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS
from rest_framework.views import APIView

from controlplane.api.serializers import ErrorSerializer
from controlplane.auth import IsAdmin, IsOperator, IsViewer
from controlplane.selectors import MAX_ID

READ = IsViewer
OPERATE = IsOperator
ADMINISTER = IsAdmin

ERRORS = {code: ErrorSerializer for code in (400, 401, 403, 404, 409)}
READ_ERRORS = {code: ErrorSerializer for code in (401, 403, 404)}


class ApiView(APIView):
    """Viewers read; `write_permission` guards the other methods."""

    write_permission = ADMINISTER

    def get_permissions(self):
        permission = READ if self.request.method in SAFE_METHODS else self.write_permission
        return [permission()]


class StrictSerializer(serializers.Serializer):
    """An unknown field is a 400 naming it, not ignored (DRF's default): a rollback sent `{"to_revision": 1}` would
    otherwise roll back to the previous revision, not to revision 1."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({
                    name: [f"unknown field; this request accepts {', '.join(sorted(self.fields))}"]
                    for name in unknown})
        return super().to_internal_value(data)


class WriteInputSerializer(StrictSerializer):
    """Fields every write accepts (and no other: StrictSerializer)."""

    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, max_length=255, default=None,
        help_text="Repeat a request with the same key and it is done once: the first action is returned. "
                  "The Idempotency-Key header works too.")


def write_kwargs(request, data: dict) -> dict:
    """reason / idempotency_key / actor for a service call. The key is scoped to the user (services/actions.py);
    a header and a body field that disagree are a 400, not one of them silently."""
    from controlplane.errors import invalid
    from controlplane.services.actions import user_idempotency_key

    body_key, header_key = data.get("idempotency_key") or None, request.headers.get("Idempotency-Key") or None
    if body_key is not None and header_key is not None and body_key != header_key:
        raise invalid(f"the Idempotency-Key header ({header_key!r}) and the body's idempotency_key ({body_key!r}) "
                      "differ: send one, or the same in both", field="idempotency_key")
    key = body_key or header_key
    if key is not None and (len(key) > 255 or any(ord(char) < 32 for char in key)):
        # The body's field is a CharField, which checks this; the header is checked here. A control character
        # (NUL above all, which PostgreSQL refuses in text) is no key anybody meant.
        raise invalid("Idempotency-Key must be at most 255 characters, without control characters",
                      field="idempotency_key")
    return {"actor": request.user, "reason": data.get("reason", ""),
            "idempotency_key": user_idempotency_key(request.user, key)}


def id_or_404(value, what: str) -> int:
    # Path ids match [0-9]+, any number of digits; ids are 64-bit (a bigger one would overflow the driver).
    value = int(value)
    if not 0 < value <= MAX_ID:
        from controlplane.errors import not_found

        raise not_found(f"{what} {value} does not exist")
    return value
