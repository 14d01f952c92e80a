"""The chaos API, under /api/v1/deployments/{name}/chaos:

    GET, PUT  .../chaos                          the opt-in (admins set it; off by default)
    GET, POST .../chaos/experiments              list (viewer), create (admin)
    GET, PATCH, DELETE .../chaos/experiments/{experiment}
    POST      .../chaos/experiments/{experiment}/run      start a run (operator): 201, 403 not opted in, 409
    GET       .../chaos/runs, .../chaos/runs/{id}, .../chaos/runs/{id}/report
    POST      .../chaos/runs/{id}/abort          (operator)
    GET       .../chaos/experiments/{experiment}/steady-state      the hypothesis judged now (viewer)
    GET       .../chaos/experiments/{experiment}/chaostoolkit.json the experiment as a Chaos Toolkit experiment
    POST      .../chaos/import                   a new experiment from a Chaos Toolkit experiment (admin)
    GET       .../chaos/templates                the built-in templates (viewer)
    POST      .../chaos/templates/{key}          a new experiment from one of them (admin)
    GET, POST .../chaos/schedules                game days: list (viewer), create (admin)
    GET, PATCH, DELETE .../chaos/schedules/{id}  (PATCH: enabled; admin)
"""
from __future__ import annotations

import time

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import (ADMINISTER, ERRORS, OPERATE, READ_ERRORS, ApiView, StrictSerializer,
                                         WriteInputSerializer, write_kwargs)
from controlplane.chaos import library
from controlplane.chaos.chaostoolkit import to_chaostoolkit
from controlplane.chaos.models import ChaosRun, ChaosSchedule, Experiment
from controlplane.chaos.schedules import next_times, schedule_create, schedule_delete, schedule_set_enabled
from controlplane.chaos.report import run_report
from controlplane.chaos.selectors import (chaos_settings_of, experiment_get, experiment_list,
                                          experiment_steady_state, run_active, run_get, run_list,
                                          schedule_get, schedule_list)
from controlplane.chaos.services import (chaos_enable, experiment_create, experiment_delete, experiment_from_template,
                                         experiment_import, experiment_update, run_abort, run_start)
from controlplane.errors import invalid
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


class ChaosScheduleOutput(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    experiment = serializers.CharField(source="experiment.name")
    timezone = serializers.CharField(source="tz")
    window = serializers.SerializerMethodField()
    next_times = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = ChaosSchedule
        fields = ["id", "deployment", "experiment", "cron", "timezone", "window", "enabled", "next_run_at",
                  "next_times", "last_fired_at", "last_outcome", "last_run", "created_at", "created_by"]

    def get_window(self, schedule) -> dict | None:
        if not schedule.window_cron:
            return None
        return {"cron": schedule.window_cron, "duration_minutes": schedule.window_minutes}

    def get_next_times(self, schedule) -> list[str]:
        return [t.isoformat() for t in next_times(schedule)] if schedule.enabled else []


class ChaosScheduleInput(StrictSerializer):
    experiment = serializers.JSONField(help_text="The name of an experiment of this deployment.")
    cron = serializers.JSONField(help_text="When it runs: a 5-field cron expression, e.g. \"0 10 * * 2\".")
    timezone = serializers.JSONField(required=False, default="UTC", help_text="An IANA zone for both crons.")
    window = serializers.JSONField(required=False, default=None,
                                   help_text="When it may run: {\"cron\": \"0 9 * * 1-5\", \"duration_minutes\": "
                                             "480}; a cron time outside it is skipped. None: any time.")
    enabled = serializers.JSONField(required=False, default=True)


class ChaosSchedulePatchInput(StrictSerializer):
    enabled = serializers.JSONField(help_text="false pauses the schedule; true resumes it from now.")


class ScheduleListView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: ChaosScheduleOutput(many=True), **READ_ERRORS},
                   description="The deployment's game days. Viewer.")
    def get(self, request, name: str):
        return Response(ChaosScheduleOutput(schedule_list(deployment_get(name)), many=True).data)

    @extend_schema(request=ChaosScheduleInput, responses={201: ChaosScheduleOutput, **ERRORS},
                   description="Run an experiment at each cron time inside the window (400 naming the bad field). "
                               "A start is an operator's start: the deployment's opt-in, one run at a time and the "
                               "steady-state check decide; a refusal is a failed Action. Admin.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = ChaosScheduleInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        experiment = fields.pop("experiment")
        found = experiment_list(deployment).filter(name=experiment).first() if isinstance(experiment, str) else None
        if found is None:
            # A 400, not a 404: the URL is right, a field of the body is not.
            raise invalid(f"experiment {experiment!r} is not an experiment of {deployment.name!r}",
                          field="experiment")
        schedule = schedule_create(experiment=found, actor=request.user, timezone_name=fields.pop("timezone"),
                                   **fields)
        return Response(ChaosScheduleOutput(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetailView(ApiView):
    write_permission = ADMINISTER

    @extend_schema(responses={200: ChaosScheduleOutput, **READ_ERRORS}, description="One game day. Viewer.")
    def get(self, request, name: str, schedule_id: int):
        return Response(ChaosScheduleOutput(schedule_get(deployment_get(name), schedule_id)).data)

    @extend_schema(request=ChaosSchedulePatchInput, responses={200: ChaosScheduleOutput, **ERRORS},
                   description="Pause or resume a game day. Admin.")
    def patch(self, request, name: str, schedule_id: int):
        schedule = schedule_get(deployment_get(name), schedule_id)
        data = ChaosSchedulePatchInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(ChaosScheduleOutput(schedule_set_enabled(schedule=schedule, actor=request.user,
                                                            **data.validated_data)).data)

    @extend_schema(responses={204: None, **ERRORS},
                   description="Delete a game day; a run it started goes on. Admin.")
    def delete(self, request, name: str, schedule_id: int):
        schedule_delete(schedule=schedule_get(deployment_get(name), schedule_id), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
