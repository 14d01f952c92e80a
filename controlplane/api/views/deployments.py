from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from controlplane.api.serializers import (ActionSerializer, DeploymentActionSerializer, DeploymentSerializer,
                                          RevisionActionSerializer, RevisionSerializer)
from controlplane.api.views.base import ERRORS, READ_ERRORS, ApiView, WriteInputSerializer, write_kwargs
from controlplane.models import DeploymentMode, Revision
from controlplane.selectors import deployment_get, deployment_list, revision_list
from controlplane.services import deployment_create, deployment_delete, revision_create
from controlplane.services.validation import DEFAULT_DTYPE, DTYPES


def _replica_map(help_text: str) -> serializers.DictField:
    return serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=1_000_000), required=False,
                                 allow_null=True, default=None, help_text=help_text)


class DeploymentCreateInput(WriteInputSerializer):
    name = serializers.CharField(max_length=63, help_text="Slug; also the OpenAI model name clients send.")
    mode = serializers.ChoiceField(choices=DeploymentMode.choices)
    model_path = serializers.CharField(
        max_length=1024,
        help_text="A Hugging Face model folder (with config.json) that exists on the web host; node agents must "
                  "see it at the same path (same host, or a shared mount). Relative paths are from the repository.")
    dtype = serializers.ChoiceField(
        choices=DTYPES, default=DEFAULT_DTYPE,
        help_text="auto (default): the model config's own dtype, resolved by each worker when it loads (float32 "
                  "where the config names none). float16 on a CPU without fast float16 is refused by the worker "
                  "unless engine_settings.allow_slow_float16 is true.")
    engine_settings = serializers.DictField(
        required=False, allow_null=True, default=None,
        help_text="device (cpu|cuda|cuda:N|auto), threads, kv_cache_bytes (or auto, the default), block_size, "
                  "max_num_seqs, max_num_batched_tokens, max_model_len, max_queue (integers > 0), kv_memory_fraction "
                  "(0-1, for kv_cache_bytes auto), allow_slow_float16 (boolean), quantization (none|int8: int8 "
                  "weights, about a quarter of the float32 weight memory, outputs not bit-identical).")
    replicas = _replica_map("Desired workers per role, e.g. {\"prefill\": 1, \"decode\": 2}; default 1 each.")
    min_replicas = _replica_map("Per role; default 1 (0 when 0 replicas are asked).")
    max_replicas = _replica_map("Per role; default 8.")
    gateway_port = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1024, max_value=65535,
        help_text=f"Default: the first port from TANDEM_GATEWAY_PORT ({settings.TANDEM_GATEWAY_PORT}) up that no "
                  "other deployment uses and is free on the web host.")
    placement = serializers.DictField(
        child=serializers.DictField(), required=False, allow_null=True, default=None,
        help_text="Per role: node_selector (labels), gpus_per_worker, threads_per_worker, allow_gpu_sharing, e.g. "
                  "{\"prefill\": {\"node_selector\": {\"class\": \"compute\"}}, \"decode\": "
                  "{\"node_selector\": {\"class\": \"bandwidth\"}, \"gpus_per_worker\": 1}}.")


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


class DeploymentDetailView(ApiView):
    @extend_schema(responses={200: DeploymentSerializer, **READ_ERRORS}, description="One deployment. Viewer.")
    def get(self, request, name: str):
        return Response(DeploymentSerializer(deployment_get(name)).data)

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
                                            help_text="Replaces the current settings as a whole when given.")
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
