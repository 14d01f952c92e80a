"""A hosted simulated worker answers its probes from memory: /metrics is rendered again only once a request may have
changed a series, and /health's ready answer is built once; a draining worker still says so at once."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from inference.worker.config import build_parser, worker_config
from inference.worker.server import WorkerServer
from inference.worker.sim_host import HostedWorker
from tests.procs import free_port


def hosted(role: str) -> HostedWorker:
    args = vars(build_parser().parse_args(["--simulate", "tiny-cpu", "--role", role, "--model", "/m/sim",
                                           "--port", str(free_port()), "--revision", "1"]))
    return HostedWorker(worker_config({**args, "secret": None}), process_metrics=False)


async def started(worker: HostedWorker) -> str:
    await worker.start(shutdown_timeout=1.0)
    while not worker.info:
        await asyncio.sleep(0.01)
    return f"http://127.0.0.1:{worker.config.port}"


def counting_renders(worker: HostedWorker) -> list[int]:
    renders = [0]
    render = worker.metrics.render

    def counted() -> bytes:
        renders[0] += 1
        return render()
    worker.metrics.render = counted
    return renders


def test_an_idle_worker_renders_its_metrics_once_however_often_it_is_scraped():
    async def run():
        worker = hosted("decode")
        renders = counting_renders(worker)
        url = await started(worker)
        try:
            async with aiohttp.ClientSession() as session:
                pages = []
                for _ in range(5):
                    async with session.get(url + "/metrics") as r:
                        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                        pages.append(await r.read())
            assert renders[0] == 1 and len(set(pages)) == 1
            assert b"tandem_worker_simulated" in pages[0]
        finally:
            await worker.close()
    asyncio.run(run())


def test_a_request_makes_the_next_scrape_show_what_it_changed():
    async def run():
        worker = hosted("colocated")
        renders = counting_renders(worker)
        url = await started(worker)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url + "/metrics") as r:
                    assert b"tandem_generation_tokens_total{" in await r.read()
                async with session.post(url + "/v1/generate", json={"prompt": "a b c", "max_tokens": 4}) as r:
                    assert r.status == 200
                    await r.read()
                for _ in range(3):
                    async with session.get(url + "/metrics") as r:
                        page = (await r.read()).decode()
            generated = next(line for line in page.splitlines()
                             if line.startswith("tandem_generation_tokens_total{"))
            assert generated.endswith(" 4.0")
            assert renders[0] == 2  # before the request, and once after it
        finally:
            await worker.close()
    asyncio.run(run())


def test_the_ready_health_answer_is_the_servers_own_and_draining_is_said_at_once():
    async def run():
        worker = hosted("prefill")
        url = await started(worker)
        try:
            expected = await WorkerServer.health(worker, None)
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    async with session.get(url + "/health") as r:
                        assert r.status == 200 and r.headers["Content-Type"] == expected.headers["Content-Type"]
                        assert await r.json() == json.loads(expected.body)
                worker.begin_drain()
                async with session.get(url + "/health") as r:
                    assert r.status == 503 and (await r.json())["status"] == "draining"
        finally:
            await worker.close()
    asyncio.run(run())
