from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import (ActionSerializer, DeploymentActionSerializer, DeploymentSerializer,
                                          RevisionActionSerializer, RevisionDiffSerializer, RevisionSerializer)
from controlplane.api.views.base import ERRORS, OPERATE, READ_ERRORS, ApiView, WriteInputSerializer, write_kwargs
from controlplane.errors import invalid, not_found
from controlplane.models import DeploymentMode, Revision
from controlplane.revision_diff import revision_diff
from controlplane.selectors import deployment_get, deployment_list, revision_get, revision_list
from controlplane.services import (deployment_create, deployment_delete, deployment_objectives_set,
                                   deployment_sampling_defaults_set, revision_create)
from controlplane.services.validation import DEFAULT_DTYPE, DTYPES


ENGINE_SETTINGS_HELP = (
    "{\"common\": {...}, \"prefill\": {...}, \"decode\": {...}} (or \"colocated\": {...}): a role's part overrides "
    "common for that role's workers; only the deployment's roles are allowed. A flat object is common. Keys: "
    "device (cpu|cuda|cuda:N|auto), threads, kv_cache_bytes (or auto, the default), block_size, max_num_seqs, "
    "max_num_batched_tokens, max_model_len, max_queue (integers > 0), kv_memory_fraction (0-1, for kv_cache_bytes "
    "auto), allow_slow_float16 (boolean), quantization (none|int8: int8 weights, about a quarter of the float32 "
    "weight memory, outputs not bit-identical), speculative (null or {\"method\": \"ngram\"|\"layers\", "
    "\"num_tokens\": k, ...}: speculative decoding on decode and colocated workers, refused in prefill); dtype in "
    "common only.")
SAMPLING_DEFAULTS_HELP = (
    "temperature (0-2), top_p (0-1], top_k (>= 0), max_tokens (>= 1), any of them: the gateway fills them into a "
    "request that leaves them out; a request's own values win. E.g. {\"temperature\": 0} for greedy answers.")


def _replica_map(help_text: str) -> serializers.DictField:
    return serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=1_000_000), required=False,
                                 allow_null=True, default=None, help_text=help_text)


def _objectives_field() -> serializers.DictField:
    # Checked by the service (validate_objectives), whose 400 names the objective: objectives.ttft_p99_seconds.
    return serializers.DictField(
        required=False, allow_null=True, default=None,
        help_text="P99 latency objectives in seconds: ttft_p99_seconds (prefill stage), itl_p99_seconds (decode "
                  "stage), e2e_p99_seconds (as clients see it). Defaults 10, 1 and 60, which a CPU demo meets. "
                  "The default alert rules of each stage take them as thresholds.")


class DeploymentCreateInput(WriteInputSerializer):
    name = serializers.CharField(max_length=63, help_text="Slug; also the OpenAI model name clients send.")
    mode = serializers.ChoiceField(choices=DeploymentMode.choices)
    model_path = serializers.CharField(
        max_length=1024,
        help_text="A Hugging Face model folder (with config.json) that exists on the web host; node agents must "
                  "see it at the same path (same host, or a shared mount). Relative paths are from the repository.")
    dtype = serializers.ChoiceField(
        choices=DTYPES, required=False, allow_null=True, default=None,
        help_text=f"{DEFAULT_DTYPE} (default): the model config's own dtype, resolved by each worker when it loads "
                  "(float32 where the config names none). float16 on a CPU without fast float16 is refused by the "
                  "worker unless engine_settings allow_slow_float16 is true. engine_settings.common.dtype says the "
                  "same; both given must agree.")
    engine_settings = serializers.DictField(required=False, allow_null=True, default=None,
                                            help_text=ENGINE_SETTINGS_HELP)
    sampling_defaults = serializers.DictField(required=False, allow_null=True, default=None,
                                              help_text=SAMPLING_DEFAULTS_HELP)
    replicas = _replica_map("Desired workers per role, e.g. {\"prefill\": 1, \"decode\": 2}; default 1 each.")
    min_replicas = _replica_map("Per role; default 1 (0 when 0 replicas are asked).")
    max_replicas = _replica_map("Per role; default 8.")
    gateway_port = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1024, max_value=65535,
        help_text=f"Default: the first port from TANDEM_GATEWAY_PORT ({settings.TANDEM_GATEWAY_PORT}) up that no "
                  "other deployment uses and is free on the web host.")
    placement = serializers.DictField(
        child=serializers.DictField(), required=False, allow_null=True, default=None,
        help_text="Per role: node_selector (labels), gpus_per_worker, threads_per_worker, allow_gpu_sharing, "
                  "routing_weights ([{\"selector\": {labels}, \"weight\": 3}]), e.g. "
                  "{\"prefill\": {\"node_selector\": {\"class\": \"compute\"}}, \"decode\": "
                  "{\"node_selector\": {\"class\": \"bandwidth\"}, \"gpus_per_worker\": 1}}.")
    objectives = _objectives_field()


class DeploymentListView(ApiView):
    @extend_schema(responses={200: DeploymentSerializer(many=True), **READ_ERRORS},
                   description="All deployments with their pools (desired, min, max, ready). Viewer.")
    def get(self, request):
        return Response(DeploymentSerializer(deployment_list(), many=True).data)

    @extend_schema(request=DeploymentCreateInput, responses={202: DeploymentActionSerializer, **ERRORS},
                   description="Create a deployment (revision 1, its pools, its gateway); reconcile starts the "
                               "workers. Answers 202 with the `create` action to poll. Admin.")
    def post(self, request):
        data = DeploymentCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        kwargs = write_kwargs(request, fields)
        fields.pop("reason", None)
        fields.pop("idempotency_key", None)
        action = deployment_create(**fields, **kwargs)
        deployment = deployment_list().filter(pk=action.deployment_id).first()
        return Response({"action": ActionSerializer(action).data,
                         "deployment": DeploymentSerializer(deployment).data if deployment else None},
                        status=status.HTTP_202_ACCEPTED)


class DeploymentPatchInput(WriteInputSerializer):
    sampling_defaults = serializers.DictField(required=False, allow_null=True, default=None,
                                              help_text="Replaces the current ones as a whole. "
                                              + SAMPLING_DEFAULTS_HELP)
    objectives = _objectives_field()


class DeploymentDetailView(ApiView):
    def get_permissions(self):
        # Sampling defaults and objectives are an operator's tuning; deleting the deployment stays an admin's.
        if self.request.method == "PATCH":
            return [OPERATE()]
        return super().get_permissions()

    @extend_schema(responses={200: DeploymentSerializer, **READ_ERRORS}, description="One deployment. Viewer.")
    def get(self, request, name: str):
        return Response(DeploymentSerializer(deployment_get(name)).data)

    @extend_schema(request=DeploymentPatchInput, responses={200: DeploymentActionSerializer, **ERRORS},
                   description="Change one deployment setting per request: `sampling_defaults` (replaced as a "
                               "whole; its gateway applies them from its next membership poll, without restarting "
                               "a worker; the `sampling` action) or `objectives` (some of the latency objectives, "
                               "the others keep their values; the default stage rules' thresholds follow; the "
                               "`objectives` action). 200 with the action. Operator.")
    def patch(self, request, name: str):
        deployment = deployment_get(name)
        data = DeploymentPatchInput(data=request.data)
        data.is_valid(raise_exception=True)
        sent = request.data if isinstance(request.data, dict) else {}
        given = [key for key in ("sampling_defaults", "objectives") if key in sent]
        if len(given) != 1:
            raise invalid("a PATCH changes exactly one setting: give sampling_defaults or objectives"
                          + (" (not both)" if given else ""), field="sampling_defaults" if not given else given[1])
        if given == ["objectives"]:
            action = deployment_objectives_set(deployment=deployment, objectives=data.validated_data["objectives"],
                                               **write_kwargs(request, data.validated_data))
        else:
            action = deployment_sampling_defaults_set(deployment=deployment,
                                                      sampling_defaults=data.validated_data["sampling_defaults"] or {},
                                                      **write_kwargs(request, data.validated_data))
        return Response({"action": ActionSerializer(action).data,
                         "deployment": DeploymentSerializer(deployment_get(name)).data})

    @extend_schema(request=WriteInputSerializer, responses={202: DeploymentActionSerializer, **ERRORS},
                   description="Delete a deployment: its pools go to 0, reconcile stops its workers and gateway, "
                               "then removes it; its actions stay in the audit log. 202 with the `delete` action. "
                               "Admin.")
    def delete(self, request, name: str):
        deployment = deployment_get(name)
        data = WriteInputSerializer(data=request.data if isinstance(request.data, dict) else {})
        data.is_valid(raise_exception=True)
        action = deployment_delete(deployment=deployment, **write_kwargs(request, data.validated_data))
        deployment = deployment_list().filter(pk=deployment.pk).first()
        return Response({"action": ActionSerializer(action).data,
                         "deployment": DeploymentSerializer(deployment).data if deployment else None},
                        status=status.HTTP_202_ACCEPTED)


class RevisionCreateInput(WriteInputSerializer):
    model_path = serializers.CharField(max_length=1024, required=False, default=None, allow_null=True)
    dtype = serializers.ChoiceField(choices=DTYPES, required=False, default=None, allow_null=True)
    engine_settings = serializers.DictField(required=False, allow_null=True, default=None,
                                            help_text="Replaces the current settings as a whole when given. "
                                                      + ENGINE_SETTINGS_HELP)
    comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class RevisionListView(ApiView):
    @extend_schema(responses={200: RevisionSerializer(many=True), **READ_ERRORS},
                   description="The deployment's revisions, newest first. Viewer.")
    def get(self, request, name: str):
        deployment = deployment_get(name)
        context = {"current_revision_id": deployment.current_revision_id}
        return Response(RevisionSerializer(revision_list(deployment), many=True, context=context).data)

    @extend_schema(request=RevisionCreateInput, responses={202: RevisionActionSerializer, **ERRORS},
                   description="Create the next revision (fields not given are copied from the current one); it "
                               "becomes current and reconcile replaces the workers of both pools by a rolling "
                               "replacement. 409 while another rollout runs. Admin.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = RevisionCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        kwargs = write_kwargs(request, fields)
        action = revision_create(deployment=deployment, model_path=fields["model_path"], dtype=fields["dtype"],
                                 engine_settings=fields["engine_settings"], comment=fields["comment"], **kwargs)
        revision = Revision.objects.filter(deployment_id=action.deployment_id,
                                           number=action.params.get("revision")).first()
        context = {"current_revision_id": deployment_get(name).current_revision_id}
        return Response({"action": ActionSerializer(action).data,
                         "revision": RevisionSerializer(revision, context=context).data if revision else None},
                        status=status.HTTP_202_ACCEPTED)


class RevisionDiffView(ApiView):
    @extend_schema(
        parameters=[OpenApiParameter("from", int, description="default: the revision before `to`"),
                    OpenApiParameter("to", int, description="default: the current revision")],
        responses={200: RevisionDiffSerializer, **ERRORS},
        description="What changed from one revision to another: model_path, dtype and each engine setting by part "
                    "(`common.threads`, `decode.max_num_seqs`), each with before, after, kind (added, removed, "
                    "changed) and a line of text (`decode.max_num_seqs: 64 → 256`). Viewer.")
    def get(self, request, name: str):
        deployment = deployment_get(name)
        to_number = _revision_number(request.query_params.get("to"), "to")
        if to_number is None:
            to_number = deployment.current_revision.number if deployment.current_revision else None
        after = revision_get(deployment, to_number) if to_number is not None else None
        if after is None:
            raise not_found(f"deployment {name!r} has no revision {to_number}")
        from_number = _revision_number(request.query_params.get("from"), "from")
        if from_number is None:
            before = deployment.revisions.filter(number__lt=after.number).order_by("-number").first()
            if before is None:
                raise invalid(f"revision {after.number} is the first of {name!r}: give `from` to compare",
                              field="from")
        else:
            before = revision_get(deployment, from_number)
            if before is None:
                raise not_found(f"deployment {name!r} has no revision {from_number}")
        return Response({"from": before.number, "to": after.number,
                         "changes": [change.as_dict() for change in revision_diff(before, after)]})


def _revision_number(raw: str | None, param: str) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise invalid(f"{param} must be a revision number, not {raw!r}", field=param)
    return int(raw)
