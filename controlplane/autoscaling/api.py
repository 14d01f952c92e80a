"""REST API of the autoscaler: GET (viewer) / PUT (operator) /api/v1/deployments/{name}/autoscaling."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView
from controlplane.autoscaling.models import MAX_QUEUE_WAIT_TARGET_S, AutoscaleMetric
from controlplane.autoscaling.selectors import autoscaling_view
from controlplane.autoscaling.services import autoscaling_update
from controlplane.selectors import deployment_get


class AutoscalingInputSerializer(serializers.Serializer):
    class PoolInput(serializers.Serializer):
        enabled = serializers.BooleanField(required=False)
        metric = serializers.ChoiceField(choices=AutoscaleMetric.values, required=False)
        target = serializers.FloatField(required=False, min_value=0.000001)
        resume = serializers.BooleanField(required=False, default=False)
        # Seconds; null turns the queue wait signal off.
        queue_wait_target = serializers.FloatField(required=False, allow_null=True, min_value=0.001,
                                                   max_value=MAX_QUEUE_WAIT_TARGET_S)

    enabled = serializers.BooleanField(required=False)
    pools = serializers.DictField(child=PoolInput(), required=False)


class PoolAutoscalingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    metric = serializers.CharField()
    target = serializers.FloatField()
    queue_wait_target = serializers.FloatField(allow_null=True)
    replicas = serializers.IntegerField()
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    paused_until = serializers.DateTimeField(allow_null=True)
    paused_by_action = serializers.IntegerField(allow_null=True)
    last_evaluated_at = serializers.DateTimeField(allow_null=True)
    last_decision = serializers.CharField()


class AutoscalingSerializer(serializers.Serializer):
    deployment = serializers.CharField()
    enabled = serializers.BooleanField()
    rule = serializers.CharField()
    tolerance = serializers.FloatField()
    scale_up_stabilization_s = serializers.IntegerField()
    scale_down_stabilization_s = serializers.IntegerField()
    max_step = serializers.IntegerField()
    step_period_s = serializers.IntegerField()
    pools = serializers.DictField(child=PoolAutoscalingSerializer())


class AutoscalingView(ApiView):
    """GET (viewer) / PUT (operator) /api/v1/deployments/{name}/autoscaling.

    PUT body: {"enabled": bool (the deployment's switch), "pools": {"<role>": {"enabled", "metric", "target",
    "queue_wait_target", "resume"}}}; all fields optional. `queue_wait_target` (seconds, null: off) is the gateway
    admission queue's P99 wait over which the pool scales out; only the pool that bounds admission (decode, or
    colocated) takes one. Answers the same shape as GET. The pool's min..max (the autoscaler's bounds)
    are the pool's own, given when the deployment is created; this API does not change them.
    """

    write_permission = OPERATE

    @extend_schema(responses={200: AutoscalingSerializer, **READ_ERRORS})
    def get(self, request, name: str):
        return Response(autoscaling_view(deployment=deployment_get(name)))

    @extend_schema(request=AutoscalingInputSerializer, responses={200: AutoscalingSerializer, **ERRORS},
                   description="Turn the deployment's autoscaler on or off, change a pool's metric and target or its "
                               "gateway queue wait target (`queue_wait_target`, seconds, null: off; decode or "
                               "colocated pools only), or end a manual-scale pause (`resume`). Operator.")
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = AutoscalingInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        autoscaling_update(deployment=deployment, actor=request.user, **data.validated_data)
        return Response(autoscaling_view(deployment=deployment))
