"""Django admin for rules, silences and channels; alerts, transitions, action runs and deliveries are history and
read-only here."""
from django.contrib import admin

from controlplane.alerting.models import Alert, AlertRule, AlertTransition, Channel, Delivery, RuleActionRun, Silence


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "deployment", "role", "per_worker", "metric", "comparison", "threshold", "for_s",
                    "severity", "enabled")
    list_filter = ("enabled", "severity", "deployment")
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


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ("id", "comment", "starts_at", "ends_at", "created_by")


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "url", "enabled", "disabled_reason")
    list_filter = ("kind", "enabled")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "channel", "event", "status", "attempts", "response_code", "error", "created_at")
    list_filter = ("status", "channel")
