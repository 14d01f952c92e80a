from django.urls import path

from controlplane.api.views import actions, deployments, gateways, nodes, operations, workers

app_name = "api"


def verb(route: str, view, name: str) -> list:
    """An action route as the issue spells it (no trailing slash), plus the slashed form that curl users type.
    Only the first is in the OpenAPI schema."""
    return [path(route, view.as_view(), name=name), path(route + "/", view.as_view(schema=None))]


urlpatterns = [
    path("nodes/", nodes.NodeListView.as_view(), name="node-list"),
    path("nodes/<str:name>/", nodes.NodeDetailView.as_view(), name="node-detail"),
    *verb("nodes/<str:name>/measure", nodes.NodeMeasureView, "node-measure"),
    path("deployments/", deployments.DeploymentListView.as_view(), name="deployment-list"),
    path("deployments/<str:name>/", deployments.DeploymentDetailView.as_view(), name="deployment-detail"),
    path("deployments/<str:name>/revisions/", deployments.RevisionListView.as_view(), name="revision-list"),
    *verb("deployments/<str:name>/revisions/diff", deployments.RevisionDiffView, "revision-diff"),
    *verb("deployments/<str:name>/scale", operations.ScaleView, "deployment-scale"),
    *verb("deployments/<str:name>/rollback", operations.RollbackView, "deployment-rollback"),
    *verb("deployments/<str:name>/endpoints", operations.EndpointsView, "deployment-endpoints"),
    *verb("deployments/<str:name>/pools/<str:role>", operations.PoolPlacementView, "pool-placement"),
    *verb("deployments/<str:name>/gateway", gateways.DeploymentGatewayView, "deployment-gateway"),
    path("gateways/", gateways.SharedGatewayListView.as_view(), name="gateway-list"),
    path("gateways/<str:name>/", gateways.SharedGatewayDetailView.as_view(), name="gateway-detail"),
    *verb("gateways/<str:name>/endpoints", gateways.SharedGatewayEndpointsView, "gateway-endpoints"),
    path("workers/", workers.WorkerListView.as_view(), name="worker-list"),
    path("workers/<int:worker_id>/", workers.WorkerDetailView.as_view(), name="worker-detail"),
    *verb("workers/<int:worker_id>/restart", workers.WorkerRestartView, "worker-restart"),
    *verb("workers/<int:worker_id>/drain", workers.WorkerDrainView, "worker-drain"),
    path("actions/", actions.ActionListView.as_view(), name="action-list"),
    path("actions/<int:action_id>/", actions.ActionDetailView.as_view(), name="action-detail"),
]
