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


# pytest.ini's 300 s per test catches a hang in a unit test. A test that starts real processes counts its fixtures'
# process starts (model loads, a whole stack) on a loaded host too, and its own waits allow more than 300 s: it gets
# 900 s, so that a slow host fails on the test's own readable assertion, not on pytest-timeout's stack dump.
INTEGRATION_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None and (
                item.get_closest_marker("integration") or item.get_closest_marker("browser")):
            item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_S))
