"""The vLLM installation a host runs workers from: a Python interpreter of a virtual environment of its own (vLLM
pins transformers below the version Tandem uses, as a production vLLM lives in an image of its own). `make vllm`
builds one at .venv-vllm; an agent names its own with TANDEM_VLLM_PYTHON.

Two questions are put to that interpreter, each in a child process:
- `probe`: which vLLM it has, or why none (not there, or it fails to import: a torchvision built for another torch
  fails with "operator torchvision::nms does not exist");
- `check_args`: whether vLLM's own argument parser accepts a revision's arguments, so that a bad value is a 400 when
  the revision is created, never a worker that exits at every start. The parser takes several seconds to import,
  so answers are kept per interpreter and arguments.
"""
from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

PROBE_TIMEOUT_S = 120.0
CHECK_TIMEOUT_S = 180.0
_PROBE = "import json, vllm; print(json.dumps({'version': vllm.__version__}))"
# argparse exits with status 2 and "<prog>: error: ..." on stderr; validate_parsed_serve_args raises.
_CHECK = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
try:
    validate_parsed_serve_args(parser.parse_args(json.loads(sys.argv[1])))
except (ValueError, TypeError) as exc:
    print(f"vllm: error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


@dataclass(frozen=True, slots=True)
class VllmInstall:
    python: str
    version: str = ""  # "" when there is none
    error: str = ""    # why there is none

    def as_dict(self) -> dict:
        return {"python": self.python, "version": self.version} if self.version else {
            "python": self.python, "error": self.error}


class VllmArgsError(ValueError):
    """vLLM's parser refused the arguments (message: its own words), or it could not be asked."""


def probe(python: str) -> VllmInstall:
    if not python:
        return VllmInstall("", error="no vLLM interpreter configured (TANDEM_VLLM_PYTHON; `make vllm` builds "
                                     ".venv-vllm)")
    if not Path(python).is_file():
        return VllmInstall(python, error=f"{python} does not exist (`make vllm` builds .venv-vllm)")
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VllmInstall(python, error=f"{python} could not be run: {exc}")
    if done.returncode != 0:
        return VllmInstall(python, error=f"import vllm failed: {_last_line(done.stderr)}")
    try:
        return VllmInstall(python, version=str(json.loads(done.stdout.strip().splitlines()[-1])["version"]))
    except (ValueError, KeyError, IndexError):
        return VllmInstall(python, error=f"import vllm printed no version: {done.stdout[-200:]!r}")


_checked: dict[tuple[str, tuple[str, ...]], str] = {}  # (python, args) -> "" (accepted) or vLLM's error
_lock = threading.Lock()


def check_args(python: str, args: list[str]) -> None:
    """VllmArgsError with vLLM's own message where its parser refuses `args` (as they would follow the model)."""
    key = (python, tuple(args))
    with _lock:
        error = _checked.get(key)
    if error is None:
        error = _ask_parser(python, args)
        with _lock:
            _checked[key] = error
    if error:
        raise VllmArgsError(error)


def _ask_parser(python: str, args: list[str]) -> str:
    if not python or not Path(python).is_file():
        raise VllmArgsError(f"vLLM's argument parser is not available here to check them ({probe(python).error})")
    try:
        done = subprocess.run([python, "-c", _CHECK, json.dumps(["--model", "model", *args])], capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmArgsError(f"vLLM's argument parser could not be asked: {exc}") from None
    if done.returncode == 0:
        return ""
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    return (errors[-1].split("error:", 1)[1].strip() if errors else _last_line(done.stderr)) or \
        f"vLLM's parser exited with status {done.returncode}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
