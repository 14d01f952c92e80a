"""Django admin: where admins manage users, role groups and API tokens. The fleet's rows are shown read-only:
every change of desired state goes through the services (API, dashboard), so that it is validated, audited as an
action row and followed by a reconcile — an admin form would do none of that."""
from django.contrib import admin

from rest_framework.authtoken.models import TokenProxy

from controlplane.models import Action, ApiToken, Deployment, Node, Pool, Revision, Worker


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PoolInline(admin.TabularInline):
    model = Pool
    extra = 0

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ("name", "mode", "current_revision", "gateway_port", "autoscale_enabled", "created_at")
    search_fields = ("name",)
    inlines = [PoolInline]


@admin.register(Revision)
class RevisionAdmin(ReadOnlyAdmin):
    list_display = ("deployment", "number", "model_path", "dtype", "created_at", "created_by")
    list_filter = ("deployment",)


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("name", "queue", "hostname", "last_seen_at")

    def has_delete_permission(self, request, obj=None):
        # A decommissioned host's row may go; the database refuses while workers still point at it (PROTECT).
        return request.user.is_superuser


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "role", "status", "node", "host", "port", "pid", "revision",
                    "restart_count", "ready_at")
    list_filter = ("status", "role", "deployment")


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "kind", "deployment_name", "actor_type", "actor", "status")
    list_filter = ("kind", "status", "actor_type")
    search_fields = ("deployment_name", "actor", "reason")


# Keys are stored hashed: DRF's token admin (plain keys) goes; tokens are issued by `manage.py tandem_token`, which
# shows the key once, and revoked here by deleting them.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created_at")
    search_fields = ("user__username", "name", "prefix")
    readonly_fields = ("user", "name", "prefix", "key_hash", "created_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
