"""The chaos API's game days, under /api/v1/deployments/{name}/chaos: an experiment run at cron times inside a
window.

    GET, POST .../chaos/schedules                game days: list (viewer), create (admin)
    GET, PATCH, DELETE .../chaos/schedules/{id}  (PATCH: enabled; admin)
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.views.base import ADMINISTER, ERRORS, READ_ERRORS, ApiView, StrictSerializer
from controlplane.chaos.models import ChaosSchedule
from controlplane.chaos.schedules import next_times, schedule_create, schedule_delete, schedule_set_enabled
from controlplane.chaos.selectors import experiment_list, schedule_get, schedule_list
from controlplane.errors import invalid
from controlplane.selectors import deployment_get


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
