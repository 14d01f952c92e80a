"""`make run` (`manage.py tandem_run`) as a test starts it: a process of its own with an isolated VAR_DIR, database
and broker, the tiny model, free ports, and its terminal output in a file the test waits on."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.controlplane.integration.live import FAST_ENV, IsolatedServices
from tests.procs import ROOT, free_port

PASSWORD = "correct-horse-battery"
# Generous: the CI machines these run on are loaded; every wait ends as soon as its condition holds.
READY_TIMEOUT_S = 180


class MakeRun:
    def __init__(self, tmp_path: Path, tiny_model_dir: Path, **env: str):
        self.var_dir = tmp_path / "var"
        self.services = IsolatedServices(self.var_dir)
        self.web_port, self.gateway_port = free_port(), free_port()
        self.env = {**os.environ, **FAST_ENV, **self.services.env, "TANDEM_VAR_DIR": str(self.var_dir),
                    "TANDEM_WEB_PORT": str(self.web_port), "TANDEM_GATEWAY_PORT": str(self.gateway_port),
                    "TANDEM_DEMO_MODEL": "tiny", "TANDEM_DEMO_LOAD": "0", "TANDEM_ADMIN_PASSWORD": PASSWORD,
                    # The tiny model the test session already built: prepare is then instant.
                    "TANDEM_MODELS_DIR": str(tiny_model_dir.parent), "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
        self.env.update(env)
        self.env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        self.output_path = tmp_path / "make-run.out"
        self.proc: subprocess.Popen | None = None

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def manage(self, *args: str, timeout: float = 180) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, timeout=timeout,
                                capture_output=True, text=True)
        assert result.returncode == 0, f"manage.py {args[0]} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def python(self, code: str, timeout: float = 180) -> str:
        """Run `code` in a Django process of this run's settings (to prepare state as an earlier run left it)."""
        return self.manage("shell", "-c", code, timeout=timeout)

    def start(self) -> "MakeRun":
        with open(self.output_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "tandem_run"], cwd=ROOT, env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""

    def logs(self) -> str:
        chunks = []
        for path in sorted((self.var_dir / "logs").glob("*.log")):
            chunks.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(chunks)

    def wait_output(self, text: str, timeout: float = READY_TIMEOUT_S) -> str:
        """Wait until `text` is in the output; fail (with output and logs) if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"make run exited with {self.proc.returncode}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{self.output()}\n{self.logs()}"
            time.sleep(0.2)
        return self.output()

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"make run still runs after {timeout} s:\n{self.output()}") from None

    def api(self, method: str, path: str, token: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 15)
        return requests.request(method, f"{self.web_url}/api/v1/{path}",
                                headers={"Authorization": f"Token {token}"}, **kwargs)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; SIGKILL only if it does not end."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(120)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self.services.close()
