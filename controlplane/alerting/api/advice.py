"""REST API of advisory rules: GET /api/v1/alert-rules/{id}/advice (viewer), what the rule would have done, and
POST .../advice/{id}/apply (operator), which carries one out (services.advice)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.alerting.models import ActionAdvice, ActionAdviceStatus, AlertRule
from controlplane.alerting.services.advice import advice_apply
from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import (ERRORS, OPERATE, READ_ERRORS, ApiView, StrictSerializer,
                                         WriteInputSerializer, id_or_404, write_kwargs)
from controlplane.errors import not_found


class ActionAdviceSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name")
    deployment = serializers.CharField(source="deployment.name", allow_null=True, default=None)
    alert_state = serializers.CharField(source="alert.state")
    margin = serializers.SerializerMethodField(help_text="value - threshold: how far past its threshold the alert's "
                                                         "value was (null: no data)")

    class Meta:
        model = ActionAdvice
        fields = ["id", "rule", "alert", "alert_state", "action_index", "kind", "params", "target", "deployment",
                  "role", "worker", "basis", "value", "comparison", "threshold", "margin", "detail", "reason",
                  "status", "created_at", "evaluated_at", "num_evaluations", "settled_at", "outcome", "applied_by",
                  "action"]

    def get_margin(self, advice: ActionAdvice) -> float | None:
        return None if advice.value is None else advice.value - advice.threshold


class RuleAdviceQuerySerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=ActionAdviceStatus.values, required=False)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


class ActionAdviceApplyAnswer(serializers.Serializer):
    advice = ActionAdviceSerializer()
    action = ActionSerializer()


def _rule(rule_id) -> AlertRule:
    rule = AlertRule.objects.filter(pk=id_or_404(rule_id, "alert rule")).first()
    if rule is None:
        raise not_found(f"alert rule {rule_id} does not exist")
    return rule


class RuleAdviceListView(ApiView):
    """GET /api/v1/alert-rules/{id}/advice (viewer): what the advisory rule would have done, newest first: open (an
    operator may apply it), applied, superseded or expired."""

    @extend_schema(parameters=[RuleAdviceQuerySerializer],
                   responses={200: ActionAdviceSerializer(many=True), **READ_ERRORS})
    def get(self, request, rule_id: int):
        rule = _rule(rule_id)
        query = RuleAdviceQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = ActionAdvice.objects.filter(rule=rule).select_related("rule", "deployment", "alert")
        if "status" in query.validated_data:
            rows = rows.filter(status=query.validated_data["status"])
        rows = rows.order_by("-created_at", "-id")[:query.validated_data["limit"]]
        return Response(ActionAdviceSerializer(rows, many=True).data)


class RuleAdviceApplyView(ApiView):
    """POST /api/v1/alert-rules/{id}/advice/{advice_id}/apply (operator)."""

    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={202: ActionAdviceApplyAnswer, **ERRORS},
                   description="Carry out what the advisory rule advised, as the operator's action whose reason "
                               "names the advice. 409 saying why for stale advice: applied, superseded, expired (its "
                               "alert resolved), not confirmed lately, made for a target that has changed since, or "
                               "refused by the service. Operator.")
    def post(self, request, rule_id: int, advice_id: int):
        rule = _rule(rule_id)
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        advice, action = advice_apply(rule=rule, advice_id=id_or_404(advice_id, "advice"),
                                      **write_kwargs(request, data.validated_data))
        return Response({"advice": ActionAdviceSerializer(advice).data, "action": ActionSerializer(action).data},
                        status=status.HTTP_202_ACCEPTED)
