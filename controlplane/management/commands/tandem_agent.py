"""`python manage.py tandem_agent --name local`: the node agent, a Celery worker consuming `node.<name>`.

In-process (app.worker_main) rather than a `celery worker` child: the agent's heartbeat thread and its tasks share
one process, which is the parent of the workers it spawns and so can reap them.
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Run the node agent: register the node, re-adopt its workers, heartbeat, and consume node.<name>."

    def add_arguments(self, parser):
        parser.add_argument("--name", default=None, help="node name (default: TANDEM_NODE_NAME, 'local')")
        parser.add_argument("--address", default=None,
                            help="address other hosts reach this node's workers at (default: TANDEM_NODE_ADDRESS, "
                                 "'127.0.0.1': one host only)")
        parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                            help="a label of this node that pools can select (repeatable), e.g. class=compute")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, name=None, address=None, loglevel="INFO", label=(), **options):
        from django.utils.text import slugify

        from controlplane.agent import runtime
        from controlplane.agent.fault_resume import faults_resume_after_restart
        from controlplane.agent.engines import engines_probe_in_background
        from controlplane.agent.host import host_measure_in_background
        from controlplane.agent.node import Heartbeat, node_adopt, node_register
        from controlplane.celery import app
        from controlplane.errors import ControlPlaneError
        from controlplane.services.nodes import validate_labels

        name = name or settings.TANDEM_NODE_NAME
        if slugify(name) != name:
            raise CommandError(f"node name {name!r} must be a slug (lowercase letters, digits, '-')")
        labels = {}
        for item in label:
            key, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--label {item!r}: write KEY=VALUE, e.g. class=compute")
            labels[key.strip()] = value.strip()
        try:
            labels = validate_labels(labels, field="--label")
        except ControlPlaneError as exc:
            raise CommandError(exc.message) from None
        runtime.node_name = name
        node = node_register(name=name, address=address or settings.TANDEM_NODE_ADDRESS, labels=labels)
        adopted = node_adopt(node=node)
        # Before consuming: a broker this node's last agent froze would hold this one's first message forever.
        faults_resume_after_restart(node_name=node.name, adopted=adopted)
        if settings.TANDEM_HOST_MEASURE:
            host_measure_in_background(node_name=node.name)  # a child process, a few seconds: start is not held up
        engines_probe_in_background(node_name=node.name)  # likewise: which vLLM this host has
        heartbeat = Heartbeat(node, settings.TANDEM_HEARTBEAT_INTERVAL_S)
        heartbeat.start()
        try:
            app.worker_main([
                "worker", "--queues", node.queue, "--hostname", f"agent.{name}@%h",
                # Threads: a stop blocks for its drain deadline; others must not wait behind it.
                "--pool", "threads", "--concurrency", str(settings.TANDEM_AGENT_CONCURRENCY),
                "--without-gossip", "--without-mingle", "--loglevel", loglevel,
            ])
        finally:
            heartbeat.stop()
