"""Hand work to node agents: a task on the worker's node queue (`node.<name>`), sent after the transaction that
wrote the row commits, so that the agent reads what reconcile decided. Sent by name: the agent's code runs on its
own host, and supervision does not import it."""
from __future__ import annotations

from django.conf import settings
from django.db import transaction

from controlplane.celery import AGENT_START_WORKER, AGENT_STOP_WORKER, task_send
from controlplane.models import Worker


def send_start(worker: Worker) -> None:
    worker_id, queue = worker.id, worker.node.queue
    transaction.on_commit(lambda: task_send(AGENT_START_WORKER, args=(worker_id,), queue=queue))


def send_stop(worker: Worker, deadline_s: float | None = None) -> None:
    worker_id, queue = worker.id, worker.node.queue
    deadline = settings.TANDEM_STOP_DEADLINE_S if deadline_s is None else deadline_s
    transaction.on_commit(lambda: task_send(AGENT_STOP_WORKER, args=(worker_id, deadline), queue=queue))
