"""The control plane's passes keep their connections to the fleet open: a second scrape pass, and a health pass
after a scrape pass, reach every worker over the connection the first pass opened (real aiohttp servers, which
record the client address of each request: one address per TCP connection). A worker that closed an idle
connection is still scraped and probed as up."""
from __future__ import annotations

import socket
import threading
import time

from controlplane.lib.fleet_http import fleet_http
from controlplane.observability.scraper import Target, scrape
from controlplane.supervision.health import check_health

NUM_WORKERS = 6
BODY = b"# TYPE tandem_requests_running gauge\ntandem_requests_running 3\n"


def _targets(ports):
    return [Target(i, 1, "decode", f"http://127.0.0.1:{port}") for i, port in enumerate(ports)]


def _connections(metrics_servers, ports) -> dict[int, set]:
    return {port: set(metrics_servers.peers.get(port, [])) for port in ports}


def test_a_second_scrape_pass_opens_no_new_connection(metrics_servers):
    ports = [metrics_servers.serve(lambda: (200, BODY)) for _ in range(NUM_WORKERS)]
    first = scrape(_targets(ports), timeout_s=5, concurrency=4)
    assert all(f.reading is not None for f in first)
    after_first = _connections(metrics_servers, ports)
    assert all(len(peers) == 1 for peers in after_first.values())

    second = scrape(_targets(ports), timeout_s=5, concurrency=4)
    assert all(f.reading is not None for f in second)
    assert all(len(metrics_servers.peers[port]) == 2 for port in ports)  # each answered twice...
    assert _connections(metrics_servers, ports) == after_first  # ...over the one connection of the first pass


def test_a_health_pass_reuses_the_scrape_connections(deployment, make_worker, metrics_servers):
    ports = [metrics_servers.serve(lambda: (200, BODY)) for _ in range(3)]
    workers = [make_worker(deployment, "decode", port=port) for port in ports]
    scrape([Target(w.pk, deployment.pk, "decode", w.url) for w in workers], timeout_s=5, concurrency=4)
    after_scrape = _connections(metrics_servers, ports)

    outcome = check_health()
    assert outcome["failing"] == [] and outcome["restarted"] == []
    assert all(len(metrics_servers.peers[port]) == 2 for port in ports)
    assert _connections(metrics_servers, ports) == after_scrape


def test_a_worker_that_closed_the_idle_connection_still_answers_as_up(metrics_servers):
    # The server drops a connection idle for 50 ms: the pass after that must not read it as a down worker,
    # whether the client saw the close before reusing the connection or only when it tried to.
    ports = [metrics_servers.serve(lambda: (200, BODY), keepalive_timeout=0.05) for _ in range(3)]
    assert all(f.reading is not None for f in scrape(_targets(ports), timeout_s=5, concurrency=4))
    deadline = time.monotonic() + 30
    while fleet_http().open_connections(set(ports)) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the client has seen the closes (it holds no idle connection)
    again = scrape(_targets(ports), timeout_s=5, concurrency=4)
    assert [f.error for f in again] == ["", "", ""]
    assert all(len(_connections(metrics_servers, [port])[port]) == 2 for port in ports)  # new connections this time


def test_an_answer_that_arrived_while_the_loop_was_busy_is_not_a_timeout(metrics_servers):
    """On a loaded host the loop thread may wake seconds late. The worker answered in 0.2 s; the loop was held
    from 0.05 s to 1.55 s; the timeout is 1 s. The answer is there when the loop wakes: it must be read, not
    timed out (a `total` timer that expired meanwhile fired first and read the worker as down)."""
    port = metrics_servers.serve(lambda: (200, BODY), delay_s=0.2)
    result: list = []
    pass_thread = threading.Thread(target=lambda: result.extend(scrape(_targets([port]), timeout_s=1, concurrency=1)))
    pass_thread.start()
    deadline = time.monotonic() + 10
    while not metrics_servers.peers.get(port) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the request reached the server
    fleet_http()._loop.call_soon_threadsafe(time.sleep, 1.5)  # the loop thread, held (a busy process)
    pass_thread.join(30)
    assert [f.error for f in result] == [""] and result[0].reading is not None


def test_a_worker_that_sends_nothing_times_out():
    with socket.socket() as listener:  # accepts connections (the kernel does) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        started = time.monotonic()
        [fetched] = scrape(_targets([listener.getsockname()[1]]), timeout_s=1, concurrency=1)
        waited = time.monotonic() - started
    assert fetched.reading is None and "Timeout" in fetched.error
    assert 0.9 < waited < 10


def test_a_worker_dripping_its_answer_past_the_passs_bound_fails_alone(metrics_servers, deployment, make_worker,
                                                                      monkeypatch):
    """A byte every 50 ms never lets a read time out; the pass's bound (here 2 × 0.5 s + 2 s) ends the wait for that
    one worker: it is recorded as failed (scrape: an error, health: a failing probe), every other answer is kept,
    and the pass raises nothing."""
    import controlplane.lib.fleet_http as fleet_http_module

    monkeypatch.setattr(fleet_http_module, "PASS_SLACK_S", 2.0)
    prompt = metrics_servers.serve(lambda: (200, BODY))
    dripping = metrics_servers.serve(lambda: (200, BODY), drip_s=60)
    started = time.monotonic()
    fetched = scrape(_targets([prompt, dripping]), timeout_s=0.5, concurrency=4)
    assert time.monotonic() - started < 30
    assert fetched[0].error == "" and fetched[0].reading is not None
    assert fetched[1].reading is None and "within the pass's bound of 3 s" in fetched[1].error

    answering = make_worker(deployment, "decode", status="ready", port=prompt)
    stuck = make_worker(deployment, "decode", status="ready", port=dripping)
    monkeypatch.setattr("django.conf.settings.TANDEM_HEALTH_TIMEOUT_S", 0.5)
    outcome = check_health()
    assert outcome["failing"] == [stuck.id] and answering.id not in outcome["failing"]
    stuck.refresh_from_db()
    assert stuck.consecutive_health_failures == 1 and "bound" in stuck.last_error
