"""`python -m inference.worker --role prefill|decode|colocated --model DIR --port N ...` (see --help).

With `--simulate PROFILE` the same command line runs a simulated worker (inference.worker.sim): the same HTTP
protocol, latencies from the profile, no model and no torch.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from inference.worker.config import build_parser, parse_args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    if args["simulate"]:
        return _main_simulated(parser, args)
    config = parse_args(argv)  # before the heavy imports below: a bad flag fails in a blink
    from inference.worker.server import serve

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {config.engine.role}[%(process)d] %(levelname)s "
                                                   "%(name)s: %(message)s")
    return asyncio.run(serve(config))


def _main_simulated(parser, args: dict) -> int:
    from inference.worker.sim.server import ProfileError, serve_one, sim_config_from_args

    try:
        config = sim_config_from_args(args)
    except ProfileError as exc:
        parser.error(f"--simulate {exc}")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s sim-{config.role}[%(process)d] %(levelname)s "
                                                   "%(name)s: %(message)s")
    return asyncio.run(serve_one(config))


if __name__ == "__main__":
    code = main()
    # serve() has closed the sockets, stopped the engine thread and logged its exit. Interpreter finalization of
    # torch and transformers then takes seconds (measured: ~5 s of a 10 s run on a loaded 2-core host) for nothing
    # a worker needs, and a rolling replacement waits on it; so flush and leave at once.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
