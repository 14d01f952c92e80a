"""A JSON HTTP endpoint on a local port, for tests where a real server stands in for a worker or a gateway."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonStub(ThreadingHTTPServer):
    """Answers every GET with `answer(path) -> (status code, JSON body)`; `url` is its base. Close it when done."""

    request_queue_size = 128  # socketserver's 5 refuses (or times out) a pass that probes dozens at once

    def __init__(self, answer: Callable[[str], tuple[int, object]]):
        self.answer = answer
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_port}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        status, body = self.server.answer(self.path)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass
