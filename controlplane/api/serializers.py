"""Output serializers (what the API returns). Input serializers live next to their views."""
from __future__ import annotations

from rest_framework import serializers

from controlplane.models import Action, Deployment, Node, Pool, Revision, Worker


class ErrorBodySerializer(serializers.Serializer):
    message = serializers.CharField()
    code = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


class NodeSerializer(serializers.ModelSerializer):
    num_gpus = serializers.IntegerField(read_only=True)
    online = serializers.SerializerMethodField()
    all_labels = serializers.DictField(child=serializers.CharField(), read_only=True,
                                       help_text="detected_labels overlaid with labels: what pools select on")

    class Meta:
        model = Node
        fields = ["name", "queue", "hostname", "address", "gpus", "num_gpus", "labels", "detected_labels",
                  "all_labels", "roofline", "engines", "online", "last_seen_at", "created_at"]
        read_only_fields = ["roofline", "engines"]

    def get_online(self, node: Node) -> bool:
        return node.is_online()


class PoolSerializer(serializers.ModelSerializer):
    ready_replicas = serializers.SerializerMethodField()
    status = serializers.CharField(read_only=True, help_text="ok, or unschedulable (unschedulable_reason says why)")

    class Meta:
        model = Pool
        fields = ["role", "desired_replicas", "min_replicas", "max_replicas", "ready_replicas", "status",
                  "unschedulable_reason", "node_selector", "gpus_per_worker", "threads_per_worker",
                  "allow_gpu_sharing", "routing_weights"]

    def get_ready_replicas(self, pool: Pool) -> int:
        num_ready = getattr(pool, "num_ready", None)
        if num_ready is None:
            num_ready = pool.workers.filter(status="ready").count()
        return num_ready


class DeploymentSerializer(serializers.ModelSerializer):
    current_revision = serializers.IntegerField(source="current_revision.number", allow_null=True, default=None)
    gateway_node = serializers.CharField(source="gateway_node.name", allow_null=True, default=None)
    gateway_url = serializers.SerializerMethodField()
    shared_gateway = serializers.CharField(source="shared_gateway.name", allow_null=True, default=None)
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    pools = PoolSerializer(many=True, read_only=True)
    deleting = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = ["name", "mode", "current_revision", "gateway_port", "gateway_url", "gateway_node", "shared_gateway",
                  "pools",
                  "autoscale_enabled", "sampling_defaults", "objectives", "deleting", "created_at", "created_by"]

    def get_gateway_url(self, deployment: Deployment) -> str | None:
        """The base URL that serves the deployment: its shared gateway's, else its own gateway's."""
        if deployment.shared_gateway is not None:
            return deployment.shared_gateway.url
        if deployment.gateway_port is None:
            return None
        node = deployment.gateway_node
        host = (node.hostname if node is not None and node.hostname else "127.0.0.1")
        return f"http://{host}:{deployment.gateway_port}"

    def get_deleting(self, deployment: Deployment) -> bool:
        deleting = getattr(deployment, "is_deleting", None)
        if deleting is None:
            from controlplane.selectors import deployment_delete_pending

            deleting = deployment_delete_pending(deployment) is not None
        return deleting


class RevisionSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    is_current = serializers.SerializerMethodField()

    class Meta:
        model = Revision
        # model_checksum: of the files its first worker loaded ("" until then; docs/operating.md).
        fields = ["number", "model_path", "dtype", "engine_settings", "comment", "is_current", "created_at",
                  "created_by", "model_checksum"]
        read_only_fields = ["model_checksum"]

    def get_is_current(self, revision: Revision) -> bool:
        current_id = self.context.get("current_revision_id")
        if current_id is None:
            current_id = revision.deployment.current_revision_id
        return revision.pk == current_id


class RevisionChangeSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="model_path, dtype or <part>.<key>, the part common or a role")
    before = serializers.CharField(help_text="\"\" when not set")
    after = serializers.CharField(help_text="\"\" when not set")
    kind = serializers.ChoiceField(choices=["added", "removed", "changed"])
    text = serializers.CharField()


# "from" is a Python keyword, so the class is built from a dict of its fields.
RevisionDiffSerializer = type("RevisionDiffSerializer", (serializers.Serializer,), {
    "from": serializers.IntegerField(), "to": serializers.IntegerField(),
    "changes": RevisionChangeSerializer(many=True)})


class WorkerSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name", allow_null=True, default=None)
    shared_gateway = serializers.CharField(source="shared_gateway.name", allow_null=True, default=None,
                                           help_text="a shared gateway's process: the gateway (deployment is null)")
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    revision = serializers.IntegerField(source="revision.number", allow_null=True, default=None)
    url = serializers.CharField(allow_null=True, read_only=True)

    class Meta:
        model = Worker
        fields = ["id", "deployment", "shared_gateway", "role", "purpose", "status", "pid", "host", "port", "url", "node", "gpu_index",
                  "revision", "dtype", "quantization", "weight_bytes", "restart_count", "last_error", "log_path", "created_at", "started_at",
                  "ready_at", "stopped_at", "last_health_at"]


class ActionSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment_name")
    worker = serializers.IntegerField(source="worker_id", allow_null=True)
    idempotency_key = serializers.SerializerMethodField()

    def get_idempotency_key(self, action) -> str | None:
        from controlplane.services.actions import shown_idempotency_key

        return shown_idempotency_key(action.idempotency_key)

    class Meta:
        model = Action
        fields = ["id", "kind", "status", "deployment", "worker", "actor_type", "actor", "reason", "params",
                  "error", "result", "idempotency_key", "created_at", "started_at", "finished_at"]


class DeploymentActionSerializer(serializers.Serializer):
    action = ActionSerializer()
    deployment = DeploymentSerializer(allow_null=True)


class RevisionActionSerializer(serializers.Serializer):
    action = ActionSerializer()
    revision = RevisionSerializer(allow_null=True)


class WorkerActionSerializer(serializers.Serializer):
    action = ActionSerializer()
    worker = WorkerSerializer(allow_null=True)


class EndpointGroupSerializer(serializers.Serializer):
    revision = serializers.IntegerField(allow_null=True)
    prefill = serializers.ListField(child=serializers.URLField())
    decode = serializers.ListField(child=serializers.URLField())
    colocated = serializers.ListField(child=serializers.URLField())
    weights = serializers.DictField(child=serializers.FloatField(), help_text="worker URL → routing weight")
    traffic_weight = serializers.IntegerField(
        required=False, min_value=0, max_value=100,
        help_text="only while a canary or A/B rollout concerns the groups: this group's share of requests (percent)")
    variant = serializers.CharField(required=False, help_text="stable, canary, a or b (with traffic_weight)")


class SamplingDefaultsSerializer(serializers.Serializer):
    temperature = serializers.FloatField(required=False)
    top_p = serializers.FloatField(required=False)
    top_k = serializers.IntegerField(required=False)
    max_tokens = serializers.IntegerField(required=False)


class EndpointsSerializer(serializers.Serializer):
    deployment = serializers.CharField()
    model = serializers.CharField()
    mode = serializers.CharField()
    groups = EndpointGroupSerializer(many=True)
    sampling_defaults = SamplingDefaultsSerializer(help_text="what the gateway fills into a request that leaves a "
                                                             "field out")


class SharedGatewaySerializer(serializers.Serializer):
    name = serializers.CharField()
    port = serializers.IntegerField()
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    url = serializers.CharField(help_text="the base URL clients send every attached deployment's requests to")
    deployments = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_deployments(self, gateway) -> list[str]:
        return sorted(gateway.deployments.values_list("name", flat=True))
