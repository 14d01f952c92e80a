"""A TCP forwarder: `python -m tests.controlplane.integration.forwarder LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT`.

A network namespace cannot reach the root namespace's 127.0.0.1, where the test's Redis listens; this process, in
the root namespace, listens on the namespace-facing address and copies bytes both ways. Stopping it cuts that one
namespace off from the broker (its open connections close with it); starting it again on the same port heals it.
"""
from __future__ import annotations

import asyncio
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
    async def handle(client_reader, client_writer):
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, target_writer), _pipe(target_reader, client_writer))

    server = await asyncio.start_server(handle, listen_host, listen_port, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"forwarding {listen_host}:{listen_port} -> {target_host}:{target_port}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
