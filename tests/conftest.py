from __future__ import annotations

import json
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


# Wall time per test file (setup, call and teardown of its tests, module fixtures included; a session fixture counts
# where it starts first). The slowest files are printed at the end of every run; with TANDEM_MAX_TEST_FILE_S set
# (.ci/run sets it), a file over that many seconds fails the run: CI's budget is kept file by file.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def _max_file_seconds() -> float | None:
    raw = os.environ.get("TANDEM_MAX_TEST_FILE_S", "").strip()
    return float(raw) if raw else None


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:10]
    terminalreporter.section("slowest test files")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}")
    # And by folder (two levels: tests/controlplane/integration, tests/inference/gateway, ...), where the time goes.
    folders: dict[str, float] = {}
    for path, seconds in _FILE_SECONDS.items():
        folder = "/".join(path.split("/")[:3]) if path.count("/") >= 3 else path.rsplit("/", 1)[0]
        folders[folder] = folders.get(folder, 0.0) + seconds
    terminalreporter.write_line("by folder: " + ", ".join(
        f"{folder} {seconds:.0f} s" for folder, seconds in sorted(folders.items(), key=lambda item: -item[1])[:12]))
    limit = _max_file_seconds()
    over = [(path, seconds) for path, seconds in slowest if limit is not None and seconds > limit]
    for path, seconds in over:
        terminalreporter.write_line(f"over the budget of {limit:g} s per file (TANDEM_MAX_TEST_FILE_S): {path} took "
                                    f"{seconds:.1f} s", red=True)


def pytest_sessionfinish(session, exitstatus):
    # Every file's seconds as JSON, for whoever trims the suite (TANDEM_TEST_TIMES=path).
    times_path = os.environ.get("TANDEM_TEST_TIMES", "").strip()
    if times_path and _FILE_SECONDS:
        with open(times_path, "w") as out:
            json.dump(dict(sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])), out, indent=1)
    limit = _max_file_seconds()
    if limit is not None and exitstatus == 0 and any(seconds > limit for seconds in _FILE_SECONDS.values()):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
