"""make run's port check: a busy port is an error that names the port, its setting and the process holding it; a
port held only by the demo's own gateway (left running by a run that was killed) is fine."""
from __future__ import annotations

import os
import socket

import pytest

from controlplane.run.ports import PortBusy, port_check, port_free


@pytest.fixture
def listening():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def test_a_busy_port_names_its_setting_and_holder(listening):
    assert not port_free(listening)
    with pytest.raises(PortBusy) as busy:
        port_check(listening, what="the demo gateway's", setting="TANDEM_GATEWAY_PORT")
    message = str(busy.value)
    assert f"port {listening} (the demo gateway's, TANDEM_GATEWAY_PORT) is in use by pid {os.getpid()} (" in message
    assert "pytest" in message or "python" in message  # this process's command line
    assert "set TANDEM_GATEWAY_PORT to a free port, e.g. TANDEM_GATEWAY_PORT=" in message


def test_a_port_held_by_the_demos_own_gateway_is_not_in_use(listening):
    assert port_check(listening, what="the demo gateway's", setting="TANDEM_GATEWAY_PORT",
                      own_pids={os.getpid()}) is None  # no PortBusy
    with pytest.raises(PortBusy):  # the same port, held by someone else's process
        port_check(listening, what="the demo gateway's", setting="TANDEM_GATEWAY_PORT", own_pids={os.getpid() + 1})


def test_a_port_left_in_time_wait_by_an_earlier_run_is_free():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection stays in TIME_WAIT
    client.close()
    server.close()
    assert port_free(port)
    port_check(port, what="the web server's", setting="TANDEM_WEB_PORT")
