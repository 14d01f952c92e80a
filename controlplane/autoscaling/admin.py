from django.contrib import admin

from controlplane.autoscaling.models import AutoscalingPolicy, ScaleAdvice


@admin.register(AutoscalingPolicy)
class AutoscalingPolicyAdmin(admin.ModelAdmin):
    list_display = ("pool", "enabled", "metric", "target", "last_evaluated_at")
    list_filter = ("enabled", "metric")
    readonly_fields = ("recommendations", "last_evaluated_at", "last_decision")


@admin.register(ScaleAdvice)
class ScaleAdviceAdmin(admin.ModelAdmin):
    """Read-only: advice is written by the autoscaler and applied through the API or the deployment page."""

    list_display = ("pk", "pool", "from_replicas", "to_replicas", "status", "created_at", "applied_by")
    list_filter = ("status",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
