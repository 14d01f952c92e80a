"""The chaos API's runs, under /api/v1/deployments/{name}/chaos: start one, follow it, abort it, read its report.

    POST      .../chaos/experiments/{experiment}/run      start a run (operator): 201, 403 not opted in, 409
    GET       .../chaos/runs, .../chaos/runs/{id}, .../chaos/runs/{id}/report
    POST      .../chaos/runs/{id}/abort          (operator)
"""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer, write_kwargs
from controlplane.chaos.models import ChaosRun
from controlplane.chaos.report import run_report
from controlplane.chaos.selectors import experiment_get, run_get, run_list
from controlplane.chaos.services import run_abort, run_start
from controlplane.selectors import deployment_get


class RunOutput(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    experiment = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = ChaosRun
        fields = ["id", "deployment", "experiment", "status", "verdict", "targets", "faults", "started_at",
                  "fault_ends_at", "reverted_at", "recovered_at", "finished_at", "abort_reason", "created_by"]

    def get_experiment(self, run) -> str | None:
        return run.spec.get("name")


class ExperimentRunView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={201: RunOutput, **ERRORS},
                   description="Start a run: the hypothesis is checked first (409 `not_steady` naming each failing "
                               "check), then the faults are injected by the node agents. 403 `chaos_disabled` when "
                               "the deployment has not opted in; 409 while another run is active. Operator.")
    def post(self, request, name: str, experiment: str):
        found = experiment_get(deployment_get(name), experiment)
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = run_start(experiment=found, **write_kwargs(request, data.validated_data))
        return Response(RunOutput(run).data, status=status.HTTP_201_CREATED)


class RunListView(ApiView):
    @extend_schema(responses={200: RunOutput(many=True), **READ_ERRORS},
                   description="The deployment's chaos runs, newest first. Viewer.")
    def get(self, request, name: str):
        return Response(RunOutput(run_list(deployment_get(name))[:100], many=True).data)


class RunDetailView(ApiView):
    @extend_schema(responses={200: RunOutput, **READ_ERRORS}, description="One run. Viewer.")
    def get(self, request, name: str, run_id: int):
        return Response(RunOutput(run_get(deployment_get(name), run_id)).data)


class RunAbortView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=WriteInputSerializer, responses={202: RunOutput, **ERRORS},
                   description="Revert every fault now (a recovering run stops waiting and finishes). 409 once "
                               "finished. Operator.")
    def post(self, request, name: str, run_id: int):
        run = run_get(deployment_get(name), run_id)
        data = WriteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        kwargs = write_kwargs(request, data.validated_data)
        return Response(RunOutput(run_abort(run=run, actor=kwargs["actor"], reason=kwargs["reason"])).data,
                        status=status.HTTP_202_ACCEPTED)


class RunReportView(ApiView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The run's report: hypothesis before, during and after, recovery time, requests "
                               "sent/failed/migrated, the faults as the agents reported them, the actions the "
                               "system took meanwhile, the verdict. Final once the run finished. Viewer.")
    def get(self, request, name: str, run_id: int):
        run = run_get(deployment_get(name), run_id)
        return Response(run.report if run.finished_at else run_report(run))
