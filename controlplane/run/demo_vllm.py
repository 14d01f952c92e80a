"""`make run` with TANDEM_DEMO_ENGINE=vllm: the demo model served by a vLLM worker too, as the deployment `demo-vllm`
(colocated, one worker, its gateway on TANDEM_GATEWAY_PORT + 1), beside the disaggregated `demo` of Tandem's own
workers, so that the pages, alert rules, scaling and rollouts can be tried on both engines side by side.

Eager (no torch.compile warm-up: ready in about a minute on 2 cores instead of two) and a 1 GiB KV cache, so that it
fits beside the demo's own workers; the worker takes ~1.5 GB of RAM more than the demo alone.
"""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

from controlplane.run.demo import DEMO_NODE_LABELS, DEMO_SAMPLING_DEFAULTS

VLLM_DEMO_NAME = "demo-vllm"
VLLM_DEMO_SETTINGS = {"common": {"engine": "vllm", "threads": 1, "compile": False, "kv_cache_bytes": 1 << 30,
                                 "max_num_seqs": 16, "max_model_len": 2048}}


def vllm_demo_gateway_port() -> int:
    return settings.TANDEM_GATEWAY_PORT + 1


def vllm_demo_ensure(model_path: Path) -> tuple[object, str]:
    """The `demo-vllm` deployment, created through the service when it does not exist; a changed demo model rolls
    it to a new revision. Returns (deployment, what was done)."""
    from controlplane.models import Deployment
    from controlplane.services.actions import Actor, enqueue_reconcile
    from controlplane.services.deployments import deployment_create
    from controlplane.services.revisions import revision_create

    actor = Actor.system("tandem_run")
    deployment = Deployment.objects.select_related("current_revision").filter(name=VLLM_DEMO_NAME).first()
    if deployment is None:
        action = deployment_create(
            name=VLLM_DEMO_NAME, mode="colocated", model_path=str(model_path), dtype="auto",
            comment="make run (TANDEM_DEMO_ENGINE=vllm): the demo model on a vLLM worker, eager",
            engine_settings=VLLM_DEMO_SETTINGS, sampling_defaults=DEMO_SAMPLING_DEFAULTS,
            replicas={"colocated": 1}, placement={"colocated": {"node_selector": dict(DEMO_NODE_LABELS)}},
            gateway_port=vllm_demo_gateway_port(), actor=actor, reason="make run: the vLLM demo deployment")
        return action.deployment, "created"
    current = deployment.current_revision
    if current is not None and Path(current.model_path).resolve() != model_path.resolve():
        revision_create(deployment=deployment, actor=actor, model_path=str(model_path),
                        comment=f"make run: TANDEM_DEMO_MODEL={settings.TANDEM_DEMO_MODEL}",
                        reason="the demo model changed")
        return deployment, f"new revision for model {model_path.name}"
    enqueue_reconcile(deployment.id)
    return deployment, "exists"
