"""Supervision: the control plane's side of running workers (reconcile, health, restarts, rollouts).

Everything here works on ids and rows and is called by thin Celery tasks in controlplane.supervision.tasks; the node agent
(controlplane.agent) is the only code that touches processes.
"""
