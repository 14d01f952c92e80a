"""`make run` = `python manage.py tandem_run`: everything on this machine, in one foreground command.

1. Check that TANDEM_PROMETHEUS_URL answers a query (the prometheus metrics backend only) and the web and gateway
   ports (every run: a busy one is a clear error naming its holder), migrate, prepare the demo model
   (TANDEM_DEMO_MODEL: smollm2 or tiny), ensure the admin user and the `demo` deployment (1 prefill, 1 decode,
   gateway on TANDEM_GATEWAY_PORT, moved there when the setting changed).
2. Start and supervise web (runserver), one Celery control worker, Celery beat and the node agent (which labels
   this node tandem.demo=true, the label both demo pools select); a child that dies is restarted with backoff, and
   each restart is an action row (actor system "tandem_run").
3. Once the gateway's /health says it can serve (no test requests: they would count as client errors): print the
   dashboard URL, an API token and curl examples; send demo requests (TANDEM_DEMO_LOAD=0 turns them off). A demo
   worker that restarts or fails meanwhile is reported as it happens.
4. Ctrl-C or SIGTERM: stop beat, the control worker and the agent, then the worker and gateway processes of this
   node (controlplane.run.shutdown), then web.
"""
from __future__ import annotations

import os
import signal
import threading
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from controlplane.errors import ControlPlaneError
from controlplane.run.ports import PortBusy, port_check
from controlplane.run.stack import Stack, child_specs

READY_TIMEOUT_S = 600


class Command(BaseCommand):
    help = "Run Tandem locally: web, Celery control worker and beat, node agent, and the demo deployment."

    def add_arguments(self, parser):
        parser.add_argument("--embedded-beat", action="store_true",
                            help="run beat inside the control worker (one process fewer)")

    def out(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()

    def handle(self, *args, embedded_beat: bool = False, **options):
        from controlplane.run import demo, demo_load
        from controlplane.run.shutdown import node_processes_stop

        started, started_at = time.monotonic(), timezone.now()
        web_port, gateway_port = settings.TANDEM_WEB_PORT, settings.TANDEM_GATEWAY_PORT
        if web_port == gateway_port:
            raise CommandError(f"TANDEM_WEB_PORT and TANDEM_GATEWAY_PORT are both {web_port}; set them apart")
        if settings.TANDEM_METRICS_BACKEND == "prometheus":
            self._prometheus_check()
        # Every run, before anything starts: a busy port is one clear line now, not a gateway that crash-loops
        # into `failed` behind a silent wait.
        self._port_check(web_port, what="the web server's", setting="TANDEM_WEB_PORT", avoid=(gateway_port,))
        call_command("migrate", interactive=False, verbosity=0)
        self._port_check(gateway_port, what="the demo gateway's", setting="TANDEM_GATEWAY_PORT",
                         own_pids=demo.demo_gateway_pids(), avoid=(web_port,))
        self.out(f"preparing the demo model ({settings.TANDEM_DEMO_MODEL}) ...")
        model_path = demo.model_prepare(settings.TANDEM_DEMO_MODEL)
        admin = demo.admin_ensure()
        try:
            deployment, what = demo.demo_deployment_ensure(model_path)
        except ControlPlaneError as error:
            raise CommandError(error.message) from None
        gateway_url = f"http://127.0.0.1:{deployment.gateway_port}"
        self.out(f"demo deployment: {what} (model {model_path.name}, gateway port {deployment.gateway_port})")
        vllm_url = self._vllm_demo(model_path) if settings.TANDEM_DEMO_ENGINE == "vllm" else None

        stop_requested = threading.Event()

        def on_signal(signum, frame):
            stop_requested.set()

        # SIGHUP too: a closed terminal must stop the stack, not orphan it.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, on_signal)

        log_dir = settings.TANDEM_LOG_DIR

        specs = child_specs(web_port=settings.TANDEM_WEB_PORT, node_name=settings.TANDEM_NODE_NAME,
                            var_dir=settings.VAR_DIR, embedded_beat=embedded_beat,
                            node_labels=demo.DEMO_NODE_LABELS)
        stack = Stack(specs, log_dir=log_dir, env=dict(os.environ),
                      cwd=settings.BASE_DIR, on_event=self.out)
        stack.start()
        self.out(f"started {', '.join(stack.children)} (logs in {log_dir}); waiting for the demo gateway ...")
        load = vllm_load = None
        if vllm_url is not None:
            threading.Thread(target=self._wait_vllm, name="ready-vllm", daemon=True,
                             kwargs=dict(gateway_url=vllm_url, stop_requested=stop_requested)).start()
        watch = demo.DemoWatch(deployment.pk, since=started_at, report=self.out)
        waiter = threading.Thread(target=self._wait_ready, name="ready", daemon=True, kwargs=dict(
            gateway_url=gateway_url, started=started, admin=admin, stop_requested=stop_requested, watch=watch))
        waiter.start()
        try:
            while not stop_requested.wait(0.5):
                for name in stack.poll():
                    self._record_restart(stack, name)
                if load is None and settings.TANDEM_DEMO_LOAD and getattr(self, "ready", False):
                    load = demo_load.DemoLoad(gateway_url, report=self.out)
                    load.start()
                if vllm_load is None and settings.TANDEM_DEMO_LOAD and getattr(self, "vllm_ready", False):
                    vllm_load = demo_load.DemoLoad(vllm_url, model="demo-vllm", report=self.out)
                    vllm_load.start()
        finally:
            self.out("stopping ...")
            for running in (load, vllm_load):
                if running is not None:
                    running.stop()
            stopping = time.monotonic()
            # Nothing may start or restart a worker while they are stopped: the agent, beat and control go first.
            stack.stop([name for name in ("beat", "control", "agent") if name in stack.children])
            celery_s = time.monotonic() - stopping
            outcomes = node_processes_stop(node_name=settings.TANDEM_NODE_NAME, reason="stopped by make run's exit")
            workers_s = time.monotonic() - stopping - celery_s
            stack.stop(["web"])
            self.out(f"stopped in {time.monotonic() - stopping:.1f} s (Celery and agent {celery_s:.1f} s, "
                     f"{len(outcomes)} worker and gateway processes {workers_s:.1f} s). Bye.")

    def _prometheus_check(self) -> None:
        """TANDEM_PROMETHEUS_URL must answer a PromQL query before anything starts: an unreachable or wrong URL (not
        Prometheus, or a path it does not serve the API under) is one line now, not a stack whose pages, alerts and
        autoscaler all hold still on `metrics unavailable`."""
        from controlplane.observability.promql import MetricsUnavailable, PrometheusReader

        prometheus = PrometheusReader(url=settings.TANDEM_PROMETHEUS_URL,
                                      timeout_s=settings.TANDEM_PROMETHEUS_TIMEOUT_S)
        try:
            prometheus.query("vector(1)", at=time.time())
        except MetricsUnavailable as error:
            raise CommandError(f"TANDEM_METRICS_BACKEND=prometheus: {error}; check TANDEM_PROMETHEUS_URL") from None

    def _port_check(self, port: int, **kwargs) -> None:
        try:
            port_check(port, **kwargs)
        except PortBusy as busy:
            raise CommandError(str(busy)) from None

    def _record_restart(self, stack: Stack, name: str) -> None:
        """The audit-log row of a restart of one of make run's own processes (shown on the actions page)."""
        from controlplane.run.audit import stack_restart_record

        child = stack.children[name]
        try:
            stack_restart_record(process=name, exit_code=child.exits[-1] if child.exits else None,
                                 num_restarts=child.num_restarts, log_path=str(child.log_path))
        except Exception as exc:  # the database may be what failed; the supervisor must go on either way
            self.out(f"warning: the restart of {name} could not be recorded in the audit log: {exc}")

    def _vllm_demo(self, model_path) -> str:
        """The `demo-vllm` deployment ensured (TANDEM_DEMO_ENGINE=vllm); its gateway's URL."""
        from controlplane.run import demo_vllm

        port = demo_vllm.vllm_demo_gateway_port()
        self._port_check(port, what="the vLLM demo gateway's", setting="TANDEM_GATEWAY_PORT (+1)",
                         avoid=(settings.TANDEM_WEB_PORT,))
        try:
            deployment, what = demo_vllm.vllm_demo_ensure(model_path)
        except ControlPlaneError as error:
            raise CommandError(error.message) from None
        self.out(f"vLLM demo deployment {deployment.name}: {what} (gateway port {deployment.gateway_port}; "
                 f"vLLM from {settings.TANDEM_VLLM_PYTHON or 'nowhere: set TANDEM_VLLM_PYTHON'})")
        return f"http://127.0.0.1:{deployment.gateway_port}"

    def _wait_vllm(self, *, gateway_url, stop_requested) -> None:
        """Until the vLLM demo serves (vLLM loads for about a minute): then a line with its curl example."""
        from controlplane.run import demo

        try:
            demo.gateway_wait(gateway_url, timeout_s=READY_TIMEOUT_S + 300,
                              is_running=lambda: not stop_requested.is_set())
        except (TimeoutError, demo.NotReady) as exc:
            self.out(f"warning: the vLLM demo is not ready: {exc}; see {settings.TANDEM_LOG_DIR}/demo-vllm-*.log")
            return
        finally:
            connection.close()
        if stop_requested.is_set():
            return
        self.vllm_ready = True
        body = '{"model": "demo-vllm", "prompt": "The capital of France is", "max_tokens": 16}'
        self.out(f"vLLM demo ready: curl -s {gateway_url}/v1/completions -H 'Content-Type: application/json' "
                 f"-d '{body}'")

    def _wait_ready(self, *, gateway_url, started, admin, stop_requested, watch) -> None:
        from controlplane.run import demo

        def is_running() -> bool:
            return not stop_requested.is_set()

        try:
            try:
                waited = demo.gateway_wait(gateway_url, timeout_s=READY_TIMEOUT_S, is_running=is_running,
                                           check=watch)
            except demo.NotReady as problem:
                self.out(f"error: {problem}\n  The rest keeps running: the dashboard shows the worker, and its "
                         "Restart button (or a fix and another `make run`) tries again. Ctrl-C stops everything.")
                left = max(1.0, READY_TIMEOUT_S - (time.monotonic() - started))
                waited = demo.gateway_wait(gateway_url, timeout_s=left, is_running=is_running)
        except TimeoutError as exc:
            self.out(f"warning: {exc}; see the logs in {settings.TANDEM_LOG_DIR}")
            return
        finally:
            connection.close()  # this thread's own database connection
        if waited is None or stop_requested.is_set():
            return  # Ctrl-C while waiting: nothing went wrong, nothing to say
        self.ready = True
        web = f"http://127.0.0.1:{settings.TANDEM_WEB_PORT}"
        if admin.password and admin.generated:
            login = f"user {admin.username}, password {admin.password} (shown only now; only its hash is stored)"
        elif admin.from_env:
            login = f"user {admin.username}, password from TANDEM_ADMIN_PASSWORD"
        else:
            login = f"user {admin.username}, password shown on the first run; set TANDEM_ADMIN_PASSWORD to reset it"
        from controlplane.run.memory import stack_memory

        try:
            memory = stack_memory(node_name=settings.TANDEM_NODE_NAME)
        finally:
            connection.close()  # this thread's own database connection, opened again for the workers' pids
        body = '{"model": "demo", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
        self.out("\n".join([
            f"Tandem is ready in {time.monotonic() - started:.1f} s.",
            f"  dashboard  {web}/  ({login})",
            f"  API token  {admin.token}  (admin)",
            f"  API docs   {web}/api/docs/",
            f"  memory     {memory.line()}",
            f"  try        curl -s {gateway_url}/v1/completions -H 'Content-Type: application/json' -d '{body}'",
            f"             curl -s -H 'Authorization: Token {admin.token}' {web}/api/v1/workers/",
            "  demo load  " + ("one request every 2 s (TANDEM_DEMO_LOAD=0 turns it off)" if settings.TANDEM_DEMO_LOAD
                               else "off"),
            "Ctrl-C stops everything.",
        ]))
