"""Calls to Tandem's chaos API for the extension's activities. Each call has a timeout and a bounded number of
tries; a refusal (4xx) is permanent and raised at once as the activity's failure with Tandem's own message (a run
refused outside steady state says which check failed), while a connection error or a 5xx is tried again."""
from __future__ import annotations

import time
from urllib.parse import quote

import requests
from chaoslib.exceptions import ActivityFailed

TIMEOUT_S = 10.0
TRIES = 3
BACKOFF_S = 0.5


def _setting(configuration: dict | None, key: str) -> str:
    value = (configuration or {}).get(key)
    if not isinstance(value, str) or not value:
        raise ActivityFailed(f"the experiment's configuration needs {key}")
    return value


def chaos_url(configuration: dict | None, path: str) -> str:
    """The URL of `path` under the deployment's chaos API: configuration tandem_url and tandem_deployment."""
    base = _setting(configuration, "tandem_url").rstrip("/")
    deployment = quote(_setting(configuration, "tandem_deployment"), safe="")
    return f"{base}/api/v1/deployments/{deployment}/chaos/{path.lstrip('/')}"


def call(method: str, path: str, *, configuration: dict | None, secrets: dict | None, body: dict | None = None):
    """The JSON answer of one API call; ActivityFailed on a refusal, or after TRIES failed tries."""
    token = (secrets or {}).get("token")
    if not token:
        raise ActivityFailed("the tandem secrets need a token (an operator's API token; $TANDEM_TOKEN in an "
                             "experiment Tandem exported)")
    url = chaos_url(configuration, path)
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    last = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            response = requests.request(method, url, json=body, headers=headers, timeout=TIMEOUT_S)
        except requests.RequestException as error:
            last = f"{method} {url}: {error}"
            continue
        if response.status_code >= 500:
            last = f"{method} {url}: HTTP {response.status_code}"
            continue
        try:
            answer = response.json() if response.content else None
        except ValueError:
            raise ActivityFailed(f"{method} {url}: HTTP {response.status_code}, not JSON") from None
        if response.status_code >= 400:
            error = (answer or {}).get("error", {}) if isinstance(answer, dict) else {}
            raise ActivityFailed(f"{method} {url}: HTTP {response.status_code} "
                                 f"{error.get('code', '')}: {error.get('message', answer)}")
        return answer
    raise ActivityFailed(f"Tandem did not answer after {TRIES} tries: {last}")
