"""Shared gateways (docs/gateway.md, "Shared gateway"): create, list, delete, attach or detach a deployment, and the
membership a shared gateway polls."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from controlplane.api.serializers import DeploymentSerializer, SharedGatewaySerializer
from controlplane.api.views.base import ERRORS, READ_ERRORS, ApiView, StrictSerializer
from controlplane.models import SharedGateway
from controlplane.selectors import deployment_get, shared_gateway_endpoints, shared_gateway_get
from controlplane.services.gateways import (deployment_gateway_attach, deployment_gateway_detach,
                                            shared_gateway_create, shared_gateway_delete)


class SharedGatewayInput(StrictSerializer):
    name = serializers.JSONField()
    port = serializers.JSONField()
    node = serializers.JSONField(required=False, allow_null=True, default=None)


class SharedGatewayListView(ApiView):
    @extend_schema(responses={200: SharedGatewaySerializer(many=True), **READ_ERRORS},
                   description="Shared gateways, each with the deployments it serves. Viewer.")
    def get(self, request):
        gateways = SharedGateway.objects.select_related("node").prefetch_related("deployments")
        return Response(SharedGatewaySerializer(gateways, many=True).data)

    @extend_schema(request=SharedGatewayInput, responses={201: SharedGatewaySerializer, **ERRORS},
                   description="Create a shared gateway: `{\"name\", \"port\", \"node\"}` (node optional). 400 naming "
                               "the field for a bad value; 409 for a name or port taken. Admin.")
    def post(self, request):
        data = SharedGatewayInput(data=request.data)
        data.is_valid(raise_exception=True)
        gateway = shared_gateway_create(**data.validated_data, actor=request.user)
        return Response(SharedGatewaySerializer(gateway).data, status=201)


class SharedGatewayDetailView(ApiView):
    @extend_schema(responses={200: SharedGatewaySerializer, **READ_ERRORS}, description="One shared gateway. Viewer.")
    def get(self, request, name: str):
        return Response(SharedGatewaySerializer(shared_gateway_get(name)).data)

    @extend_schema(request=None, responses={204: None, **ERRORS},
                   description="Delete a shared gateway; 409 while it serves a deployment or its process is still "
                               "stopping. Admin.")
    def delete(self, request, name: str):
        shared_gateway_delete(gateway=shared_gateway_get(name), actor=request.user)
        return Response(status=204)


class SharedGatewayEndpointsView(ApiView):
    @extend_schema(responses={200: dict, **READ_ERRORS},
                   description="The shared gateway's membership (docs/contracts.md): every attached deployment's "
                               "answer, in one response. The gateway polls it with a viewer token.")
    def get(self, request, name: str):
        return Response(shared_gateway_endpoints(shared_gateway_get(name)))


class AttachInput(StrictSerializer):
    shared_gateway = serializers.CharField(help_text="the shared gateway to serve the deployment from")


class DeploymentGatewayView(ApiView):
    @extend_schema(request=AttachInput, responses={200: DeploymentSerializer, **ERRORS},
                   description="Serve the deployment from a shared gateway (`{\"shared_gateway\": NAME}`): its own "
                               "gateway stops and its port is given back. 404 for an unknown gateway. Admin.")
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = AttachInput(data=request.data)
        data.is_valid(raise_exception=True)
        gateway = shared_gateway_get(data.validated_data["shared_gateway"])
        deployment_gateway_attach(deployment=deployment, gateway=gateway, actor=request.user)
        return Response(DeploymentSerializer(deployment_get(name)).data)

    @extend_schema(request=None, responses={200: DeploymentSerializer, **ERRORS},
                   description="Detach the deployment from its shared gateway: it gets a gateway of its own again "
                               "(a new port). 409 when no shared gateway serves it. Admin.")
    def delete(self, request, name: str):
        deployment_gateway_detach(deployment=deployment_get(name), actor=request.user)
        return Response(DeploymentSerializer(deployment_get(name)).data)
