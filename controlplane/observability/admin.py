from django.contrib import admin

from controlplane.observability.models import AutoscalingPolicy, CycleStat


@admin.register(AutoscalingPolicy)
class AutoscalingPolicyAdmin(admin.ModelAdmin):
    list_display = ("pool", "enabled", "metric", "target", "last_evaluated_at")
    list_filter = ("enabled", "metric")
    readonly_fields = ("recommendations", "last_evaluated_at", "last_decision")


@admin.register(CycleStat)
class CycleStatAdmin(admin.ModelAdmin):
    list_display = ("kind", "count", "sum_seconds", "last_seconds", "last_at", "last_targets", "last_targets_up")

    def has_add_permission(self, request):
        return False
