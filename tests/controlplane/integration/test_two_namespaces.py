"""Two node agents in two network namespaces (`ip netns`, addresses of their own) with real tiny-model workers show
that nothing assumes one host: workers bind and are reached at their node's address, the KV handoff crosses from
one namespace to the other, and a namespace cut off from the broker keeps serving and catches up when it is back.

The network, made by the test and removed even when it fails:

    root namespace: bridge 10.N.0.1/16 ── veth ── namespace A: 10.N.1.2 (node class=a: the prefill pool)
                     web (10.N.0.1)      └─ veth ── namespace B: 10.N.2.2 (node class=b: the decode pool)
                     control worker + beat, a Redis of the test's own on 127.0.0.1, and one TCP forwarder per
                     namespace (10.N.0.1:PORT -> 127.0.0.1:REDIS), since a namespace cannot reach 127.0.0.1

The database is a SQLite file (a file system is not namespaced); the broker is the only network path that the
agents need, so stopping A's forwarder cuts A off from it. Skipped, saying why, where `ip netns` is not permitted
(not root, no CAP_NET_ADMIN) or redis-server is missing.
"""
from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from controlplane.run.stack import Stack, child_specs
from tests.controlplane.integration.live import FAST_ENV, LiveStack, manage
from tests.procs import ROOT, free_port

pytestmark = pytest.mark.integration
NAME = "it-netns"


def _skip_reason() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "ip netns needs root (CAP_NET_ADMIN); this test runs as an unprivileged user"
    for tool in ("ip", "redis-server"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"tndprobe{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode:
        return f"ip netns is not permitted here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


class Network:
    """A bridge in the root namespace and two namespaces on it, each behind a veth pair."""

    def __init__(self):
        tag = secrets.token_hex(3)
        self.octet = random.randint(200, 249)
        self.bridge = f"tnb{tag}"
        self.hub = f"10.{self.octet}.0.1"
        self.namespaces = {"a": f"tnd-a-{tag}", "b": f"tnd-b-{tag}"}
        self.addresses = {"a": f"10.{self.octet}.1.2", "b": f"10.{self.octet}.2.2"}
        self.host_ends = {"a": f"tva{tag}", "b": f"tvb{tag}"}

    def create(self) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.hub}/16", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for key, ns in self.namespaces.items():
            host_end, ns_end = self.host_ends[key], f"tvn{key}{self.bridge[3:]}"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            run("ip", "link", "set", ns_end, "netns", ns)
            run("ip", "link", "set", host_end, "master", self.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{self.addresses[key]}/16", "dev", ns_end)
            run("ip", "-n", ns, "link", "set", ns_end, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")

    def destroy(self) -> None:
        """Kill whatever still runs in the namespaces (workers live in their own sessions), then remove it all."""
        for ns in self.namespaces.values():
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for host_end in self.host_ends.values():
            subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class Forwarder:
    """tests/controlplane/integration/forwarder.py as a child: stop() cuts, start() heals (same port)."""

    def __init__(self, listen: str, port: int, target_port: int, log_dir: Path, name: str):
        self.argv = [sys.executable, "-m", "tests.controlplane.integration.forwarder", listen, str(port),
                     "127.0.0.1", str(target_port)]
        self.listen, self.port, self.log_path = listen, port, log_dir / f"forwarder-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _wait(f"the forwarder on {self.listen}:{self.port}", lambda: _connects(self.listen, self.port), 30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _connects(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _wait(what: str, predicate, timeout: float, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except requests.RequestException as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def netns_stack(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(f"two-namespace test skipped: {reason}")
    var_dir = tmp_path_factory.mktemp("tandem-netns")
    log_dir = var_dir / "logs"
    log_dir.mkdir()
    net = Network()
    procs: list[subprocess.Popen] = []
    forwarders: dict[str, Forwarder] = {}
    stack = None
    try:
        net.create()
        redis_port = free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save",
                                       "", "--appendonly", "no"], stdout=open(log_dir / "redis.log", "ab"),
                                      stderr=subprocess.STDOUT))
        _wait("the test's redis-server", lambda: _connects("127.0.0.1", redis_port), 30)
        for key in ("a", "b"):
            forwarders[key] = Forwarder(net.hub, free_port(), redis_port, log_dir, key)
            forwarders[key].start()
        web_port = free_port()
        web_url = f"http://{net.hub}:{web_port}"
        env = {**os.environ, **FAST_ENV, "TANDEM_VAR_DIR": str(var_dir),
               "DATABASE_URL": f"sqlite:///{var_dir / 'tandem.sqlite3'}",
               "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0", "TANDEM_WEB_PORT": str(web_port),
               "TANDEM_PUBLIC_URL": web_url, "ALLOWED_HOSTS": f"localhost,127.0.0.1,{net.hub}"}
        env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        manage(env, "migrate", "--verbosity", "0")
        token = manage(env, "tandem_token", "it-admin", "--role", "admin").strip()
        specs = child_specs(web_port=web_port, node_name="netns", var_dir=var_dir, embedded_beat=True)[:-1]
        web = specs[0]
        web.argv[web.argv.index(f"127.0.0.1:{web_port}")] = f"{net.hub}:{web_port}"
        stack = Stack(specs, log_dir=log_dir, env=env, cwd=ROOT, on_event=lambda m: print(m, file=sys.stderr))
        stack.start()
        live = LiveStack(stack=stack, env=env, var_dir=var_dir, web_url=web_url, token=token, node_name="netns")
        live.wait_for("the web server on the bridge address", lambda: requests.get(f"{web_url}/healthz",
                                                                                      timeout=2).ok, timeout=60)
        for key, ns in net.namespaces.items():
            agent_env = {**env, "CELERY_BROKER_URL": f"redis://{net.hub}:{forwarders[key].port}/0"}
            with open(log_dir / f"agent-{key}.log", "ab") as log:
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, str(ROOT / "manage.py"), "tandem_agent", "--name",
                     f"ns-{key}", "--address", net.addresses[key], "--label", f"class={key}"],
                    env=agent_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        for key in ("a", "b"):
            live.wait_for(f"node ns-{key} to register", lambda k=key: live.api("GET", f"nodes/ns-{k}/").ok,
                          timeout=90)
        yield live, net, forwarders
    finally:
        if stack is not None:
            stack.stop(["control"])
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for forwarder in forwarders.values():
            forwarder.stop()
        net.destroy()  # the agents and the workers they started, wherever they are
        if stack is not None:
            stack.stop(["web"])
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _complete(gateway_url: str) -> requests.Response:
    return requests.post(f"{gateway_url}/v1/completions", timeout=60,
                         json={"model": NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0})


def _ready(live, role: str) -> list[dict]:
    return [w for w in live.workers(NAME, role=role) if w["status"] == "ready"]


def _counter(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture(scope="module")
def deployment(netns_stack, tiny_model_dir):
    live, net, _ = netns_stack
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 16 << 20}, "gateway_port": gateway_port,
        "placement": {"prefill": {"node_selector": {"class": "a"}}, "decode": {"node_selector": {"class": "b"}}}})
    assert created.status_code == 202, created.text
    gateway = live.wait_for("the gateway worker to be ready", lambda: [
        w for w in live.workers(NAME, role="gateway") if w["status"] == "ready"], timeout=120)[0]
    gateway_url = f"http://{gateway['host']}:{gateway['port']}"
    live.wait_for("the deployment to answer through its gateway", lambda: _complete(gateway_url).ok, timeout=240,
                  interval=1.0)
    return gateway_url


def test_workers_bind_and_are_reached_at_their_nodes_address(netns_stack, deployment):
    live, net, _ = netns_stack
    (prefill,), (decode,) = _ready(live, "prefill"), _ready(live, "decode")
    assert (prefill["node"], prefill["host"]) == ("ns-a", net.addresses["a"])
    assert (decode["node"], decode["host"]) == ("ns-b", net.addresses["b"])
    for worker in (prefill, decode):
        assert requests.get(f"http://{worker['host']}:{worker['port']}/health", timeout=5).json()["status"] == "ok"
        # Not on this namespace's loopback: the process lives in its node's namespace.
        assert not _connects("127.0.0.1", worker["port"])


def test_the_kv_handoff_crosses_from_one_namespace_to_the_other(netns_stack, deployment):
    live, net, _ = netns_stack
    (prefill,), (decode,) = _ready(live, "prefill"), _ready(live, "decode")
    prefill_url, decode_url = (f"http://{w['host']}:{w['port']}" for w in (prefill, decode))
    sent, received = _counter(prefill_url, "tandem_kv_transfer_bytes_total"), _counter(
        decode_url, "tandem_kv_transfer_bytes_total")
    answer = _complete(deployment)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    assert _counter(prefill_url, "tandem_kv_transfer_bytes_total") > sent
    assert _counter(decode_url, "tandem_kv_transfer_bytes_total") > received


def test_a_namespace_cut_off_from_the_broker_keeps_serving_and_catches_up(netns_stack, deployment):
    """1. Cut A from the broker; its prefill worker keeps serving. 2. Scale prefill to 2 meanwhile: the start waits
    in A's queue. 3. Heal: A's agent reconnects, starts the worker, and the node heartbeats throughout."""
    live, net, forwarders = netns_stack
    forwarders["a"].stop()
    try:
        for _ in range(3):
            assert _complete(deployment).status_code == 200
        scaled = live.api("POST", f"deployments/{NAME}/scale", json={"role": "prefill", "replicas": 2})
        assert scaled.status_code == 202, scaled.text
        new = live.wait_for("the new prefill worker row", lambda: [
            w for w in live.workers(NAME, role="prefill") if w["status"] in ("pending", "starting")
            and w["node"] == "ns-a"], timeout=30)[0]
        # While A is cut off nobody consumes its start; requests keep being served meanwhile.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert _complete(deployment).status_code == 200
            assert live.api("GET", f"workers/{new['id']}/").json()["status"] == "pending"
    finally:
        forwarders["a"].start()
    live.wait_for("A's agent to start the scaled worker once the broker is back",
                  lambda: len(_ready(live, "prefill")) == 2, timeout=180, interval=1.0)
    node = live.api("GET", "nodes/ns-a/").json()
    assert node["online"] is True, node
    assert _complete(deployment).status_code == 200
