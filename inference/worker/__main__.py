"""`python -m inference.worker --role prefill|decode|colocated --model DIR --port N ...` (see --help).

With `--simulate PROFILE` the same command line runs a simulated worker: the same server in front of a simulated
engine (inference.worker.sim), latencies from the profile, no model and no torch.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from inference.worker.config import parse_args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)  # before the heavy imports below: a bad flag fails in a blink
    from inference.worker.server import serve  # imports no torch: a real engine loads it on its own thread

    prefix = f"sim-{config.engine.role}" if config.simulated else config.engine.role
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {prefix}[%(process)d] %(levelname)s "
                                                   "%(name)s: %(message)s")
    return asyncio.run(serve(config))


def run() -> None:
    """The `tandem-worker` command: main(), then out at once.

    serve() has closed the sockets, stopped the engine thread and logged its exit. Interpreter finalization of
    torch and transformers then takes seconds for nothing a worker needs, and a rolling replacement waits on it; so
    flush and leave at once.
    """
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
