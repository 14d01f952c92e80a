"""The node agent's broker freeze, on a real broker: a filesystem broker's clients (a real kombu publisher) wait at
its gate until the agent's own deadline; a Redis server of this test's own (never the shared one) is SIGSTOPped and
SIGCONTed at the deadline, or at once by an agent that restarts meanwhile; nothing is left stopped or locked after
the deadline. A process that is no node agent refuses it, as it refuses an agent kill."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import threading
import time

import pytest

from controlplane.agent import fault_holds, fault_resume, faults, processes, runtime
from controlplane.lib.broker import freeze_lock_path
from controlplane.models import Action, ActionStatus
from tests.controlplane.chaos.conftest import process_state, wait_until
from tests.procs import free_port

AUDIT = {"chaos_run": 1, "experiment": "t"}


@pytest.fixture
def agent_of(world, monkeypatch):
    """This process as the node agent of the decode worker's node."""
    monkeypatch.setattr(runtime, "node_name", world["decode"].node.name)
    return world["decode"]


@pytest.fixture
def folder_broker(settings, tmp_path):
    queue = tmp_path / "broker" / "queue"
    queue.mkdir(parents=True)
    options = {"data_folder_in": str(queue), "data_folder_out": str(queue),
               "processed_folder": str(tmp_path / "broker"), "control_folder": str(tmp_path / "broker" / "control"),
               "store_processed": False}
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = options
    return options


@pytest.fixture
def redis_server(settings, tmp_path):
    """A redis-server of this test's own on a free port, as the broker."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    import redis

    port = free_port()
    handle = processes.spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], log_path=tmp_path / "redis.log",
                             marker=None)
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # One try: redis-py retries a timeout by default, which would outlast a short freeze.
    client = redis.Redis("127.0.0.1", port, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))

    def answers() -> bool:
        try:
            return client.ping()
        except redis.RedisError:
            return False

    wait_until("redis to answer", answers, timeout=30)
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{port}/0"
    yield handle, answers
    for sig in (signal.SIGCONT, signal.SIGKILL):
        processes.signal_group(handle, sig)
    processes.wait_exit(handle, 10)


def _publish(options: dict, done: threading.Event) -> threading.Thread:
    from kombu import Connection

    def run():
        with Connection("filesystem://", transport="controlplane.lib.broker:Transport",
                        transport_options=options) as connection:
            connection.SimpleQueue("frozen").put({"n": 1})
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _lock_is_free(options: dict) -> bool:
    fd = os.open(freeze_lock_path(options["data_folder_in"]), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.django_db(transaction=True)
def test_a_filesystem_broker_freeze_holds_every_client_until_the_agents_deadline(agent_of, folder_broker):
    outcome = faults.fault_inject(key="fz-fs", kind="broker_freeze", worker_id=agent_of.pk,
                                  until=time.time() + 3, audit=AUDIT, params={})
    assert outcome == "frozen" and not _lock_is_free(folder_broker)
    published = threading.Event()
    _publish(folder_broker, published)
    # A negative can only be watched for a while: the publisher waits at the gate as long as the freeze holds.
    assert not published.wait(1.0)
    # No revert is ever sent: the agent's own timer thaws it.
    wait_until("the publisher to get through", published.is_set, timeout=20)
    assert [name for name in os.listdir(folder_broker["data_folder_in"]) if name.endswith(".frozen.msg")]
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("fz-fs")).first())
    assert reverted.result["outcome"] == "thawed" and reverted.result["by"] == "the agent's deadline"
    injected = Action.objects.get(idempotency_key=faults.injected_key("fz-fs"))
    assert injected.result["broker"] == "filesystem" and injected.result["node"] == agent_of.node.name
    # Nothing left: the lock is free, no fault held.
    assert _lock_is_free(folder_broker) and fault_holds.paused_keys() == []


@pytest.mark.django_db(transaction=True)
def test_a_redis_broker_freeze_stops_its_process_until_the_deadline(agent_of, redis_server):
    handle, answers = redis_server
    assert faults.fault_inject(key="fz-redis", kind="broker_freeze", worker_id=agent_of.pk,
                               until=time.time() + 6, audit=AUDIT, params={}) == "frozen"
    injected = Action.objects.get(idempotency_key=faults.injected_key("fz-redis"))
    assert injected.result["broker_pid"] == handle.pid and injected.result["broker"] == "redis"
    wait_until("redis to stop", lambda: process_state(handle.pid) == "stopped", timeout=5)
    assert not answers()
    wait_until("redis to run again", lambda: process_state(handle.pid) in ("sleeping", "running"), timeout=20)
    assert answers()
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("fz-redis")).first())
    assert reverted.result["outcome"] == "thawed" and reverted.result["by"] == "the agent's deadline"
    assert faults.fault_revert(key="fz-redis", kind="broker_freeze", worker_id=agent_of.pk,
                               audit=AUDIT) == "already-reverted"


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_restarts_thaws_the_broker_its_predecessor_froze(agent_of, redis_server):
    handle, answers = redis_server
    assert faults.fault_inject(key="fz-restart", kind="broker_freeze", worker_id=agent_of.pk,
                               until=time.time() + 60, audit=AUDIT, params={}) == "frozen"
    # The agent dies: its timer with it (no revert message could reach it through the frozen broker).
    with fault_holds.held_lock:
        fault_holds.held.pop("fz-restart").timer.cancel()
    wait_until("redis to stop", lambda: process_state(handle.pid) == "stopped", timeout=5)
    assert fault_resume.faults_resume_after_restart(node_name=agent_of.node.name) == ["fz-restart"]
    wait_until("redis to answer again", answers, timeout=10)
    reverted = Action.objects.get(idempotency_key=faults.reverted_key("fz-restart"))
    assert reverted.result["outcome"] == "thawed" and reverted.result["by"] == "the agent's restart"
    assert fault_resume.faults_resume_after_restart(node_name=agent_of.node.name) == []


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["broker_freeze", "agent_kill"])
def test_a_process_that_is_no_node_agent_refuses_a_control_fault(world, folder_broker, kind):
    assert runtime.node_name is None and not runtime.simulated
    outcome = faults.fault_inject(key=f"no-agent-{kind}", kind=kind, worker_id=world["decode"].pk,
                                  until=time.time() + 30, audit=AUDIT, params={})
    assert outcome == "unsupported" and fault_holds.paused_keys() == [] and _lock_is_free(folder_broker)
    injected = Action.objects.get(idempotency_key=faults.injected_key(f"no-agent-{kind}"))
    assert injected.status == ActionStatus.FAILED and "node agent process" in injected.result["error"]


@pytest.mark.django_db
def test_another_nodes_agent_refuses_an_agent_kill(world, monkeypatch):
    monkeypatch.setattr(runtime, "node_name", "some-other-node")
    assert faults.fault_inject(key="other-kill", kind="agent_kill", worker_id=world["decode"].pk,
                               until=time.time() + 30, audit=AUDIT) == "failed"
    assert "some-other-node" in Action.objects.get(idempotency_key=faults.injected_key("other-kill")).result["error"]
