"""`python -m inference.gateway --port N (--prefill URLS --decode URLS | --colocated URLS |
--control-plane URL --deployment NAME --token T) [...]`: see `config.parse_args` for every flag."""
from __future__ import annotations

import logging
import sys

from aiohttp import web

from inference.gateway.app import build_app
from inference.gateway.config import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Access logs per request would cost more than the routing itself; errors are logged where they happen.
    # lingering_time=0: a body refused unread (request_body.py) is never read afterwards either; aiohttp's default
    # reads and drops it for its lingering time to keep the connection, which costs what refusing it unread saved.
    web.run_app(build_app(config), host=config.host, port=config.port, access_log=None, shutdown_timeout=10,
                lingering_time=0, print=lambda msg: logging.getLogger("tandem.gateway").info(msg.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
