"""The secret a deployment's gateways and workers share, so that a worker serves only them (docs/gateway.md,
"Worker secrets").

A worker's request endpoints (/v1/generate, /v1/prefill, /v1/kv, /v1/stream/...) answer only requests that carry
its secret in SECRET_HEADER; /health, /metrics and /info stay open for probes and scrapes. Each revision has its own
secret, derived from the deployment's key: the node agent gives a worker its revision's secret (SECRET_ENV) and a
gateway the deployment's key (KEY_ENV), from which the gateway derives the secret of each revision group of its
membership. So during a rollout each worker gets the secret of its own revision, a worker's secret is worth nothing
once its revision's workers are gone, and the membership answer (which any viewer may read) carries no secret.

Both travel in the environment, never on a command line where `ps` shows them.
"""
from __future__ import annotations

import hashlib
import hmac

SECRET_HEADER = "X-Tandem-Worker-Secret"
SECRET_ENV = "TANDEM_WORKER_SECRET"  # a worker's: its revision's secret
KEY_ENV = "TANDEM_WORKER_KEY"        # a gateway's: the deployment's key


def revision_secret(deployment_key: str, revision: int | None) -> str:
    """The secret of a revision's workers. A group without a revision (a gateway given its workers' URLs on its
    command line) uses the key itself: whoever starts such workers gives them that value."""
    if revision is None:
        return deployment_key
    return hmac.new(deployment_key.encode(), f"revision {revision}".encode(), hashlib.sha256).hexdigest()


def secret_matches(expected: str, given: str | None) -> bool:
    """In constant time, so that timing tells nothing of how much of a guess was right."""
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
