from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import ActionSerializer, WorkerActionSerializer, WorkerSerializer
from controlplane.api.views.base import (ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer, id_or_404,
                                         write_kwargs)
from controlplane.models import WorkerRole, WorkerStatus
from controlplane.selectors import worker_get, worker_list
from controlplane.services import worker_drain, worker_restart


class WorkerFilter(serializers.Serializer):
    deployment = serializers.CharField(required=False, max_length=63)
    role = serializers.ChoiceField(choices=WorkerRole.choices, required=False)
    status = serializers.ChoiceField(choices=WorkerStatus.choices, required=False)
    node = serializers.CharField(required=False, max_length=63)
    shared_gateway = serializers.CharField(required=False, max_length=63)


class WorkerListView(ApiView):
    @extend_schema(parameters=[WorkerFilter], responses={200: WorkerSerializer(many=True), **READ_ERRORS},
                   description="Worker processes (gateways included, role `gateway`; a shared gateway's has "
                               "`shared_gateway` and no deployment), filtered by deployment name, role, status, node "
                               "and shared gateway. Viewer.")
    def get(self, request):
        filters = WorkerFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return Response(WorkerSerializer(worker_list(**filters.validated_data), many=True).data)


class WorkerDetailView(ApiView):
    @extend_schema(responses={200: WorkerSerializer, **READ_ERRORS}, description="One worker. Viewer.")
    def get(self, request, worker_id: int):
        return Response(WorkerSerializer(worker_get(id_or_404(worker_id, "worker"))).data)


def _answer(action, worker_id: int) -> Response:
    return Response({"action": ActionSerializer(action).data, "worker": WorkerSerializer(worker_get(worker_id)).data},
                    status=status.HTTP_202_ACCEPTED)


class WorkerRestartView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={202: WorkerActionSerializer, **ERRORS},
                   description="Restart a worker's process in place (also revives a failed worker). 409 for a "
                               "stopped or draining worker or one with a restart/drain in progress. 202 with the "
                               "`restart` action. Operator.")
    def post(self, request, worker_id: int):
        worker = worker_get(id_or_404(worker_id, "worker"))
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        action = worker_restart(worker=worker, **write_kwargs(request, data.validated_data))
        return _answer(action, worker.pk)


class WorkerDrainView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={202: WorkerActionSerializer, **ERRORS},
                   description="Drain a worker: it leaves the gateway membership, finishes its requests and stops; "
                               "its pool keeps its desired count, so a replacement starts (scale down to shrink). "
                               "400 for a gateway, 409 unless it is pending, starting or ready. 202 with the "
                               "`drain` action. Operator.")
    def post(self, request, worker_id: int):
        worker = worker_get(id_or_404(worker_id, "worker"))
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        action = worker_drain(worker=worker, **write_kwargs(request, data.validated_data))
        return _answer(action, worker.pk)
