"""The engines a worker may run, each behind one adapter: Tandem's own (`inference/engine/`, started as
`python -m inference.worker`) and vLLM (`inference/engines/vllm/`), which operators already run on their GPU fleets.

What an adapter owns, and nothing above it knows (docs/engines.md):
1. settings: which of a revision's engine settings mean something to it, checked when the revision is created, and
   its own extra arguments (vLLM: checked by vLLM's own argument parser);
2. launch: the command line and environment of a worker process;
3. readiness: how long a start may take before its /health answers (vLLM listens only once it has compiled);
4. metrics: its /metrics page turned into Tandem's series names, so that pages, alert rules, the autoscaler, canary
   analysis and chaos hypotheses read every engine alike;
5. request protocol: how the gateway sends a request and reads its tokens back (Tandem's NDJSON events; vLLM's
   OpenAI streaming, turned into the same events), including a request resumed on another worker with the tokens
   it already streamed;
6. drain: what SIGTERM does (Tandem: finish running streams within --drain-timeout; vLLM: --shutdown-timeout).

The engine is a revision's: `engine_settings.common.engine` (absent: tandem). Both stages of a disaggregated pair run
one engine, since KV caches do not cross engines.
"""
from __future__ import annotations

TANDEM = "tandem"
VLLM = "vllm"
ENGINES = (TANDEM, VLLM)
DEFAULT_ENGINE = TANDEM
# The engine setting that names it; common only.
ENGINE_SETTING = "engine"


def engine_of(engine_settings: dict | None) -> str:
    """The engine a revision's engine settings name ({"common": {"engine": ...}}; absent: Tandem's own)."""
    common = (engine_settings or {}).get("common") or {}
    return common.get(ENGINE_SETTING) or DEFAULT_ENGINE
