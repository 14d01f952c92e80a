from django.contrib import admin

from controlplane.observability.models import CycleStat


@admin.register(CycleStat)
class CycleStatAdmin(admin.ModelAdmin):
    list_display = ("kind", "count", "sum_seconds", "last_seconds", "last_at", "last_targets", "last_targets_up")

    def has_add_permission(self, request):
        return False
