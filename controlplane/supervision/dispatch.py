"""Hand work to node agents: a task on the worker's node queue (`node.<name>`), sent after the transaction that
wrote the row commits, so that the agent reads what reconcile decided."""
from __future__ import annotations

from django.conf import settings
from django.db import transaction

from controlplane.models import Worker


def send_start(worker: Worker) -> None:
    from controlplane.tasks import agent_start_worker

    worker_id, queue = worker.id, worker.node.queue
    transaction.on_commit(lambda: agent_start_worker.apply_async(args=(worker_id,), queue=queue))


def send_stop(worker: Worker, deadline_s: float | None = None) -> None:
    from controlplane.tasks import agent_stop_worker

    worker_id, queue = worker.id, worker.node.queue
    deadline = settings.TANDEM_STOP_DEADLINE_S if deadline_s is None else deadline_s
    transaction.on_commit(lambda: agent_stop_worker.apply_async(args=(worker_id, deadline), queue=queue))
