"""The chaos API, under /api/v1/deployments/{name}/chaos: the opt-in and the experiments (what may run, and what to
inject). Runs are in runs_api.py, game days in schedules_api.py.

    GET, PUT  .../chaos                          the opt-in (admins set it; off by default)
    GET, POST .../chaos/experiments              list (viewer), create (admin)
    GET, PATCH, DELETE .../chaos/experiments/{experiment}
    GET       .../chaos/experiments/{experiment}/steady-state      the hypothesis judged now (viewer)
    GET       .../chaos/experiments/{experiment}/chaostoolkit.json the experiment as a Chaos Toolkit experiment
    POST      .../chaos/import                   a new experiment from a Chaos Toolkit experiment (admin)
    GET       .../chaos/templates                the built-in templates (viewer)
    POST      .../chaos/templates/{key}          a new experiment from one of them (admin)
"""
from __future__ import annotations

import time

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import (ADMINISTER, ERRORS, READ_ERRORS, ApiView, StrictSerializer,
                                         WriteInputSerializer, write_kwargs)
from controlplane.chaos import library
from controlplane.chaos.chaostoolkit import to_chaostoolkit
from controlplane.chaos.models import Experiment
from controlplane.chaos.selectors import (chaos_settings_of, experiment_get, experiment_list,
                                          experiment_steady_state, run_active)
from controlplane.chaos.services import (chaos_enable, experiment_create, experiment_delete, experiment_from_template,
                                         experiment_import, experiment_update)
from controlplane.selectors import deployment_get


class ChaosSettingsOutput(serializers.Serializer):
    deployment = serializers.CharField(source="deployment.name")
    enabled = serializers.BooleanField()
    updated_at = serializers.DateTimeField(allow_null=True, default=None)
    updated_by = serializers.CharField(source="updated_by.username", allow_null=True, default=None)


class ChaosSettingsInput(WriteInputSerializer):
    enabled = serializers.JSONField(help_text="true: experiments may run on this deployment; false: none may.")


class ChaosSettingsView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: ChaosSettingsOutput, **READ_ERRORS},
                   description="Whether chaos experiments may run on the deployment (off by default). Viewer.")
    def get(self, request, name: str):
        deployment = deployment_get(name)
        active = run_active(deployment)
        return Response({**ChaosSettingsOutput(chaos_settings_of(deployment)).data,
                         "active_run": active.pk if active else None})

    @extend_schema(request=ChaosSettingsInput, responses={200: ChaosSettingsOutput, **ERRORS},
                   description="Opt the deployment in to chaos experiments, or out (409 while a run is active). "
                               "Admin.")
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = ChaosSettingsInput(data=request.data)
        data.is_valid(raise_exception=True)
        action = chaos_enable(deployment=deployment, enabled=data.validated_data["enabled"],
                              **write_kwargs(request, data.validated_data))
        return Response({**ChaosSettingsOutput(chaos_settings_of(deployment)).data,
                         "action": ActionSerializer(action).data})


class ExperimentOutput(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = Experiment
        fields = ["name", "deployment", "description", "target", "faults", "duration_s", "hypothesis",
                  "abort_conditions", "recovery_timeout_s", "created_at", "updated_at", "created_by"]


_EXPERIMENT_HELP = {
    "target": "{\"role\": \"decode\", \"count\": 1} or {\"role\": \"decode\", \"percent\": 50}: ready workers of a "
              "pool (or the gateway), chosen at random when the run starts. {\"node\": \"gpu-1\"}: every ready "
              "worker of the deployment on that node (400 naming target.node when it is not registered or runs none "
              "of them), narrowed by role, count, percent or revision when given; its node-level faults (cpu_hog, "
              "memory_pressure, gpu_memory, disk_fill, agent_kill) are carried once, by that node's agent.",
    "faults": "[{\"kind\": \"pause\", \"duration_s\": 5}] or [{\"kind\": \"kill\"}]: applied to every target.",
    "duration_s": "How long the faults last (at most TANDEM_CHAOS_MAX_DURATION_S).",
    "hypothesis": "Checks that must hold before the faults and again after them: [{\"metric\": \"error_ratio\", "
                  "\"max\": 0.005, \"window_s\": 10}, {\"metric\": \"ttft_p99_seconds\", \"max_baseline_ratio\": "
                  "1.5}, {\"metric\": \"ready_workers\", \"role\": \"decode\", \"min\": 1}].",
    "abort_conditions": "[{\"metric\": \"error_ratio\", \"above\": 0.05, \"window_s\": 5, \"for_s\": 10}]: any one "
                        "breached that long reverts every fault at once.",
    "recovery_timeout_s": "How long after the revert the hypothesis may take to hold again (default 120).",
}


class ExperimentInput(StrictSerializer):
    name = serializers.JSONField()
    description = serializers.JSONField(required=False, default="")
    target = serializers.JSONField(help_text=_EXPERIMENT_HELP["target"])
    faults = serializers.JSONField(help_text=_EXPERIMENT_HELP["faults"])
    duration_s = serializers.JSONField(help_text=_EXPERIMENT_HELP["duration_s"])
    hypothesis = serializers.JSONField(help_text=_EXPERIMENT_HELP["hypothesis"])
    abort_conditions = serializers.JSONField(required=False, default=None, help_text=_EXPERIMENT_HELP[
        "abort_conditions"])
    recovery_timeout_s = serializers.JSONField(required=False, default=120,
                                               help_text=_EXPERIMENT_HELP["recovery_timeout_s"])


class ExperimentPatchInput(StrictSerializer):
    description = serializers.JSONField(required=False)
    target = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["target"])
    faults = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["faults"])
    duration_s = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["duration_s"])
    hypothesis = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["hypothesis"])
    abort_conditions = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["abort_conditions"])
    recovery_timeout_s = serializers.JSONField(required=False, help_text=_EXPERIMENT_HELP["recovery_timeout_s"])


class ExperimentListView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: ExperimentOutput(many=True), **READ_ERRORS},
                   description="The deployment's chaos experiments. Viewer.")
    def get(self, request, name: str):
        return Response(ExperimentOutput(experiment_list(deployment_get(name)), many=True).data)

    @extend_schema(request=ExperimentInput, responses={201: ExperimentOutput, **ERRORS},
                   description="Create an experiment (400 naming the bad field; 409 when the name is taken). Admin.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = ExperimentInput(data=request.data)
        data.is_valid(raise_exception=True)
        experiment = experiment_create(deployment=deployment, actor=request.user, **data.validated_data)
        return Response(ExperimentOutput(experiment).data, status=status.HTTP_201_CREATED)


class ExperimentDetailView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: ExperimentOutput, **READ_ERRORS}, description="One experiment. Viewer.")
    def get(self, request, name: str, experiment: str):
        return Response(ExperimentOutput(experiment_get(deployment_get(name), experiment)).data)

    @extend_schema(request=ExperimentPatchInput, responses={200: ExperimentOutput, **ERRORS},
                   description="Change some of an experiment's fields; a run in progress keeps its copy. Admin.")
    def patch(self, request, name: str, experiment: str):
        found = experiment_get(deployment_get(name), experiment)
        data = ExperimentPatchInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(ExperimentOutput(experiment_update(experiment=found, actor=request.user,
                                                           **data.validated_data)).data)

    @extend_schema(responses={204: None, **ERRORS},
                   description="Delete an experiment; its runs keep their reports. 409 while one runs. Admin.")
    def delete(self, request, name: str, experiment: str):
        experiment_delete(experiment=experiment_get(deployment_get(name), experiment), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ExperimentSteadyStateView(ApiView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The experiment's hypothesis judged now, as a run's start judges it: each check's "
                               "value, limit and verdict (a `max_baseline_ratio` check also its baseline and "
                               "ratio). What the Chaos Toolkit extension's probes read. Viewer.")
    def get(self, request, name: str, experiment: str):
        return Response(experiment_steady_state(experiment_get(deployment_get(name), experiment), now=time.time()))


class ExperimentChaosToolkitView(ApiView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The experiment as a Chaos Toolkit experiment (docs/chaos.md): `chaos run` on it "
                               "runs it through the tandem_chaostoolkit extension, with $TANDEM_URL and an "
                               "operator's $TANDEM_TOKEN. POST it to .../chaos/import to import it. Viewer.")
    def get(self, request, name: str, experiment: str):
        found = experiment_get(deployment_get(name), experiment)
        document = to_chaostoolkit(deployment=found.deployment.name, spec=found.spec(), description=found.description)
        return Response(document, headers={"Content-Disposition": f'attachment; filename="{found.name}.json"'})


class ExperimentImportView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(request=OpenApiTypes.OBJECT, responses={201: ExperimentOutput, **ERRORS},
                   description="Create an experiment from a Chaos Toolkit experiment (the body): its title becomes "
                               "the name. A 400 names the place in the document that cannot be mapped (another "
                               "extension's activity, a tolerance with two bounds, ...) or that is invalid; 409 "
                               "when the name is taken. Admin.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        experiment = experiment_import(deployment=deployment, actor=request.user, document=request.data)
        return Response(ExperimentOutput(experiment).data, status=status.HTTP_201_CREATED)


class TemplateInput(StrictSerializer):
    name = serializers.JSONField(required=False, default=None, help_text="Default: the template's key.")
    role = serializers.JSONField(required=False, default=None, help_text="Default: the template's role.")
    count = serializers.JSONField(required=False, default=1, help_text="How many workers of the role (default 1).")
    node = serializers.JSONField(required=False, default=None, help_text="Only the role's workers on this node "
                                                                         "(default: any node).")
    duration_s = serializers.JSONField(required=False, default=None, help_text="Default: the template's.")


class TemplateListView(ApiView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The built-in experiment templates (docs/chaos.md#templates): key, title, "
                               "description, role, faults, duration. Viewer.")
    def get(self, request, name: str):
        deployment_get(name)
        return Response([{"key": t.key, "title": t.title, "description": t.description, "role": t.role,
                          "faults": list(t.faults), "duration_s": t.duration_s} for t in library.TEMPLATES])


class TemplateCreateView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(request=TemplateInput, responses={201: ExperimentOutput, **ERRORS},
                   description="Create an experiment from a built-in template, as the deployment page's form does: "
                               "its faults, hypothesis and abort condition, with the name, target role, count, "
                               "node and duration given here (400 naming the bad field; 409 when the name is "
                               "taken). Admin.")
    def post(self, request, name: str, key: str):
        deployment = deployment_get(name)
        data = TemplateInput(data=request.data)
        data.is_valid(raise_exception=True)
        experiment = experiment_from_template(deployment=deployment, actor=request.user, template=key,
                                              **data.validated_data)
        return Response(ExperimentOutput(experiment).data, status=status.HTTP_201_CREATED)
