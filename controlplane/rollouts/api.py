"""The rollouts API: POST/GET /api/v1/deployments/{name}/rollouts, GET .../rollouts/{id}, POST
.../rollouts/{id}/promote|abort|pause|resume, GET .../rollouts/{id}/report and report.csv. Operators start and act;
viewers read; a rollout that creates its revision (an object in `revision`) needs an admin, as POST .../revisions/
does."""
from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer, write_kwargs
from controlplane.rollouts.models import Rollout, Strategy
from controlplane.rollouts.report import rollout_report, rollout_report_csv
from controlplane.rollouts.selectors import rollout_get, rollout_list
from controlplane.rollouts.services import (rollout_abort, rollout_pause, rollout_promote, rollout_resume,
                                            rollout_start)
from controlplane.auth import Role, has_role
from controlplane.errors import ControlPlaneError, invalid
from controlplane.selectors import deployment_get
from controlplane.services import deployment_rollback, revision_create


class AnalysisRunOutput(serializers.Serializer):
    step = serializers.SerializerMethodField()
    verdict = serializers.CharField()
    started_at = serializers.DateTimeField()
    evaluated_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    metrics = serializers.JSONField(help_text="variant → numbers over the window (requests, errors, P99s, ...)")
    failures = serializers.JSONField()
    significance = serializers.JSONField()

    def get_step(self, run) -> int:
        return run.step_index + 1


class RolloutOutput(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    revision = serializers.IntegerField(source="revision.number")
    stable_revision = serializers.IntegerField(source="stable_revision.number")
    step = serializers.SerializerMethodField(help_text="1-based number of the step in progress (null once done)")
    weight = serializers.IntegerField(help_text="the tried revision's share of traffic now (percent)")
    step_elapsed_s = serializers.SerializerMethodField()
    variants = serializers.ListField(child=serializers.CharField(), help_text="(stable's, the tried revision's)")
    analysis_runs = AnalysisRunOutput(many=True)
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = Rollout
        fields = ["id", "deployment", "strategy", "status", "revision", "stable_revision", "variants", "steps",
                  "step", "weight", "step_started_at", "step_elapsed_s", "ends_at", "analysis", "analysis_runs",
                  "reason", "created_at", "finished_at", "created_by"]

    def get_step(self, rollout) -> int | None:
        return rollout.step_index + 1 if rollout.current_step is not None else None

    def get_step_elapsed_s(self, rollout) -> float:
        return round(rollout.step_elapsed(), 3)


class RolloutStartInput(WriteInputSerializer):
    revision = serializers.JSONField(help_text="An existing revision number other than the current one, or an "
                                               "object of new revision fields (model_path, dtype, "
                                               "engine_settings, comment; the rest copied from the current one).")
    strategy = serializers.CharField(required=False, default=Strategy.ROLLING, help_text=(
        "rolling (default: the revision replaces both pools at once, as POST .../revisions/ or .../rollback do; "
        "202 with the action), canary or ab (201 with the rollout)"))
    steps = serializers.JSONField(required=False, default=None, help_text=(
        "Canary: [{\"weight\": 10, \"duration_s\": 60, \"analysis\": true}, ...]; the last step's end promotes. "
        "Default: 10% for 300 s, then 50% for 600 s, both analysed."))
    analysis = serializers.JSONField(required=False, default=None, help_text=(
        "min_requests (20), max_latency_ratio (1.2: canary P99 TTFT, ITL and end-to-end at most 1.2x stable's), "
        "max_error_ratio_increase (0.005: error and 5xx ratios at most stable's + 0.5 points), interval_s (5), "
        "max_wait_s (3600: a step still short of min_requests this long after its end aborts; 0 waits for ever)."))
    split = serializers.JSONField(required=False, default=None, help_text="A/B: B's share in percent (default 50).")
    duration_s = serializers.JSONField(required=False, default=None, help_text="A/B: how long the experiment runs.")


class RollingOutput(serializers.Serializer):
    strategy = serializers.CharField()
    action = ActionSerializer()


class RolloutListView(ApiView):
    write_permission = OPERATE

    @extend_schema(responses={200: RolloutOutput(many=True), **READ_ERRORS},
                   description="The deployment's rollouts, newest first. Viewer.")
    def get(self, request, name: str):
        deployment = deployment_get(name)
        rollouts = rollout_list(deployment).prefetch_related("analysis_runs")[:100]
        return Response(RolloutOutput(rollouts, many=True).data)

    @extend_schema(request=RolloutStartInput, responses={201: RolloutOutput, 202: RollingOutput, **ERRORS},
                   description="Start a canary or A/B rollout of a revision beside the current one (201), or a "
                               "rolling replacement (the default strategy; 202 with its action). 400 naming the "
                               "bad field; 409 while another rollout (or a rolling replacement) runs. The same "
                               "idempotency key returns the same rollout. Operator.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = RolloutStartInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if isinstance(values["revision"], dict) and not has_role(request.user, Role.ADMIN):
            # As POST .../revisions/: a new revision names a model folder on the hosts, which admins choose.
            raise ControlPlaneError("a new revision (an object in `revision`) needs the admin role; operators "
                                    "roll out an existing revision by its number", status=403,
                                    extra={"field": "revision"})
        if values["strategy"] == Strategy.ROLLING:
            return _rolling(request, deployment, values)
        rollout = rollout_start(deployment=deployment, revision=values["revision"], strategy=values["strategy"],
                                steps=values["steps"], analysis=values["analysis"], split=values["split"],
                                duration_s=values["duration_s"], **write_kwargs(request, values))
        return Response(RolloutOutput(rollout_get(deployment, rollout.pk)).data, status=status.HTTP_201_CREATED)


_NOT_ROLLING = ("steps", "analysis", "split", "duration_s")


def _rolling(request, deployment, values: dict) -> Response:
    """strategy rolling: today's replacement of both pools, by the same services as POST .../revisions/ (a new
    revision) and POST .../rollback (an existing one)."""
    for field in _NOT_ROLLING:
        if values[field] is not None:
            raise invalid(f"{field} is for canary or ab rollouts; a rolling one replaces both pools at once",
                          field=field)
    revision, kwargs = values["revision"], write_kwargs(request, values)
    if isinstance(revision, dict):
        unknown = sorted(set(revision) - {"model_path", "dtype", "engine_settings", "comment"})
        if unknown:
            raise invalid(f"revision.{unknown[0]} is not a revision field", field=f"revision.{unknown[0]}")
        action = revision_create(deployment=deployment, **revision, **kwargs)
    elif isinstance(revision, int) and not isinstance(revision, bool):
        action = deployment_rollback(deployment=deployment, revision_number=revision, **kwargs)
    else:
        raise invalid(f"revision must be a revision number or an object of new revision fields, not {revision!r}",
                      field="revision")
    return Response({"strategy": Strategy.ROLLING, "action": ActionSerializer(action).data},
                    status=status.HTTP_202_ACCEPTED)


class RolloutDetailView(ApiView):
    @extend_schema(responses={200: RolloutOutput, **READ_ERRORS}, description="One rollout. Viewer.")
    def get(self, request, name: str, rollout_id: int):
        return Response(RolloutOutput(rollout_get(deployment_get(name), rollout_id)).data)


class RolloutActionOutput(serializers.Serializer):
    action = ActionSerializer()
    rollout = RolloutOutput()


def _verb_view(service, verb: str, description: str):
    class View(ApiView):
        write_permission = OPERATE

        @extend_schema(request=WriteInputSerializer, responses={202: RolloutActionOutput, **ERRORS},
                       description=description, operation_id=f"rollout_{verb}")
        def post(self, request, name: str, rollout_id: int):
            deployment = deployment_get(name)
            rollout = rollout_get(deployment, rollout_id)
            data = WriteInputSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            action = service(rollout=rollout, **write_kwargs(request, data.validated_data))
            return Response({"action": ActionSerializer(action).data,
                             "rollout": RolloutOutput(rollout_get(deployment, rollout_id)).data},
                            status=status.HTTP_202_ACCEPTED)

    View.__name__ = f"Rollout{verb.title()}View"
    return View


RolloutPromoteView = _verb_view(rollout_promote, "promote", "Make the rollout's revision current now; the old "
                                "workers drain once its pools are full. 409 unless running or paused. Operator.")
RolloutAbortView = _verb_view(rollout_abort, "abort", "Send all traffic back to stable at the next membership "
                              "poll; the rollout's workers drain; channels are notified. Operator.")
RolloutPauseView = _verb_view(rollout_pause, "pause", "Stop the step's timer; the split stays. Operator.")
RolloutResumeView = _verb_view(rollout_resume, "resume", "Continue the step's timer. Operator.")


class RolloutReportView(ApiView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The numbers per variant of each analysis run (an A/B experiment's report: counts, "
                               "P99s, error ratios, tokens per request and a significance note). Viewer.")
    def get(self, request, name: str, rollout_id: int):
        return Response(rollout_report(rollout_get(deployment_get(name), rollout_id)))


class RolloutReportCsvView(ApiView):
    @extend_schema(responses={(200, "text/csv"): str, **READ_ERRORS},
                   description="The report as CSV: one row per analysis run and variant. Viewer.")
    def get(self, request, name: str, rollout_id: int):
        rollout = rollout_get(deployment_get(name), rollout_id)
        response = HttpResponse(rollout_report_csv(rollout), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{name}-rollout-{rollout.pk}.csv"'
        return response
