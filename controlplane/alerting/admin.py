"""Django admin for rules, silences and channels; alerts, transitions, action runs, advice and deliveries are
history and read-only here. Rule and silence edits go through the same validation as the API (a bad action list would fail
every evaluation; a bad regex every match)."""
import copy

from django import forms
from django.contrib import admin

from controlplane.alerting.models import (ActionAdvice, Alert, AlertRule, AlertTransition, Channel, Delivery,
                                          RuleActionRun, Silence)
from controlplane.alerting.services.rules import rule_validate
from controlplane.alerting.services.silences import validate_matchers
from controlplane.errors import ControlPlaneError


class AlertRuleForm(forms.ModelForm):
    class Meta:
        model = AlertRule
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        # The rule as it would be saved: the form's values over a copy of the stored one.
        candidate = forms.models.construct_instance(self, copy.copy(self.instance))
        try:
            rule_validate({}, instance=candidate)
        except ControlPlaneError as exc:
            raise forms.ValidationError(exc.message) from None
        return cleaned


class SilenceForm(forms.ModelForm):
    class Meta:
        model = Silence
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        try:
            cleaned["matchers"] = validate_matchers(cleaned.get("matchers"))
        except ControlPlaneError as exc:
            self.add_error("matchers", exc.message)
        starts_at, ends_at = cleaned.get("starts_at"), cleaned.get("ends_at")
        if starts_at and ends_at and ends_at <= starts_at:
            self.add_error("ends_at", "ends_at must be after starts_at")
        return cleaned


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    form = AlertRuleForm
    list_display = ("name", "deployment", "role", "per_worker", "metric", "comparison", "threshold", "for_s",
                    "severity", "enabled", "advisory")
    list_filter = ("enabled", "advisory", "severity", "deployment")
    search_fields = ("name", "metric")


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class TransitionInline(admin.TabularInline):
    model = AlertTransition
    extra = 0
    can_delete = False
    readonly_fields = ("from_state", "to_state", "value", "at")


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ("id", "rule", "state", "deployment", "role", "worker", "value", "active_at", "fired_at",
                    "resolved_at")
    list_filter = ("state", "deployment")
    inlines = [TransitionInline]


@admin.register(RuleActionRun)
class RuleActionRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "rule", "kind", "target", "status", "action", "created_at")
    list_filter = ("status", "kind")


@admin.register(ActionAdvice)
class ActionAdviceAdmin(ReadOnlyAdmin):
    list_display = ("id", "rule", "kind", "target", "value", "threshold", "status", "applied_by", "action",
                    "created_at", "evaluated_at")
    list_filter = ("status", "kind")


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    form = SilenceForm
    list_display = ("id", "comment", "starts_at", "ends_at", "created_by")


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "url", "enabled", "disabled_reason")
    list_filter = ("kind", "enabled")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "channel", "event", "status", "attempts", "response_code", "error", "created_at")
    list_filter = ("status", "channel")
