"""The project installs (pyproject.toml, setup.py): a wheel built from the checkout carries the C kernels compiled at
install, and a fresh venv with no dependencies at all gets the tandem-worker command and loads the installed kernels
rather than compiling them; the worker extra brings no Django. Where a kernel was not built at install, a worker
compiles it on first use and says so, or reports it missing with the reason (inference.engine.kernels.build)."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inference.engine.kernels import build

ROOT = Path(__file__).resolve().parent.parent
KERNELS = {"matvec", "int8_matvec", "paged_attention", "prefill_attention", "decode_layers"}
SKIP = shutil.ignore_patterns(".git", ".venv*", "var", "build", "*.egg-info", "_built", "__pycache__", "tests",
                              "bench", "docs")


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


@pytest.mark.timeout(600)
def test_a_fresh_venv_gets_the_kernels_built_at_install_and_the_worker_command_without_django(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    # The wheel `pip install .` builds, made with this venv's setuptools (a fresh venv's may be older than needed).
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path / "wheels"), str(source))
    venv = tmp_path / "fresh"
    _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv))
    (wheel,) = (tmp_path / "wheels").glob("tandem-*.whl")
    _run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel))
    python = venv / "bin" / "python"

    assert "--role" in _run(str(venv / "bin" / "tandem-worker"), "--help").stdout
    assert subprocess.run([str(python), "-c", "import django"], capture_output=True).returncode != 0
    probe = ("import json; from importlib.metadata import requires; from inference.engine.kernels import build; "
             "build.load(build.SOURCES[0]); print(json.dumps({'requires': requires('tandem'), "
             "'status': build.status(), 'built': sorted(p.name for p in build.INSTALLED.glob('*.so'))}))")
    found = json.loads(_run(str(python), "-c", probe, cwd=tmp_path).stdout)
    assert {name.split("-")[0] for name in found["built"]} == KERNELS
    assert found["status"]["matvec"]["origin"] == "installed"
    assert found["status"]["matvec"]["path"].startswith(str(venv))
    assert found["status"]["decode_layers"] == {"origin": "not loaded", "installed": True}
    worker = [r for r in found["requires"] if r.endswith('extra == "worker"')]
    control = [r for r in found["requires"] if r.endswith('extra == "control"')]
    assert any(r.startswith("torch==2.13.0") for r in worker)
    assert not any(r.lower().startswith("django") for r in worker)
    assert any(r.startswith("Django==") for r in control) and any(r.startswith("tandem[worker]") for r in control)


@pytest.fixture()
def nothing_installed(tmp_path, monkeypatch):
    """No build at install and an empty compile cache, for this test's loads."""
    monkeypatch.setattr(build, "INSTALLED", tmp_path / "installed")
    monkeypatch.setattr(build, "_status", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_a_kernel_not_built_at_install_is_compiled_on_first_use_and_said_so(nothing_installed, caplog):
    source = build.SOURCES[0]
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        lib, reason = build.load(source)
    assert lib is not None and reason is None
    assert build.status()["matvec"]["origin"] == "first_use"
    assert "not built at install" in caplog.text and "compiled it on first use" in caplog.text
    build.load(source)  # another worker of the host: the cached build, still not an installed one
    assert build.status()["matvec"]["origin"] == "cached"


@pytest.mark.parametrize("compiler, why", [("false", "did not build"), (None, "no C compiler found")])
def test_a_kernel_that_cannot_be_built_is_reported_missing_with_the_reason(nothing_installed, monkeypatch,
                                                                          compiler, why):
    if compiler is None:
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setenv("PATH", str(nothing_installed))
    else:
        monkeypatch.setenv("CC", compiler)
    lib, reason = build.load(build.SOURCES[0])
    assert lib is None and why in reason
    assert build.status()["matvec"] == {"origin": "missing", "reason": reason}
