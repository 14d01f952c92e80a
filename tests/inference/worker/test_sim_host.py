"""One host process carries many simulated workers, each on its own port, started and stopped by its control API."""
from __future__ import annotations

import time

import pytest
import requests

from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration


def host_process(tmp_path_factory, index: int):
    """A simulated worker host (`--index` keeps its port range apart from other modules'), stopped at the end."""
    port = free_port()
    proc = start("simhost", ["-m", "inference.worker.sim_host", "--port", str(port), "--index", str(index)],
                 tmp_path_factory.mktemp(f"simhost-{index}"))
    proc.url = f"http://127.0.0.1:{port}"
    wait_http(proc, proc.url + "/health", timeout=60)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from host_process(tmp_path_factory, 3)


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.1)


def worker_argv(role: str, port: int) -> list[str]:
    return ["--simulate", "tiny-cpu", "--role", role, "--model", "/m/sim", "--port", str(port), "--revision", "1"]


def test_it_runs_many_workers_each_on_its_own_port(host):
    ports = [free_port() for _ in range(20)]
    answers = [requests.post(host.url + "/workers", json={"id": f"w{i}", "argv": worker_argv("decode", port)},
                             timeout=10) for i, port in enumerate(ports)]
    assert [a.status_code for a in answers] == [200] * 20
    pids = {a.json()["pid"] for a in answers}
    assert len(pids) == 20 and all(3 * 10_000_000 + 1_000_000_000 < pid < 4 * 10_000_000 + 1_000_000_000
                                   for pid in pids)
    for port in ports:
        health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        assert health["status"] == "ok" and health["role"] == "decode" and health["simulated"] is True
        assert health["prefix_caching"] is False  # no KV blocks held: no prefix reused
    listed = {w["id"] for w in requests.get(host.url + "/workers", timeout=5).json()["workers"]}
    assert {f"w{i}" for i in range(20)} <= listed
    for i in range(20):
        assert requests.delete(host.url + f"/workers/w{i}?drain_timeout=1", timeout=5).status_code == 202


def test_a_stopped_worker_stops_answering_and_is_listed_as_exited(host):
    port = free_port()
    pid = requests.post(host.url + "/workers", json={"id": "gone", "argv": worker_argv("prefill", port)},
                        timeout=10).json()["pid"]
    requests.delete(host.url + "/workers/gone?kill=1", timeout=5)
    exited = {}

    def listed_exited():
        exited.update(requests.get(host.url + "/workers", timeout=5).json()["exited"])
        return str(pid) in exited

    wait_until(listed_exited, timeout=30)
    assert exited[str(pid)] == -9
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_bad_worker_flags_are_a_400_that_names_them(host):
    r = requests.post(host.url + "/workers", json={"id": "bad", "argv": ["--simulate", "tiny-cpu", "--role", "x"]},
                      timeout=5)
    assert r.status_code == 400 and "--role" in r.json()["error"]["message"]
    r = requests.post(host.url + "/workers", json={"id": "bad", "argv": worker_argv("decode", 1)[2:]}, timeout=5)
    assert r.status_code == 400 and "--simulate" in r.json()["error"]["message"]
    r = requests.post(host.url + "/workers", json={"id": "bad", "argv": ["--simulate", "nope", *worker_argv(
        "decode", 1)[2:]]}, timeout=5)
    assert r.status_code == 400 and "no profile 'nope'" in r.json()["error"]["message"]
