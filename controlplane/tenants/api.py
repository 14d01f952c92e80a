"""The tenants API: GET/POST /api/v1/tenants/, GET/PATCH/DELETE /api/v1/tenants/{name}/, GET/POST
/api/v1/tenants/{name}/keys/, DELETE /api/v1/tenants/{name}/keys/{id}/ (revoke), GET/PATCH
/api/v1/deployments/{name}/access. Admins write, viewers read; a key is in the answer of its creation only."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane import change_gate
from controlplane.api.views.base import ERRORS, READ_ERRORS, ApiView, WriteInputSerializer, id_or_404, write_kwargs
from controlplane.errors import invalid
from controlplane.selectors import deployment_get
from controlplane.tenants import services
from controlplane.tenants.models import PriorityClass, Tenant
from controlplane.tenants.selectors import (deployment_admission, deployment_requires_key, tenant_get,
                                            tenant_key_get, tenant_key_list, tenant_list)
from inference.gateway.admission import DEFAULT_DEADLINES, DEFAULT_MAX_QUEUED
from inference.gateway.tenant_limits import TENANT_LIMITS

PRICES_HELP = ("An object of prompt, completion: the price per 1M tokens (a number >= 0, at most 6 decimals), or "
               "null / left out for not priced; the usage export's cost column.")
LIMITS_HELP = ("An object of limits, each a whole number >= 1, or null / left out for no limit: "
               + "; ".join(f"{limit.name} ({limit.help})" for limit in TENANT_LIMITS) + ".")


class TenantOutput(serializers.ModelSerializer):
    limits = serializers.DictField(child=serializers.IntegerField())
    prices = serializers.DictField(child=serializers.FloatField(), help_text="per 1M tokens: prompt, completion")
    deployments = serializers.SerializerMethodField()
    num_active_keys = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["name", "priority_class", "limits", "prices", "deployments", "num_active_keys", "created_at",
                  "updated_at"]

    def get_deployments(self, tenant) -> list[str]:
        return sorted(d.name for d in tenant.deployments.all())

    def get_num_active_keys(self, tenant) -> int:
        return sum(1 for key in tenant.keys.all() if key.is_active())


class KeyOutput(serializers.Serializer):
    id = serializers.IntegerField()
    tenant = serializers.CharField(source="tenant.name")
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="the key's first characters, to tell keys apart (never the key)")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    active = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    def get_active(self, key) -> bool:
        return key.is_active()


class IssuedKeyOutput(KeyOutput):
    key = serializers.CharField(help_text="the key itself: shown in this answer only, stored as its SHA-256")


class TenantCreateInput(WriteInputSerializer):
    name = serializers.CharField(max_length=200)
    priority_class = serializers.CharField(required=False, default=PriorityClass.STANDARD,
                                           help_text="interactive, standard (default) or batch")
    limits = serializers.JSONField(required=False, default=None, help_text=LIMITS_HELP)
    deployments = serializers.JSONField(required=False, default=list,
                                        help_text="the names of the deployments the tenant's keys may use")
    prices = serializers.JSONField(required=False, default=None, help_text=PRICES_HELP)


class TenantUpdateInput(WriteInputSerializer):
    priority_class = serializers.CharField(required=False)
    limits = serializers.JSONField(required=False, help_text=LIMITS_HELP + " Limits not named stay as they are.")
    deployments = serializers.JSONField(required=False, help_text="the whole new list of deployment names")
    prices = serializers.JSONField(required=False, help_text=PRICES_HELP + " Prices not named stay as they are.")


class KeyIssueInput(WriteInputSerializer):
    name = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                           help_text="when the key stops working (ISO 8601 with a time zone)")


ADMISSION_HELP = ("The deployment's admission queue, as its gateways apply it at their next poll: an object of "
                  "max_queued (requests that may wait, 0..1000000; 0: no queue) and queue_deadlines (class → seconds "
                  "a request may wait, > 0), and preemption's max_preemptions (times one request may be preempted, "
                  "0..100; 0: never), preempt_margin (virtual token counter units, >= 0) and preempt_min_tokens_left "
                  "(>= 0), each optional; null or {}: the gateways' flags.")


class AccessInput(WriteInputSerializer):
    requires_key = serializers.JSONField(required=False,
                                         help_text="true: the gateway refuses requests without a tenant key")
    admission = serializers.JSONField(required=False, allow_null=True, help_text=ADMISSION_HELP)
    acknowledge_prediction = serializers.BooleanField(
        default=False, help_text="Apply admission settings even where the deployment's change gate predicts they "
                                 "fall short of its objectives (the 409's prediction).")


class AccessOutput(serializers.Serializer):
    deployment = serializers.CharField()
    requires_key = serializers.BooleanField()
    tenants = serializers.ListField(child=serializers.CharField(), help_text="the tenants that may use it")
    admission = serializers.DictField(help_text=ADMISSION_HELP)


def _valid(serializer_class, request):
    data = serializer_class(data=request.data)
    data.is_valid(raise_exception=True)
    return data.validated_data


def _tenant_out(name: str) -> dict:
    return TenantOutput(tenant_list().prefetch_related("keys").get(name=name)).data


class TenantListView(ApiView):
    @extend_schema(responses={200: TenantOutput(many=True), **READ_ERRORS}, description="Every tenant. Viewer.")
    def get(self, request):
        return Response(TenantOutput(tenant_list().prefetch_related("keys"), many=True).data)

    @extend_schema(request=TenantCreateInput, responses={201: TenantOutput, **ERRORS},
                   description="Create a tenant: name, priority_class, limits, deployments, prices. 400 naming a "
                               "bad field (a limit of 0 or below, an unknown class or deployment, a bad price); 409 "
                               "when the name is taken. Admin.")
    def post(self, request):
        values = _valid(TenantCreateInput, request)
        tenant = services.tenant_create(name=values["name"], priority_class=values["priority_class"],
                                        limits=values["limits"], deployments=values["deployments"],
                                        prices=values["prices"],
                                        **write_kwargs(request, values))
        return Response(_tenant_out(tenant.name), status=status.HTTP_201_CREATED)


class TenantDetailView(ApiView):
    @extend_schema(responses={200: TenantOutput, **READ_ERRORS}, description="One tenant. Viewer.")
    def get(self, request, name: str):
        return Response(_tenant_out(tenant_get(name).name))

    @extend_schema(request=TenantUpdateInput, responses={200: TenantOutput, **ERRORS},
                   description="Change a tenant's class, limits or prices (those named) or deployments (the whole "
                               "list). "
                               "Gateways apply it at their next membership poll. Admin.")
    def patch(self, request, name: str):
        tenant = tenant_get(name)
        values = _valid(TenantUpdateInput, request)
        changes = {field: values[field] for field in ("priority_class", "limits", "deployments", "prices")
                   if field in values}
        services.tenant_update(tenant=tenant, **changes, **write_kwargs(request, values))
        return Response(_tenant_out(tenant.name))

    @extend_schema(request=WriteInputSerializer, responses={204: None, **ERRORS},
                   description="Delete a tenant and its keys; its keys stop working at the gateways' next poll. "
                               "Admin.")
    def delete(self, request, name: str):
        tenant = tenant_get(name)
        values = _valid(WriteInputSerializer, request)
        services.tenant_delete(tenant=tenant, **write_kwargs(request, values))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KeyListView(ApiView):
    @extend_schema(responses={200: KeyOutput(many=True), **READ_ERRORS},
                   description="The tenant's keys, revoked ones too; never a key itself. Viewer.")
    def get(self, request, name: str):
        return Response(KeyOutput(tenant_key_list(tenant_get(name)), many=True).data)

    @extend_schema(request=KeyIssueInput, responses={201: IssuedKeyOutput, **ERRORS},
                   description="Issue a key. The answer holds the key: it is never shown again (it is stored as its "
                               "SHA-256). Send it as `Authorization: Bearer <key>` (the OpenAI client's api_key). "
                               "Admin.")
    def post(self, request, name: str):
        tenant = tenant_get(name)
        values = _valid(KeyIssueInput, request)
        row, key = services.tenant_key_issue(tenant=tenant, name=values["name"], expires_at=values["expires_at"],
                                             **write_kwargs(request, values))
        return Response({**KeyOutput(row).data, "key": key}, status=status.HTTP_201_CREATED)


class KeyDetailView(ApiView):
    @extend_schema(responses={200: KeyOutput, **READ_ERRORS}, description="One key (never the key itself). Viewer.")
    def get(self, request, name: str, key_id: int):
        return Response(KeyOutput(tenant_key_get(tenant_get(name), id_or_404(key_id, "key"))).data)

    @extend_schema(request=WriteInputSerializer, responses={200: KeyOutput, **ERRORS},
                   description="Revoke a key: it stops working at the gateways' next membership poll. The row "
                               "stays, with revoked_at. Admin.")
    def delete(self, request, name: str, key_id: int):
        key = tenant_key_get(tenant_get(name), id_or_404(key_id, "key"))
        values = _valid(WriteInputSerializer, request)
        return Response(KeyOutput(services.tenant_key_revoke(key=key, **write_kwargs(request, values))).data)


def _access_out(deployment) -> dict:
    tenants = Tenant.objects.filter(deployments=deployment).values_list("name", flat=True)
    return {"deployment": deployment.name, "requires_key": deployment_requires_key(deployment),
            "tenants": sorted(tenants), "admission": deployment_admission(deployment)}


def _gated_admission(admission) -> dict:
    """The new admission settings as a what-if change: the queue's size and the standard class's deadline (the
    replay's queue has one deadline). The settings replace the old ones whole, so what they leave out is the
    gateways' default. Values the service will refuse pass through to its own message."""
    admission = admission if isinstance(admission, dict) else {}
    deadlines = admission.get("queue_deadlines") if isinstance(admission.get("queue_deadlines"), dict) else {}
    return {"max_queued": admission.get("max_queued", DEFAULT_MAX_QUEUED),
            "queue_timeout_s": deadlines.get("standard", DEFAULT_DEADLINES["standard"])}


class AccessView(ApiView):
    @extend_schema(responses={200: AccessOutput, **READ_ERRORS},
                   description="Whether the deployment's gateway requires a tenant key, which tenants may use "
                               "it, and its admission settings. A deployment is open until marked otherwise. "
                               "Viewer.")
    def get(self, request, name: str):
        return Response(_access_out(deployment_get(name)))

    @extend_schema(request=AccessInput, responses={200: AccessOutput, **ERRORS},
                   description="Require a tenant key (`requires_key: true`) or open the deployment again, or set "
                               "its admission settings (`admission`): one of the two per request. Its gateways "
                               "follow at their next membership poll. Admin.")
    def patch(self, request, name: str):
        deployment = deployment_get(name)
        values = _valid(AccessInput, request)
        given = [key for key in ("requires_key", "admission") if key in request.data]
        if len(given) != 1:
            raise invalid("a PATCH changes exactly one setting: give requires_key or admission"
                          + (" (not both)" if given else ""), field="requires_key" if not given else given[1])
        if given == ["admission"]:
            change_gate.check(deployment, {"admission": _gated_admission(values["admission"])},
                              acknowledged=values["acknowledge_prediction"])
            services.deployment_admission_set(deployment=deployment, admission=values["admission"],
                                              **write_kwargs(request, values))
        else:
            services.deployment_access_set(deployment=deployment, requires_key=values["requires_key"],
                                           **write_kwargs(request, values))
        return Response(_access_out(deployment))
