from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from controlplane.api.serializers import NodeSerializer
from controlplane.api.views.base import READ_ERRORS, ApiView
from controlplane.models import Node
from controlplane.selectors import node_get


class NodeListView(ApiView):
    @extend_schema(responses={200: NodeSerializer(many=True), **READ_ERRORS},
                   description="Hosts with a node agent, their GPUs and when their agent was last seen. Viewer.")
    def get(self, request):
        return Response(NodeSerializer(Node.objects.order_by("name"), many=True).data)


class NodeDetailView(ApiView):
    @extend_schema(responses={200: NodeSerializer, **READ_ERRORS}, description="One node. Viewer.")
    def get(self, request, name: str):
        return Response(NodeSerializer(node_get(name)).data)
