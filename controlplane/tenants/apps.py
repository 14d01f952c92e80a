from django.apps import AppConfig


class TenantsConfig(AppConfig):
    """Tenants of the fleet: their API keys (stored hashed), priority class, limits and the deployments they may use,
    and which deployments require a key. The gateways learn all of it through their membership poll: the core's
    endpoints answer reads it through controlplane.tenant_provider, which this app fills in."""

    name = "controlplane.tenants"
    label = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from controlplane import tenant_provider
        from controlplane.tenants import selectors, services

        tenant_provider.provide(tenant_provider.TenantProvider(gateway_access=selectors.gateway_access,
                                                               gateway_access_many=selectors.gateway_access_many,
                                                               admission=selectors.deployment_admission,
                                                               service_key=services.tenant_service_key))
