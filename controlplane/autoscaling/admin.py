from django.contrib import admin

from controlplane.autoscaling.models import AutoscalingPolicy


@admin.register(AutoscalingPolicy)
class AutoscalingPolicyAdmin(admin.ModelAdmin):
    list_display = ("pool", "enabled", "metric", "target", "last_evaluated_at")
    list_filter = ("enabled", "metric")
    readonly_fields = ("recommendations", "last_evaluated_at", "last_decision")
