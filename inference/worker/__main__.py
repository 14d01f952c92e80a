"""`python -m inference.worker --role prefill|decode|colocated --model DIR --port N ...` (see --help)."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from inference.worker.config import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)  # before the heavy imports below: a bad flag fails in a blink
    from inference.worker.server import serve

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {config.engine.role}[%(process)d] %(levelname)s "
                                                   "%(name)s: %(message)s")
    return asyncio.run(serve(config))


if __name__ == "__main__":
    code = main()
    # serve() has closed the sockets, stopped the engine thread and logged its exit. Interpreter finalization of
    # torch and transformers then takes seconds (measured: ~5 s of a 10 s run on a loaded 2-core host) for nothing
    # a worker needs, and a rolling replacement waits on it; so flush and leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
