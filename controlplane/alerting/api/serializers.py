"""Input and output serializers of the alerting API. Inputs check types and ranges; services check the rest."""
from __future__ import annotations

from rest_framework import serializers

from controlplane.alerting.models import (Aggregation, Alert, AlertRule, AlertState, AlertTransition, Channel,
                                          ChannelKind, Comparison, Delivery, DeliveryStatus, Severity, Silence)
from controlplane.alerting.models.rules import ScopeRole
from controlplane.alerting.services.action_kinds import actions_help
from controlplane.models import Deployment
from controlplane.selectors import MAX_ID

MAX_SECONDS = 366 * 86400  # a year: longer durations are typos, and they must fit the database's integer


class RuleInput(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    deployment = serializers.SlugRelatedField(slug_field="name", queryset=Deployment.objects.all(), allow_null=True,
                                              required=False, default=None,
                                              help_text="Deployment name; null: every deployment.")
    role = serializers.ChoiceField(choices=ScopeRole.choices, required=False, allow_blank=True, default="")
    per_worker = serializers.BooleanField(required=False, default=False)
    tenant = serializers.CharField(max_length=63, required=False, allow_blank=True, default="",
                                   help_text="A tenant's name: the rule reads its series, one alert per deployment "
                                             "it uses; empty: the pools' series.")
    metric = serializers.CharField(max_length=64, help_text="A stored metric name (GET /api/v1/metrics/...).")
    aggregation = serializers.ChoiceField(choices=Aggregation.choices, required=False, default=Aggregation.AVG)
    window_s = serializers.IntegerField(min_value=1, max_value=MAX_SECONDS, required=False, default=60)
    comparison = serializers.ChoiceField(choices=Comparison.choices)
    threshold = serializers.FloatField()
    compare_to_offset_s = serializers.IntegerField(min_value=1, max_value=MAX_SECONDS, required=False,
                                                   allow_null=True, default=None,
                                                   help_text="Relative mode: compare value / value this long ago "
                                                             "with threshold (a ratio).")
    for_s = serializers.IntegerField(min_value=0, max_value=MAX_SECONDS, required=False, default=0)
    keep_firing_for_s = serializers.IntegerField(min_value=0, max_value=MAX_SECONDS, required=False, default=0)
    fire_on_no_data = serializers.BooleanField(required=False, default=False)
    severity = serializers.ChoiceField(choices=Severity.choices, required=False, default=Severity.WARNING)
    labels = serializers.JSONField(required=False, default=dict)
    annotations = serializers.JSONField(required=False, default=dict)
    actions = serializers.JSONField(required=False, default=list,
                                    help_text=f'[{{"type": <kind>, <its params>}}, ...], run in order. Kinds: '
                                              f'{actions_help()}.')
    cooldown_s = serializers.IntegerField(min_value=0, max_value=MAX_SECONDS, required=False, default=300)
    enabled = serializers.BooleanField(required=False, default=True)
    advisory = serializers.BooleanField(required=False, default=False,
                                        help_text="Record the actions that change the fleet (all but notify) as "
                                                  "advice for an operator to apply, instead of carrying them out.")


class RuleSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name", allow_null=True, default=None)
    condition = serializers.CharField(source="describe", read_only=True)

    class Meta:
        model = AlertRule
        fields = ["id", "name", "deployment", "role", "per_worker", "tenant", "metric", "aggregation", "window_s",
                  "comparison", "threshold", "compare_to_offset_s", "for_s", "keep_firing_for_s", "fire_on_no_data",
                  "severity", "labels", "annotations", "actions", "cooldown_s", "enabled", "advisory", "default_key",
                  "condition", "created_at", "updated_at"]


class TransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = AlertTransition
        fields = ["from_state", "to_state", "value", "at"]


class AlertSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name")
    rule_id = serializers.IntegerField()
    deployment = serializers.CharField(source="deployment.name", allow_null=True, default=None)

    class Meta:
        model = Alert
        fields = ["id", "rule", "rule_id", "fingerprint", "state", "labels", "annotations", "deployment", "role",
                  "worker", "value", "active_at", "fired_at", "resolved_at", "last_evaluated_at"]


class AlertDetailSerializer(AlertSerializer):
    transitions = TransitionSerializer(many=True, read_only=True)

    class Meta(AlertSerializer.Meta):
        fields = AlertSerializer.Meta.fields + ["transitions"]


class AlertFilter(serializers.Serializer):
    state = serializers.ChoiceField(choices=AlertState.choices, required=False)
    deployment = serializers.CharField(required=False, max_length=63)
    rule = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)  # more overflows the driver


class SilenceInput(serializers.Serializer):
    matchers = serializers.JSONField(help_text='[{"name": "deployment", "value": "demo", "is_regex": false, '
                                               '"is_equal": true}]')
    starts_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    ends_at = serializers.DateTimeField()
    comment = serializers.CharField(max_length=2000)


class SilenceSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    active = serializers.SerializerMethodField()

    class Meta:
        model = Silence
        fields = ["id", "matchers", "starts_at", "ends_at", "comment", "created_by", "created_at", "active"]

    def get_active(self, silence: Silence) -> bool:
        return silence.is_active()


class ChannelInput(serializers.Serializer):
    name = serializers.SlugField(max_length=63)
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    url = serializers.URLField(max_length=2000)
    secrets = serializers.ListField(child=serializers.CharField(min_length=16, max_length=200), max_length=2,
                                    required=False, default=list,
                                    help_text="Signing secrets, current first; two during a rotation. Write-only.")
    enabled = serializers.BooleanField(required=False, default=True)


class ChannelSerializer(serializers.ModelSerializer):
    num_secrets = serializers.SerializerMethodField()

    class Meta:
        model = Channel
        # Secrets are write-only: never returned.
        fields = ["id", "name", "kind", "url", "num_secrets", "enabled", "disabled_reason", "disabled_at",
                  "created_at"]

    def get_num_secrets(self, channel: Channel) -> int:
        return len(channel.secrets or [])


class DeliverySerializer(serializers.ModelSerializer):
    channel = serializers.CharField(source="channel.name")

    class Meta:
        model = Delivery
        fields = ["id", "channel", "alert", "event", "status", "attempts", "response_code", "error", "created_at",
                  "last_attempt_at", "finished_at", "payload"]


class DeliveryFilter(serializers.Serializer):
    channel = serializers.CharField(required=False, max_length=63)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)
