"""The Celery app "tandem": queue `control` (the work each change asks for: reconcile of one deployment, webhook
deliveries, profile runs), queue `periodic` (beat's passes: reconcile_all, health, scrape, alert evaluation,
autoscaling, rollouts...) and one queue `node.<name>` per node agent.

Two control queues, so that the reconcile a scale asks for never waits behind a backlog of periodic passes (at a
thousand workers a scrape pass takes seconds): a control worker consumes both (`--queues control,periodic`, what
`make run` starts), and a large fleet runs a second worker process for `periodic` alone.

Configuration comes from Django settings with the CELERY_ prefix (controlplane/settings.py). Tasks live next to the
queue that runs them: controlplane/supervision/tasks.py (`control`), controlplane/agent/tasks.py (`node.<name>`),
and each app's own tasks.py. Beat runs reconcile_all and check_health every TANDEM_RECONCILE_INTERVAL_S; each beat message
expires after one interval, so a control worker that was down does not wake up to a backlog of stale passes.
"""
import logging
import os
import threading

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

log = logging.getLogger(__name__)

app = Celery("tandem")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["controlplane.supervision", "controlplane.agent"])

CONTROL_QUEUE = "control"
PERIODIC_QUEUE = "periodic"
# Task names that other modules enqueue by name (controlplane.celery.task_send).
RECONCILE_DEPLOYMENT = "controlplane.supervision.tasks.reconcile_deployment"
RECONCILE_ALL = "controlplane.supervision.tasks.reconcile_all"
RECONCILE_SHARED_GATEWAY = "controlplane.supervision.tasks.reconcile_shared_gateway"
CHECK_HEALTH = "controlplane.supervision.tasks.check_health"
AGENT_START_WORKER = "controlplane.agent.tasks.agent_start_worker"
AGENT_STOP_WORKER = "controlplane.agent.tasks.agent_stop_worker"
DELIVER_WEBHOOK = "controlplane.alerting.tasks.deliver_task"


@app.on_after_configure.connect
def _schedule(sender, **kwargs):
    from django.conf import settings

    interval = float(settings.TANDEM_RECONCILE_INTERVAL_S)
    options = {"queue": PERIODIC_QUEUE, "expires": interval}
    # Merged, not assigned: other apps (observability, alerting) add their own periodic tasks.
    sender.conf.beat_schedule = {
        **(sender.conf.beat_schedule or {}),
        "reconcile-all": {"task": RECONCILE_ALL, "schedule": interval, "options": options},
        "check-health": {"task": CHECK_HEALTH, "schedule": interval, "options": options},
    }
    # Control tasks never go to a node queue by accident; agent tasks are always sent with an explicit queue.
    sender.conf.task_routes = {
        **(sender.conf.task_routes or {}),
        RECONCILE_DEPLOYMENT: {"queue": CONTROL_QUEUE},
        RECONCILE_SHARED_GATEWAY: {"queue": CONTROL_QUEUE},
        RECONCILE_ALL: {"queue": PERIODIC_QUEUE},
        CHECK_HEALTH: {"queue": PERIODIC_QUEUE},
    }


def schedule_periodic(entries: dict[str, tuple]) -> None:
    """Periodic tasks of an app, {beat entry name: (task name, interval s[, kwargs])}, on the periodic queue. Each
    message expires after one interval: a control worker that was down wakes up to one fresh pass, not a backlog of
    stale ones. Joined after this module's own schedule (on_after_configure), or at once if Celery is configured."""
    def add(sender=None, **kwargs) -> None:
        options = {"queue": PERIODIC_QUEUE}
        app.conf.beat_schedule = {**(app.conf.beat_schedule or {}), **{
            name: {"task": entry[0], "schedule": entry[1], "kwargs": entry[2] if len(entry) > 2 else {},
                   "options": {**options, "expires": entry[1]}}
            for name, entry in entries.items()}}
        app.conf.task_routes = {**(app.conf.task_routes or {}),
                                **{entry[0]: options for entry in entries.values()}}

    if app.configured:
        add()
    app.on_after_configure.connect(add, weak=False)


def task_send(name: str, *, args: tuple = (), queue: str | None = None, countdown: float | None = None) -> bool:
    """Enqueue a registered task by its name, for code that must not import the task's module (an import loop:
    services enqueue reconcile, whose module imports services). The task object is looked up in the registry, so
    eager mode and tests that patch `apply_async` behave as with a direct call. Task modules are registered when
    Django starts (each AppConfig.ready imports its tasks).

    Publishing waits at most TANDEM_BROKER_TIMEOUT_S: a broker that accepts the connection and then stops
    answering would otherwise hold the caller (a web request) for minutes. Callers send after their change is
    committed, so a message that is late or lost costs a delay, not the change: reconcile runs from beat and picks
    it up. Returns whether the broker took the message in time; errors are raised as before.
    """
    from django.conf import settings

    task = app.tasks[name]
    options = {}
    if queue is not None:
        options["queue"] = queue
    if countdown is not None:
        options["countdown"] = countdown
    if app.conf.task_always_eager:
        task.apply_async(args=args, **options)  # runs here and now: nothing to wait for
        return True
    outcome: list[BaseException | None] = []
    abandoned = threading.Event()

    def publish() -> None:
        try:
            task.apply_async(args=args, **options)
        except BaseException as exc:  # handed to the caller below, or logged if it has stopped waiting
            outcome.append(exc)
            if abandoned.is_set():
                log.warning("publishing %s failed late: %r", name, exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=publish, name=f"publish-{name.rpartition('.')[2]}", daemon=True)
    thread.start()
    thread.join(settings.TANDEM_BROKER_TIMEOUT_S)
    if not outcome:
        abandoned.set()
        log.warning("the broker did not take %s within %s s; the change is committed and reconcile will pick it up",
                    name, settings.TANDEM_BROKER_TIMEOUT_S)
        return False
    if outcome[0] is not None:
        raise outcome[0]
    return True
