"""bench/fleet/sim_fleet.py's hands on the fleet: the control plane's REST API with an admin token, and waiting for
what it reports (deployments created, pools scaled, workers ready)."""
from __future__ import annotations

import time

from bench.lib.fleet_stack import free_port


class Api:
    def __init__(self, base: str, token: str):
        import requests

        self.base, self.session = base, requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def __call__(self, method: str, path: str, **kwargs):
        kwargs.setdefault("timeout", 60)
        return self.session.request(method, f"{self.base}/api/v1/{path}", **kwargs)

    def ok(self, method: str, path: str, **kwargs) -> dict | list:
        r = self(method, path, **kwargs)
        if r.status_code >= 300:
            raise SystemExit(f"{method} {path} answered {r.status_code}: {r.text[:500]}")
        return r.json()


def wait(what: str, predicate, timeout: float, interval: float = 1.0, poll=None):
    deadline = time.monotonic() + timeout
    while True:
        if poll is not None:
            poll()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).ok
    except requests.RequestException:
        return False


def worker_counts(api: Api) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in api.ok("GET", "workers/", params={"status": "ready"}):
        counts[w["role"]] = counts.get(w["role"], 0) + 1
    return counts


def deploy(api: Api, names: list[str], per_role: dict[str, int], model: str, profile: str) -> None:
    for name in names:
        port = free_port()
        api.ok("POST", "deployments/", json={
            "name": name, "mode": "disaggregated", "model_path": model, "engine_settings": {"simulate": profile},
            "replicas": per_role, "min_replicas": {"prefill": 1, "decode": 1},
            "max_replicas": {"prefill": 64, "decode": 64}, "gateway_port": port})
        api.ok("POST", "alert-rules/", json={
            "name": f"{name}-kv", "deployment": name, "role": "decode", "per_worker": True,
            "metric": "kv_cache_usage_ratio", "comparison": ">", "threshold": 0.95, "for_s": 60})
        api.ok("PUT", f"deployments/{name}/autoscaling", json={
            "enabled": True, "pools": {"decode": {"enabled": True, "metric": "ttft_p99_seconds", "target": 1.0}}})


def share(api: Api, names: list[str], count: int, node: str | None = None) -> list[str]:
    """`count` shared gateways (on `node`), the deployments attached to them in turn; their names."""
    gateways = [f"front-{i}" for i in range(count)]
    for gateway in gateways:
        api.ok("POST", "gateways/", json={"name": gateway, "port": free_port(), "node": node})
    for index, name in enumerate(names):
        api.ok("PUT", f"deployments/{name}/gateway", json={"shared_gateway": gateways[index % count]})
    return gateways


def scale_all(api: Api, names: list[str], per_role: dict[str, int]) -> None:
    for name in names:
        for role, replicas in per_role.items():
            api.ok("POST", f"deployments/{name}/scale", json={"role": role, "replicas": replicas})


def split(per_deployment: int) -> dict[str, int]:
    return {"prefill": per_deployment // 2, "decode": per_deployment - per_deployment // 2}
