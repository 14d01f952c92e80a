"""REST API of the autoscaler: GET (viewer) / PUT (operator) /api/v1/deployments/{name}/autoscaling, the advice of
advisory mode (GET .../autoscaling/advice, viewer) and its apply (POST .../advice/{id}/apply, operator)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane import change_gate
from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import (ERRORS, OPERATE, READ_ERRORS, ApiView, StrictSerializer,
                                         WriteInputSerializer, id_or_404, write_kwargs)
from controlplane.autoscaling.advice import advice_apply
from controlplane.autoscaling.models import MAX_QUEUE_WAIT_TARGET_S, AdviceStatus, AutoscaleMetric, AutoscaleMode
from controlplane.autoscaling.selectors import advice_list, advice_row, autoscaling_view
from controlplane.autoscaling.services import autoscaling_update, gated_change
from controlplane.models import PoolRole
from controlplane.selectors import deployment_get

# A budget above this is no budget a fleet could reach; it keeps absurd numbers out of the database driver.
MAX_BUDGET = 1_000_000


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
    mode = serializers.ChoiceField(choices=AutoscaleMode.choices, required=False)
    # Workers the deployment's pools may hold in all, whichever mode; null: no budget beyond each pool's max.
    max_workers = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_BUDGET)
    pools = serializers.DictField(child=PoolInput(), required=False)
    acknowledge_prediction = serializers.BooleanField(
        default=False, help_text="Apply it even where the deployment's change gate predicts it falls short of its "
                                 "objectives (the 409's prediction).")


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
    advice = serializers.DictField(allow_null=True, help_text="The pool's open advice (advisory mode), as "
                                                             "GET .../autoscaling/advice lists it; null: none.")


class AdviceSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    role = serializers.CharField()
    status = serializers.ChoiceField(choices=AdviceStatus.values)
    from_replicas = serializers.IntegerField()
    to_replicas = serializers.IntegerField()
    metric = serializers.CharField()
    observed = serializers.FloatField(allow_null=True)
    target = serializers.FloatField()
    ratio = serializers.FloatField(allow_null=True, help_text="observed / target: the margin the decision saw")
    raw = serializers.IntegerField(allow_null=True, help_text="HPA's recommendation before stabilisation, step, "
                                                             "bounds and budget")
    inputs = serializers.DictField()
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    evaluated_at = serializers.DateTimeField(help_text="the newest evaluation that decided the same")
    num_evaluations = serializers.IntegerField()
    settled_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.CharField()
    applied_by = serializers.CharField()
    action = serializers.IntegerField(allow_null=True)


class AutoscalingSerializer(serializers.Serializer):
    deployment = serializers.CharField()
    enabled = serializers.BooleanField()
    mode = serializers.ChoiceField(choices=AutoscaleMode.choices)
    max_workers = serializers.IntegerField(allow_null=True)
    num_workers = serializers.IntegerField(help_text="the pools' desired replicas in all, which max_workers caps")
    rule = serializers.CharField()
    tolerance = serializers.FloatField()
    scale_up_stabilization_s = serializers.IntegerField()
    scale_down_stabilization_s = serializers.IntegerField()
    max_step = serializers.IntegerField()
    step_period_s = serializers.IntegerField()
    pools = serializers.DictField(child=PoolAutoscalingSerializer())


class AutoscalingView(ApiView):
    """GET (viewer) / PUT (operator) /api/v1/deployments/{name}/autoscaling.

    PUT body: {"enabled": bool (the deployment's switch), "mode": "active" | "advisory", "max_workers": int | null
    (the budget of the pools in all), "pools": {"<role>": {"enabled", "metric", "target", "queue_wait_target",
    "resume"}}}; all fields optional. `queue_wait_target` (seconds, null: off) is the gateway
    admission queue's P99 wait over which the pool scales out; only the pool that bounds admission (decode, or
    colocated) takes one. Answers the same shape as GET. The pool's min..max (the autoscaler's bounds)
    are the pool's own, given when the deployment is created; this API does not change them.
    """

    write_permission = OPERATE

    @extend_schema(responses={200: AutoscalingSerializer, **READ_ERRORS})
    def get(self, request, name: str):
        return Response(autoscaling_view(deployment=deployment_get(name)))

    @extend_schema(request=AutoscalingInputSerializer, responses={200: AutoscalingSerializer, **ERRORS},
                   description="Turn the deployment's autoscaler on or off, set its mode (`active` scales, "
                               "`advisory` records what it would scale as advice) or its budget of workers in all "
                               "(`max_workers`, null: none), change a pool's metric and target or its "
                               "gateway queue wait target (`queue_wait_target`, seconds, null: off; decode or "
                               "colocated pools only), or end a manual-scale pause (`resume`). Operator.")
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = AutoscalingInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        acknowledged = data.validated_data.pop("acknowledge_prediction")
        change = gated_change(deployment, **data.validated_data)
        if change:
            change_gate.check(deployment, change, acknowledged=acknowledged)
        autoscaling_update(deployment=deployment, actor=request.user, **data.validated_data)
        return Response(autoscaling_view(deployment=deployment))


class AdviceApplyAnswer(serializers.Serializer):
    advice = AdviceSerializer()
    action = ActionSerializer()


class AdviceQuerySerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=PoolRole.values, required=False)
    status = serializers.ChoiceField(choices=AdviceStatus.values, required=False)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


class AdviceListView(ApiView):
    """GET /api/v1/deployments/{name}/autoscaling/advice (viewer): what the autoscaler would have scaled in advisory
    mode, newest first: open (an operator may apply it), applied or superseded."""

    @extend_schema(parameters=[AdviceQuerySerializer], responses={200: AdviceSerializer(many=True), **READ_ERRORS})
    def get(self, request, name: str):
        deployment = deployment_get(name)
        query = AdviceQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(advice_list(deployment=deployment, **query.validated_data))


class AdviceApplyView(ApiView):
    """POST /api/v1/deployments/{name}/autoscaling/advice/{id}/apply (operator)."""

    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={202: AdviceApplyAnswer, **ERRORS},
                   description="Scale the advice's pool to what the autoscaler advised, as the operator's `scale` "
                               "action whose reason names the advice. 409 saying why for stale advice: applied, "
                               "superseded by a later evaluation, not confirmed lately, made for another pool size, "
                               "or past the deployment's budget. Operator.")
    def post(self, request, name: str, advice_id: int):
        deployment = deployment_get(name)
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        advice, action = advice_apply(deployment=deployment, advice_id=id_or_404(advice_id, "advice"),
                                      **write_kwargs(request, data.validated_data))
        return Response({"advice": advice_row(advice, role=advice.pool.role),
                         "action": ActionSerializer(action).data}, status=status.HTTP_202_ACCEPTED)
