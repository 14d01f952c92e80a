"""`python -m inference.models prepare tiny|smollm2 [--out DIR] [--dtype bfloat16|float32]`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="build a model folder (idempotent: instant when already built)")
    prepare.add_argument("model", choices=["tiny", "smollm2"])
    prepare.add_argument("--out", type=Path, default=None, help="output folder (default: var/models/<name>)")
    prepare.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                         help="smollm2 only: dtype of the saved weights (tiny is always float32)")
    args = parser.parse_args(argv)

    if args.model == "tiny":
        from inference.models.tiny import DEFAULT_DIR, prepare_tiny

        path = prepare_tiny(args.out or DEFAULT_DIR)
    else:
        from inference.models.smollm2 import DEFAULT_DIR, prepare_smollm2

        path = prepare_smollm2(args.out or DEFAULT_DIR, dtype=args.dtype)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
