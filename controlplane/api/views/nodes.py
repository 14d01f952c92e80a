from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from controlplane.api.serializers import NodeSerializer
from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer
from controlplane.models import Node
from controlplane.selectors import node_get
from controlplane.services.nodes import node_labels_set, node_measure_request


class NodeListView(ApiView):
    @extend_schema(responses={200: NodeSerializer(many=True), **READ_ERRORS},
                   description="Hosts with a node agent, their GPUs and when their agent was last seen. Viewer.")
    def get(self, request):
        return Response(NodeSerializer(Node.objects.order_by("name"), many=True).data)


class NodeLabelsInput(WriteInputSerializer):
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True))


class NodeMeasureAnswer(serializers.Serializer):
    node = serializers.CharField()
    queued = serializers.BooleanField(help_text="whether the broker took the message in time")
    measured_at = serializers.CharField(allow_null=True, help_text="when the figures the node holds now were taken")


class NodeDetailView(ApiView):
    @extend_schema(responses={200: NodeSerializer, **READ_ERRORS}, description="One node. Viewer.")
    def get(self, request, name: str):
        return Response(NodeSerializer(node_get(name)).data)

    @extend_schema(request=NodeLabelsInput, responses={200: NodeSerializer, **ERRORS},
                   description="Replace the labels operators set on the node (`{\"labels\": {\"class\": "
                               "\"compute\"}}`); detected labels stay. Pools select nodes by labels. Admin.")
    def patch(self, request, name: str):
        node = node_get(name)
        data = NodeLabelsInput(data=request.data)
        data.is_valid(raise_exception=True)
        node = node_labels_set(node=node, labels=data.validated_data["labels"], actor=request.user,
                               reason=data.validated_data["reason"])
        return Response(NodeSerializer(node).data)


class NodeMeasureView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=None, responses={202: NodeMeasureAnswer, **ERRORS},
                   description="Ask the node's agent to measure its host's roofline again (matmul peak per "
                               "precision, read bandwidth: a few seconds on the host). The answer comes before the "
                               "figures: the node's `roofline.measured_at` says when they were taken. Workers "
                               "started afterwards are judged against the new figures. Operator.")
    def post(self, request, name: str):
        node = node_get(name)
        queued = node_measure_request(node=node)
        return Response({"node": node.name, "queued": queued, "measured_at": (node.roofline or {}).get("measured_at")},
                        status=202)
