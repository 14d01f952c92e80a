from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("TANDEM_TEST_MODELS_DIR", ROOT / "var" / "models"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The deterministic random-weight tiny Llama (built once, in seconds; `make test` builds it beforehand)."""
    from inference.models.tiny import prepare_tiny

    return prepare_tiny(MODELS_DIR / "tiny")


@pytest.fixture
def log_dir(tmp_path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d
