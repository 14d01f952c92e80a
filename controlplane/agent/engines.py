"""The node agent looks for the engines other than Tandem's own that its host can run (today vLLM, in the
environment TANDEM_VLLM_PYTHON names) and reports what it found on its Node: the version, or why there is none.

The look is a child process that imports vLLM (a few seconds), run in the background at the agent's start so that
the start is not held up; until it is done the node shows no `engine.vllm` label.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings

from controlplane.agent.host import in_background
from controlplane.models import Node
from controlplane.services.nodes import node_engines_set
from inference.engines import VLLM
from inference.engines.vllm import environment as vllm_environment

log = logging.getLogger(__name__)


def engines_probe(*, node_name: str) -> dict:
    """What this host has of each other engine, stored on the node; {} for a node that is gone."""
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return {}
    found = vllm_environment.probe(settings.TANDEM_VLLM_PYTHON)
    engines = {VLLM: found.as_dict()}
    node_engines_set(node=node, engines=engines)
    if found.version:
        log.info("node %s: vLLM %s at %s", node_name, found.version, found.python)
    else:
        log.info("node %s: no vLLM workers on this host: %s", node_name, found.error)
    return engines


def engines_probe_in_background(*, node_name: str) -> threading.Thread:
    return in_background(f"engines-{node_name}", lambda: engines_probe(node_name=node_name),
                         failed=f"looking for other engines on node {node_name} failed")
