"""The alerting API: rules (admin writes), alerts (read), silences (operator), channels and deliveries (admin), the
Prometheus export and the Alertmanager receiver. Views validate input, call a service, serialize output."""
from __future__ import annotations

import logging

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import renderers, serializers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response

from controlplane.alerting.api.serializers import (AlertDetailSerializer, AlertFilter, AlertSerializer,
                                                   ChannelInput, ChannelSerializer, DeliveryFilter,
                                                   DeliverySerializer, RuleInput, RuleSerializer, SilenceInput,
                                                   SilenceSerializer)
from controlplane.alerting.models import Alert, AlertRule, Channel, Delivery, Silence
from controlplane.alerting.services.alertmanager import alert_apply
from controlplane.alerting.services.channels import channel_create, channel_update
from controlplane.alerting.services.rules import rule_create, rule_delete, rule_update
from controlplane.alerting.services.silences import silence_create, silence_expire
from controlplane.alerting.webhooks.inbound import parse_payload
from controlplane.api.views.base import ADMINISTER, ERRORS, OPERATE, READ_ERRORS, ApiView, id_or_404
from controlplane.auth import BearerTokenAuthentication, IsAdmin, IsOperator
from controlplane.errors import invalid, not_found

log = logging.getLogger(__name__)


class Page(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def _get(model, pk, what: str):
    obj = model.objects.filter(pk=id_or_404(pk, what)).first()
    if obj is None:
        raise not_found(f"{what} {pk} does not exist")
    return obj


class RuleListView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: RuleSerializer(many=True), **READ_ERRORS}, description="Alert rules. Viewer.")
    def get(self, request):
        rules = AlertRule.objects.select_related("deployment").order_by("name")
        return Response(RuleSerializer(rules, many=True).data)

    @extend_schema(request=RuleInput, responses={201: RuleSerializer, **ERRORS},
                   description="Create a rule. 400 naming the field for an unknown metric, a bad comparison, a "
                               "negative duration, an unknown channel in actions... Admin.")
    def post(self, request):
        data = RuleInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(RuleSerializer(rule_create(**data.validated_data)).data, status=status.HTTP_201_CREATED)


class RuleDetailView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: RuleSerializer, **READ_ERRORS})
    def get(self, request, rule_id: int):
        return Response(RuleSerializer(_get(AlertRule, rule_id, "alert rule")).data)

    @extend_schema(request=RuleInput, responses={200: RuleSerializer, **ERRORS},
                   description="Change some fields of a rule. Admin.")
    def patch(self, request, rule_id: int):
        rule = _get(AlertRule, rule_id, "alert rule")
        data = RuleInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        return Response(RuleSerializer(rule_update(rule=rule, **data.validated_data)).data)

    @extend_schema(responses={204: None, **ERRORS}, description="Delete a rule and its alerts' history. Admin.")
    def delete(self, request, rule_id: int):
        rule_delete(rule=_get(AlertRule, rule_id, "alert rule"))
        return Response(status=status.HTTP_204_NO_CONTENT)


class PrometheusRulesRenderer(renderers.BaseRenderer):
    media_type = "application/yaml"
    format = "prometheus"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode()
        return renderers.JSONRenderer().render(data)  # an error body; JSON is valid YAML too


class _Fixed(BaseContentNegotiation):
    """`?format=` names the export format here, not a DRF renderer: always the one renderer."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers_, format_suffix=None):
        return renderers_[0], renderers_[0].media_type


class PrometheusRuleFile(serializers.Serializer):
    """The export's YAML document, described as what a YAML client parses it into (not as an opaque string)."""

    groups = serializers.ListField(
        child=serializers.DictField(),
        help_text='[{"name": "tandem", "rules": [{"alert", "expr", "for", "labels", "annotations"}, ...]}]')


class RuleExportView(ApiView):
    renderer_classes = [PrometheusRulesRenderer]
    content_negotiation_class = _Fixed

    @extend_schema(responses={(200, "application/yaml"): PrometheusRuleFile, **READ_ERRORS},
                   description="`?format=prometheus`: the enabled rules as a Prometheus rule file over the workers' "
                               "tandem_* series (`promtool check rules` accepts it). Viewer.")
    def get(self, request):
        from controlplane.alerting.export import prometheus_rule_file

        wanted = request.query_params.get("format", "prometheus")
        if wanted != "prometheus":
            raise invalid(f"format must be 'prometheus', not {wanted!r}", field="format")
        rules = AlertRule.objects.select_related("deployment").order_by("name")
        response = Response(prometheus_rule_file(rules))
        response["Content-Disposition"] = 'inline; filename="tandem-rules.yml"'
        return response


class AlertListView(ApiView):
    # As an attribute, not only instantiated below: drf-spectacular reads it to document the paginated envelope
    # ({"count", "next", "previous", "results"}) instead of a bare array.
    pagination_class = Page

    @extend_schema(parameters=[AlertFilter], responses={200: AlertSerializer(many=True), **READ_ERRORS},
                   description="Alert instances, newest first, paginated; filters: state, deployment, rule. Viewer.")
    def get(self, request):
        filters = AlertFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        alerts = Alert.objects.select_related("rule", "deployment")
        if "state" in filters.validated_data:
            alerts = alerts.filter(state=filters.validated_data["state"])
        if "deployment" in filters.validated_data:
            alerts = alerts.filter(deployment__name=filters.validated_data["deployment"])
        if "rule" in filters.validated_data:
            alerts = alerts.filter(rule_id=filters.validated_data["rule"])
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(alerts.order_by("-active_at", "-id"), request, view=self)
        return paginator.get_paginated_response(AlertSerializer(page, many=True).data)


class AlertDetailView(ApiView):
    @extend_schema(responses={200: AlertDetailSerializer, **READ_ERRORS},
                   description="One alert with its transitions. Viewer.")
    def get(self, request, alert_id: int):
        return Response(AlertDetailSerializer(_get(Alert, alert_id, "alert")).data)


class SilenceListView(ApiView):
    write_permission = OPERATE

    @extend_schema(responses={200: SilenceSerializer(many=True), **READ_ERRORS})
    def get(self, request):
        silences = Silence.objects.select_related("created_by").order_by("-starts_at", "-id")[:500]
        return Response(SilenceSerializer(silences, many=True).data)

    @extend_schema(request=SilenceInput, responses={201: SilenceSerializer, **ERRORS},
                   description="Mute notifications and actions of alerts whose labels match every matcher "
                               "(equality or anchored regex) from starts_at (default now) to ends_at. Operator.")
    def post(self, request):
        data = SilenceInput(data=request.data)
        data.is_valid(raise_exception=True)
        silence = silence_create(created_by=request.user, **data.validated_data)
        return Response(SilenceSerializer(silence).data, status=status.HTTP_201_CREATED)


class SilenceDetailView(ApiView):
    write_permission = OPERATE

    @extend_schema(responses={200: SilenceSerializer, **READ_ERRORS})
    def get(self, request, silence_id: int):
        return Response(SilenceSerializer(_get(Silence, silence_id, "silence")).data)

    @extend_schema(responses={200: SilenceSerializer, **ERRORS},
                   description="Expire the silence now (it stays listed). Operator.")
    def delete(self, request, silence_id: int):
        return Response(SilenceSerializer(silence_expire(silence=_get(Silence, silence_id, "silence"), actor=request.user)).data)


class AdminView(ApiView):
    """Channels hold webhook URLs and secrets: admins only, reads included."""

    def get_permissions(self):
        return [IsAdmin()]


class ChannelListView(AdminView):
    @extend_schema(responses={200: ChannelSerializer(many=True), **READ_ERRORS})
    def get(self, request):
        return Response(ChannelSerializer(Channel.objects.order_by("name"), many=True).data)

    @extend_schema(request=ChannelInput, responses={201: ChannelSerializer, **ERRORS},
                   description="A notification channel: webhook (signed JSON), slack or alertmanager (v4). Admin.")
    def post(self, request):
        data = ChannelInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(ChannelSerializer(channel_create(**data.validated_data)).data,
                        status=status.HTTP_201_CREATED)


class ChannelDetailView(AdminView):
    @extend_schema(responses={200: ChannelSerializer, **READ_ERRORS})
    def get(self, request, channel_id: int):
        return Response(ChannelSerializer(_get(Channel, channel_id, "channel")).data)

    @extend_schema(request=ChannelInput, responses={200: ChannelSerializer, **ERRORS},
                   description="Change a channel; `enabled: true` re-enables one disabled by a permanent error. "
                               "Admin.")
    def patch(self, request, channel_id: int):
        channel = _get(Channel, channel_id, "channel")
        data = ChannelInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        return Response(ChannelSerializer(channel_update(channel=channel, **data.validated_data)).data)

    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request, channel_id: int):
        _get(Channel, channel_id, "channel").delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryListView(AdminView):
    pagination_class = Page  # see AlertListView

    @extend_schema(parameters=[DeliveryFilter], responses={200: DeliverySerializer(many=True), **READ_ERRORS},
                   description="Deliveries, newest first, paginated; filters: channel name, status. Admin.")
    def get(self, request):
        filters = DeliveryFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        deliveries = Delivery.objects.select_related("channel")
        if "channel" in filters.validated_data:
            deliveries = deliveries.filter(channel__name=filters.validated_data["channel"])
        if "status" in filters.validated_data:
            deliveries = deliveries.filter(status=filters.validated_data["status"])
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(deliveries.order_by("-created_at", "-id"), request, view=self)
        return paginator.get_paginated_response(DeliverySerializer(page, many=True).data)


class AlertmanagerResult(serializers.Serializer):
    results = serializers.ListField(child=serializers.DictField())
    num_ignored = serializers.IntegerField(required=False)
    detail = serializers.CharField(required=False)


class AlertmanagerWebhookView(ApiView):
    """Alertmanager's `webhook_config` posts here with `http_config.authorization` (Bearer, an operator's token)."""

    authentication_classes = [BearerTokenAuthentication]

    def get_permissions(self):
        return [IsOperator()]

    @extend_schema(request=dict, responses={200: AlertmanagerResult, **ERRORS},
                   description="Alertmanager webhook v4 receiver. Labels `deployment`, `role`, `worker`; annotation "
                               "`tandem_action` (scale_up|scale_down|restart|rollback|notify) and "
                               "`tandem_scale_step`. Re-delivery makes no second action. Operator (Bearer token).")
    def post(self, request):
        payload = parse_payload(request.data)
        limit = settings.TANDEM_ALERTMANAGER_MAX_ALERTS
        results = [alert_apply(payload, alert, user=request.user) for alert in payload.alerts[:limit]]
        body = {"results": results}
        if len(payload.alerts) > limit:
            # Acknowledged (a retry would carry the same alerts): the response and the log say what was skipped.
            body["num_ignored"] = len(payload.alerts) - limit
            body["detail"] = (f"only the first {limit} of {len(payload.alerts)} alerts were processed "
                              "(TANDEM_ALERTMANAGER_MAX_ALERTS); group alerts in Alertmanager to send fewer")
            log.warning("Alertmanager delivery %r: %s", payload.group_key, body["detail"])
        return Response(body)
