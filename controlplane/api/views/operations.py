"""Operator actions on a deployment (scale, rollback) and the gateway membership it serves."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane import change_gate
from controlplane.api.serializers import (ActionSerializer, DeploymentActionSerializer, DeploymentSerializer,
                                          EndpointsSerializer)
from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer, write_kwargs
from controlplane.models import PoolRole
from controlplane.selectors import MAX_ID, deployment_endpoints, deployment_get, deployment_row
from controlplane.services import deployment_rollback, pool_scale
from controlplane.services.pools import pool_placement_set


def _answer(action, name: str) -> Response:
    return Response({"action": ActionSerializer(action).data,
                     "deployment": DeploymentSerializer(deployment_get(name)).data},
                    status=status.HTTP_202_ACCEPTED)


class ScaleInput(WriteInputSerializer):
    role = serializers.ChoiceField(choices=PoolRole.choices)
    # Bounds are the pool's min..max, checked by the service so its message can name them; this cap only keeps
    # absurd numbers out of the database driver.
    replicas = serializers.IntegerField(min_value=-1_000_000, max_value=1_000_000)
    acknowledge_prediction = serializers.BooleanField(
        default=False, help_text="Scale even where the deployment's change gate predicts it falls short of its "
                                 "objectives (the 409's prediction).")


class ScaleView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=ScaleInput, responses={202: DeploymentActionSerializer, **ERRORS},
                   description="Set a pool's desired replicas; reconcile starts or stops workers. 400 outside the "
                               "pool's min..max (the message says the bounds) or for a role the deployment has no "
                               "pool for. 202 with the `scale` action. Operator.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = ScaleInput(data=request.data)
        data.is_valid(raise_exception=True)
        change_gate.check(deployment, {"pools": {data.validated_data["role"]: {
            "replicas": data.validated_data["replicas"]}}}, acknowledged=data.validated_data["acknowledge_prediction"])
        action = pool_scale(deployment=deployment, role=data.validated_data["role"],
                            replicas=data.validated_data["replicas"], **write_kwargs(request, data.validated_data))
        return _answer(action, name)


class RollbackInput(WriteInputSerializer):
    revision = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                        max_value=MAX_ID, help_text="Default: the revision before the current one.")


class RollbackView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=RollbackInput, responses={202: DeploymentActionSerializer, **ERRORS},
                   description="Make an earlier revision current; reconcile replaces the workers of both pools by a "
                               "rolling replacement while the gateway keeps serving. 400 for an unknown revision or "
                               "the current one; 409 while another rollout of the deployment runs. 202 with the "
                               "`rollback` action, which succeeds when no worker of another revision is left. "
                               "Operator.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = RollbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        action = deployment_rollback(deployment=deployment, revision_number=data.validated_data["revision"],
                                     **write_kwargs(request, data.validated_data))
        return _answer(action, name)


class PlacementInput(WriteInputSerializer):
    node_selector = serializers.DictField(child=serializers.CharField(), required=False)
    gpus_per_worker = serializers.IntegerField(required=False, min_value=0, max_value=64)
    threads_per_worker = serializers.IntegerField(required=False, min_value=0, max_value=64)
    allow_gpu_sharing = serializers.BooleanField(required=False)
    # Checked by the service, whose messages name the entry (routing_weights[1].weight).
    routing_weights = serializers.JSONField(
        required=False, help_text="[{\"selector\": {\"class\": \"compute\"}, \"weight\": 3}, ...]: a worker's "
                                  "gateway weight is that of the first entry its node's labels match, else the "
                                  "node's tandem.weight label, else 1 (0 < weight <= 100).")


class PoolPlacementView(ApiView):
    @extend_schema(request=PlacementInput, responses={200: DeploymentActionSerializer, **ERRORS},
                   description="Where a pool's workers may run: `node_selector` (labels a node must carry), "
                               "`gpus_per_worker`, `threads_per_worker` and `allow_gpu_sharing`. New workers follow "
                               "it; a pool that cannot be placed shows status `unschedulable` with the reason. "
                               "`routing_weights` sets how the gateway weighs the pool's workers by their node's "
                               "labels (the endpoints answer carries it at once). Admin.")
    def patch(self, request, name: str, role: str):
        deployment = deployment_get(name)
        data = PlacementInput(data=request.data)
        data.is_valid(raise_exception=True)
        changes = {field: value for field, value in data.validated_data.items()
                   if field not in ("reason", "idempotency_key")}
        action = pool_placement_set(deployment=deployment, role=role, actor=request.user,
                                    reason=data.validated_data["reason"], **changes)
        return Response({"action": ActionSerializer(action).data,
                         "deployment": DeploymentSerializer(deployment_get(name)).data})


class EndpointsView(ApiView):
    @extend_schema(responses={200: EndpointsSerializer, **READ_ERRORS},
                   description="The gateway membership (docs/contracts.md): ready workers grouped by revision, "
                               "newest first. The gateway polls it with a viewer token.")
    def get(self, request, name: str):
        return Response(deployment_endpoints(deployment_row(name)))
