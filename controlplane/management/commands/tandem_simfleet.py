"""`python manage.py tandem_simfleet --nodes 100 --hosts 4`: the node agent of a simulated fleet
(controlplane.agent.simulated): registers the nodes, heartbeats them, and consumes every node's `node.<name>` queue.

Workers of a revision whose engine settings have `simulate` (a profile) run in the simulated worker hosts.
"""
from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Run a simulated fleet: many simulated nodes in one agent process, their workers in simulated hosts."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=10, help="how many simulated nodes")
        parser.add_argument("--hosts", type=int, default=2, help="simulated worker host processes")
        parser.add_argument("--prefix", default="sim", help="node names: PREFIX-000, PREFIX-001, ...")
        parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                            help="a label of every simulated node (repeatable); simulated=true is always set")
        parser.add_argument("--concurrency", type=int, default=None,
                            help="agent task threads (default: TANDEM_AGENT_CONCURRENCY)")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, nodes=10, hosts=2, prefix="sim", label=(), concurrency=None, loglevel="INFO",
               **options):
        from django.utils.text import slugify

        from controlplane.agent import runtime
        from controlplane.agent.fault_resume import faults_resume_after_restart
        from controlplane.agent.host import host_measure
        from controlplane.agent.node import node_adopt, node_register
        from controlplane.agent.simulated import FleetHeartbeat, SimulatedProcesses, hosts_start
        from controlplane.celery import app
        from controlplane.errors import ControlPlaneError
        from controlplane.services.nodes import validate_labels

        if not 1 <= nodes <= 10_000:
            raise CommandError(f"--nodes must be in 1..10000, got {nodes}")
        if not 1 <= hosts <= 99:
            raise CommandError(f"--hosts must be in 1..99, got {hosts}")
        if slugify(prefix) != prefix:
            raise CommandError(f"--prefix {prefix!r} must be a slug (lowercase letters, digits, '-')")
        labels = {"simulated": "true"}
        for item in label:
            key, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--label {item!r}: write KEY=VALUE, e.g. class=compute")
            labels[key.strip()] = value.strip()
        try:
            labels = validate_labels(labels, field="--label")
        except ControlPlaneError as exc:
            raise CommandError(exc.message) from None

        _, urls = hosts_start(hosts, log_dir=settings.TANDEM_LOG_DIR)
        # Where the hosts listen, for benches and tests that reach past the control plane (to crash a worker).
        (settings.VAR_DIR / f"simfleet-{prefix}.json").write_text(json.dumps({"hosts": urls, "nodes": nodes}))
        runtime.node_name = None  # one process for many nodes: tasks act on the row's node
        runtime.launcher = SimulatedProcesses(urls)
        runtime.simulated = True
        fleet = [node_register(name=f"{prefix}-{i:03d}", address="127.0.0.1", labels=labels) for i in range(nodes)]
        for node in fleet:
            faults_resume_after_restart(node_name=node.name, adopted=node_adopt(node=node))
            host_measure(node_name=node.name)  # a simulated roofline: no benchmark runs
        heartbeat = FleetHeartbeat(fleet, settings.TANDEM_HEARTBEAT_INTERVAL_S, on_agent_restart=lambda node, adopted:
                                   faults_resume_after_restart(node_name=node.name, adopted=adopted))
        heartbeat.start()
        self.stdout.write(f"simulated fleet: {nodes} nodes ({prefix}-000..), {hosts} worker hosts {urls}")
        try:
            app.worker_main([
                "worker", "--queues", ",".join(node.queue for node in fleet), "--hostname", f"simfleet.{prefix}@%h",
                "--pool", "threads", "--concurrency", str(concurrency or settings.TANDEM_AGENT_CONCURRENCY),
                "--without-gossip", "--without-mingle", "--loglevel", loglevel,
            ])
        finally:
            heartbeat.stop()
