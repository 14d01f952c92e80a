"""A TCP proxy that can freeze: while frozen it keeps every connection open and accepts new ones, but passes no
byte either way — a broker that hangs rather than refuses (what a stuck Redis or a blocked RabbitMQ looks like to
its clients). Thawed, it passes everything held back."""
from __future__ import annotations

import socket
import threading


class FreezableProxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._thawed = threading.Event()
        self._thawed.set()
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def close(self) -> None:
        self._closed = True
        self._thawed.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._thawed.wait()  # a connection made while frozen hangs until the thaw, as a hung server's would
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        self._sockets += [client, server]
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._thawed.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
