"""Each worker of a revision is launched with the common engine settings overridden by its own role's part: a
prefill and a decode worker of one revision get different flags. Threads: the revision's setting, else the pool's
threads_per_worker."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from controlplane.agent import launch
from controlplane.agent.workers import worker_start
from controlplane.models import Worker, WorkerStatus
from controlplane.services import action_succeed, revision_create
from inference.worker.config import parse_args

PER_ROLE = {"common": {"threads": 1, "max_num_seqs": 32, "dtype": "float32"},
            "prefill": {"max_num_batched_tokens": 4096},
            "decode": {"max_num_seqs": 256}}

# A stand-in for `python -m inference.worker` that serves /health and keeps, as its own arguments, the command
# line the agent built for the real worker: the test reads it back from the running process.
RECORDING_WORKER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


@pytest.fixture
def per_role_revision(deployment, admin):
    action = revision_create(deployment=deployment, actor=admin, engine_settings=PER_ROLE, comment="per role")
    action_succeed(action_id=action.pk)
    deployment.refresh_from_db()
    return deployment.current_revision


def _engine_config(worker: Worker):
    argv = launch.argv_for(worker, 1234)
    return parse_args(argv[argv.index("inference.worker") + 1:]).engine


def test_a_prefill_and_a_decode_worker_of_one_revision_get_their_roles_flags(deployment, online_node,
                                                                              per_role_revision):
    assert per_role_revision.engine_settings == {"common": {"threads": 1, "max_num_seqs": 32},
                                                 "prefill": {"max_num_batched_tokens": 4096},
                                                 "decode": {"max_num_seqs": 256}}
    assert per_role_revision.dtype == "float32"  # common.dtype is the revision's dtype
    prefill = _engine_config(Worker(deployment=deployment, role="prefill", node=online_node, id=98,
                                    revision=per_role_revision))
    decode = _engine_config(Worker(deployment=deployment, role="decode", node=online_node, id=99,
                                   revision=per_role_revision))
    assert (prefill.max_num_seqs, prefill.max_num_batched_tokens) == (32, 4096)
    assert (decode.max_num_seqs, decode.max_num_batched_tokens) == (256, 2048)  # 2048: the worker's default
    assert prefill.dtype == decode.dtype == "float32"


def test_the_agent_starts_each_role_with_its_own_command_line(deployment, online_node, per_role_revision,
                                                              monkeypatch, tmp_path, settings, cleanup_processes):
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    real_argv_for = launch.argv_for
    monkeypatch.setattr(launch, "argv_for", lambda worker, port: [
        sys.executable, "-c", RECORDING_WORKER, str(port), json.dumps(real_argv_for(worker, port))])
    started = {}
    for role in ("prefill", "decode"):
        worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role=role), role=role,
                                       revision=per_role_revision, node=online_node, status=WorkerStatus.PENDING)
        assert worker_start(worker_id=worker.id, node_name=online_node.name) == "started"
        worker.refresh_from_db()
        cleanup_processes.append(launch.handle_of(worker))
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
        argv = json.loads(cmdline[-2] if cmdline[-1] == b"" else cmdline[-1])
        started[role] = parse_args(argv[argv.index("inference.worker") + 1:]).engine
    assert started["prefill"].max_num_seqs == 32 and started["decode"].max_num_seqs == 256
    assert started["prefill"].max_num_batched_tokens == 4096 and started["decode"].max_num_batched_tokens == 2048


def test_threads_come_from_the_revision_else_from_the_pools_threads_per_worker(deployment, online_node, admin):
    deployment.pools.filter(role="decode").update(threads_per_worker=3)
    decode_pool = deployment.pools.get(role="decode")
    revision_create(deployment=deployment, actor=admin, engine_settings={"prefill": {"threads": 2}})
    deployment.refresh_from_db()
    revision = deployment.current_revision
    decode = Worker(deployment=deployment, role="decode", pool=decode_pool, node=online_node, id=99,
                    revision=revision)
    prefill = Worker(deployment=deployment, role="prefill", pool=deployment.pools.get(role="prefill"),
                     node=online_node, id=98, revision=revision)
    assert _engine_config(decode).threads == 3 and launch.env_for(decode)["OMP_NUM_THREADS"] == "3"
    assert _engine_config(prefill).threads == 2 and launch.env_for(prefill)["OMP_NUM_THREADS"] == "2"
