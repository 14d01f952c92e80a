"""REST API of the capacity app: profiles and profile jobs, the planner and its apply, pool schedules and
predictive floors. Thin views: validate, call a service, serialize."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from controlplane.api.views.base import ADMINISTER, ERRORS, OPERATE, READ, READ_ERRORS, ApiView, id_or_404
from controlplane.capacity.models import Profile, ProfileJob
from controlplane.capacity.selectors import (pool_get, predictive_rows, profile_job_get, profile_job_list, profile_list,
                                             schedule_get, schedule_rows, traffic_from_metrics)
from controlplane.capacity.services.plans import plan_apply, plan_compute
from controlplane.capacity.services.profile_jobs import profile_job_create
from controlplane.capacity.services.schedules import (predictive_set, schedule_create, schedule_delete,
                                                      schedule_update)
from controlplane.capacity.sizing.search import Objectives, Prices
from controlplane.capacity.sizing.simulation import Traffic
from controlplane.errors import invalid
from controlplane.selectors import deployment_get


class StrictSerializer(serializers.Serializer):
    """An unknown field is a 400 naming it."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: [f"unknown field; known: {', '.join(sorted(self.fields))}"]
                                                   for name in unknown})
        return super().to_internal_value(data)


def profile_data(profile: Profile) -> dict:
    return {"id": profile.pk, "revision": profile.revision.number, "node_class": profile.node_class,
            "role": profile.role, "points": profile.points, "fits": profile.fits,
            "kv_bytes_per_token": profile.kv_bytes_per_token, "max_num_seqs": profile.max_num_seqs,
            "max_batch_tokens": profile.max_batch_tokens, "kv_capacity_tokens": profile.kv_capacity_tokens,
            "updated_at": profile.updated_at}


def job_data(job: ProfileJob) -> dict:
    return {"id": job.pk, "deployment": job.deployment.name, "revision": job.revision.number,
            "node_class": job.node_class, "quick": job.quick, "status": job.status, "progress": job.progress,
            "step": job.step, "error": job.error, "profiles": job.profiles, "created_at": job.created_at,
            "started_at": job.started_at, "finished_at": job.finished_at}


class ProfileInput(StrictSerializer):
    quick = serializers.BooleanField(required=False, default=False)
    node_class = serializers.SlugField(required=False, max_length=63)
    allow_shared_host = serializers.BooleanField(required=False, default=False)


class ProfilesView(ApiView):
    """GET (viewer): the current revision's profiles and the deployment's recent profile jobs.
    POST (admin): queue a profile run of the current revision (a Celery task); 202 with the job to poll."""

    write_permission = ADMINISTER

    @extend_schema(responses={200: dict, **READ_ERRORS})
    def get(self, request, name: str):
        deployment = deployment_get(name)
        return Response({"deployment": deployment.name,
                         "profiles": [profile_data(p) for p in profile_list(deployment)],
                         "jobs": [job_data(j) for j in profile_job_list(deployment, limit=10)]})

    @extend_schema(request=ProfileInput, responses={202: dict, **ERRORS},
                   description="Profile the current revision on separate workers (never the serving ones). Admin.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = ProfileInput(data=request.data)
        data.is_valid(raise_exception=True)
        job = profile_job_create(deployment=deployment, actor_user=request.user, **data.validated_data)
        return Response(job_data(job), status=202)


class ProfileJobView(ApiView):
    @extend_schema(responses={200: dict, **READ_ERRORS})
    def get(self, request, job_id: int):
        return Response(job_data(profile_job_get(id_or_404(job_id, "profile job"))))


class PlanInput(StrictSerializer):
    class TrafficInput(StrictSerializer):
        hours = serializers.FloatField(required=False, min_value=0.01, max_value=168)
        requests_per_s = serializers.FloatField(required=False, min_value=0.0001, max_value=100_000)
        prompt_tokens_mean = serializers.FloatField(required=False, min_value=1, max_value=1_000_000)
        output_tokens_mean = serializers.FloatField(required=False, min_value=1, max_value=1_000_000)
        prompt_tokens_cv = serializers.FloatField(required=False, min_value=0, max_value=4, default=0.5)
        output_tokens_cv = serializers.FloatField(required=False, min_value=0, max_value=4, default=0.5)

    class ObjectivesInput(StrictSerializer):
        ttft_p99_s = serializers.FloatField(min_value=0.0001, max_value=3600)
        itl_p99_s = serializers.FloatField(min_value=0.0001, max_value=3600)

    class PricesInput(StrictSerializer):
        prefill = serializers.FloatField(required=False, min_value=0, default=1.0)
        decode = serializers.FloatField(required=False, min_value=0, default=1.0)
        colocated = serializers.FloatField(required=False, min_value=0, default=1.0)

    class WhatIfInput(StrictSerializer):
        traffic = serializers.FloatField(required=False, min_value=0.01, max_value=100, default=1.0)
        prompt_length = serializers.FloatField(required=False, min_value=0.01, max_value=100, default=1.0)
        output_length = serializers.FloatField(required=False, min_value=0.01, max_value=100, default=1.0)

    deployment = serializers.CharField(max_length=63)
    node_class = serializers.CharField(required=False, max_length=63)
    traffic = TrafficInput()
    objectives = ObjectivesInput()
    prices = PricesInput(required=False)
    what_if = WhatIfInput(required=False)


def _traffic(deployment, data: dict) -> Traffic:
    """By hand (requests_per_s and both means) or from the last `hours` of scraped series; not both."""
    by_hand = [f for f in ("requests_per_s", "prompt_tokens_mean", "output_tokens_mean") if f in data]
    if "hours" in data:
        if by_hand:
            raise invalid(f"give traffic.hours or a traffic profile by hand, not both ({by_hand[0]} too)",
                          field=f"traffic.{by_hand[0]}")
        return traffic_from_metrics(deployment=deployment, hours=data["hours"])
    for field in ("requests_per_s", "prompt_tokens_mean", "output_tokens_mean"):
        if field not in data:
            raise invalid(f"traffic.{field} is required (or traffic.hours to take it from the scraped series)",
                          field=f"traffic.{field}")
    return Traffic(data["requests_per_s"], data["prompt_tokens_mean"], data["output_tokens_mean"],
                   data["prompt_tokens_cv"], data["output_tokens_cv"])


class PlanView(ApiView):
    """POST /api/v1/capacity/plan (viewer: computing changes nothing)."""

    write_permission = READ

    @extend_schema(request=PlanInput, responses={200: dict, **ERRORS},
                   description="Replicas per pool, predicted P99s, utilisation, headroom and cost for the "
                               "disaggregated and colocated layouts, from the deployment's profiles. Viewer.")
    def post(self, request):
        data = PlanInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        deployment = deployment_get(values["deployment"])
        traffic = _traffic(deployment, values["traffic"])
        result = plan_compute(deployment=deployment, traffic=traffic,
                              objectives=Objectives(**values["objectives"]),
                              prices=Prices(**values.get("prices", {})), what_if=values.get("what_if"),
                              node_class=values.get("node_class"))
        return Response(result)


class ApplyInput(StrictSerializer):
    deployment = serializers.CharField(max_length=63)
    replicas = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=10_000), allow_empty=False)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class PlanApplyView(ApiView):
    """POST /api/v1/capacity/plan/apply (operator): one audited scale action per pool."""

    write_permission = OPERATE

    @extend_schema(request=ApplyInput, responses={200: dict, **ERRORS})
    def post(self, request):
        data = ApplyInput(data=request.data)
        data.is_valid(raise_exception=True)
        deployment = deployment_get(data.validated_data["deployment"])
        actions = plan_apply(deployment=deployment, replicas=data.validated_data["replicas"], actor=request.user,
                             reason=data.validated_data["reason"])
        return Response({"deployment": deployment.name,
                         "actions": [{"id": a.pk, "role": a.params["role"], "from": a.params["from"],
                                      "to": a.params["to"]} for a in actions]})


class ScheduleInput(StrictSerializer):
    role = serializers.CharField(required=False, max_length=20)
    name = serializers.CharField(required=False, max_length=100)
    cron = serializers.CharField(required=False, max_length=100)
    duration_minutes = serializers.IntegerField(required=False)
    timezone = serializers.CharField(required=False, max_length=64)
    min_replicas = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    max_replicas = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    enabled = serializers.BooleanField(required=False)


class SchedulesView(ApiView):
    """GET (viewer) / POST (operator) /api/v1/deployments/{name}/schedules: windows that set a pool's floor and
    ceiling for the autoscaler."""

    write_permission = OPERATE

    @extend_schema(responses={200: dict, **READ_ERRORS})
    def get(self, request, name: str):
        deployment = deployment_get(name)
        return Response({"deployment": deployment.name,
                         "schedules": schedule_rows(deployment.pools.order_by("role"))})

    @extend_schema(request=ScheduleInput, responses={201: dict, **ERRORS})
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = ScheduleInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        pool = pool_get(deployment, values.pop("role", None))
        schedule = schedule_create(pool=pool, actor=request.user, **values)
        return Response(next(r for r in schedule_rows([pool]) if r["id"] == schedule.pk), status=201)


class ScheduleDetailView(ApiView):
    write_permission = OPERATE

    @extend_schema(request=ScheduleInput, responses={200: dict, **ERRORS})
    def patch(self, request, name: str, schedule_id: int):
        deployment = deployment_get(name)
        schedule = schedule_get(deployment=deployment, schedule_id=id_or_404(schedule_id, "schedule"))
        data = ScheduleInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        if "role" in values and values.pop("role") != schedule.pool.role:
            raise invalid("a schedule's role cannot change; delete it and create one on the other pool", field="role")
        schedule = schedule_update(schedule=schedule, actor=request.user, **values)
        return Response(next(r for r in schedule_rows([schedule.pool]) if r["id"] == schedule.pk))

    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request, name: str, schedule_id: int):
        deployment = deployment_get(name)
        schedule_delete(schedule=schedule_get(deployment=deployment, schedule_id=id_or_404(schedule_id, "schedule")),
                        actor=request.user)
        return Response(status=204)


class PredictiveInput(StrictSerializer):
    role = serializers.CharField(max_length=20)
    enabled = serializers.BooleanField(required=False)
    lead_time_s = serializers.IntegerField(required=False)
    history_days = serializers.IntegerField(required=False)
    requests_per_replica = serializers.FloatField(required=False)


class PredictiveView(ApiView):
    """GET (viewer) / PUT (operator) /api/v1/deployments/{name}/predictive: per pool, {role, enabled,
    lead_time_s, history_days, requests_per_replica}."""

    write_permission = OPERATE

    @extend_schema(responses={200: dict, **READ_ERRORS})
    def get(self, request, name: str):
        deployment = deployment_get(name)
        return Response({"deployment": deployment.name, "pools": predictive_rows(deployment)})

    @extend_schema(request=PredictiveInput, responses={200: dict, **ERRORS})
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = PredictiveInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        predictive_set(pool=pool_get(deployment, values.pop("role")), actor=request.user, **values)
        return Response({"deployment": deployment.name, "pools": predictive_rows(deployment)})
