"""A deployment's worker key (inference.worker_secret), as the node agents and the control plane compute it.

Derived from SECRET_KEY and the deployment's id and name rather than stored: every node agent and the profile run's
load driver compute the same key without a table of secrets to guard, a deployment deleted and created again under
its name gets a new one, and it changes with SECRET_KEY (workers started before such a change keep the old secret
until they are replaced). Each revision's workers get the secret derived from it (`revision_secret`).
"""
from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from inference.worker_secret import revision_secret


def deployment_worker_key(deployment) -> str:
    message = f"tandem worker key {deployment.pk} {deployment.name}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def scrape_token() -> str:
    """The token the gateways ask of whoever reads their /metrics and the fleet in their /health
    (inference/gateway/operator_views.py): the control plane's scraper, and Prometheus (GET
    /api/v1/prometheus/scrape-token). One for the whole fleet, derived like the worker keys."""
    return hmac.new(settings.SECRET_KEY.encode(), b"tandem scrape token", hashlib.sha256).hexdigest()


def scrape_headers() -> dict[str, str]:
    """What a request to a gateway's operator routes carries."""
    return {"Authorization": f"Bearer {scrape_token()}"}


def worker_secret_for(deployment, revision_number: int) -> str:
    """The secret the workers of one revision of `deployment` hold."""
    return revision_secret(deployment_worker_key(deployment), revision_number)
