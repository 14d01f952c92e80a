from django.contrib import admin

from controlplane.tenants.models import DeploymentAccess, Tenant, TenantKey, TenantUsage
from inference.gateway.tenant_limits import NAMES as LIMIT_NAMES


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    """Read-only: every change goes through the services (one Action row each), as the API's do."""

    list_display = ("name", "priority_class", *LIMIT_NAMES)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TenantKey)
class TenantKeyAdmin(TenantAdmin):
    list_display = ("tenant", "name", "prefix", "created_at", "expires_at", "revoked_at")
    exclude = ("key_hash",)


@admin.register(DeploymentAccess)
class DeploymentAccessAdmin(TenantAdmin):
    list_display = ("deployment", "requires_key", "updated_at")


@admin.register(TenantUsage)
class TenantUsageAdmin(TenantAdmin):
    list_display = ("hour", "tenant", "deployment", "requests", "prompt_tokens", "completion_tokens", "rate_limited",
                    "shed")
    list_filter = ("tenant",)
