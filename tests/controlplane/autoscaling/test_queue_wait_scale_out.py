"""Through the real evaluation path: a gateway whose admission queue makes requests wait, and a decode worker whose
inter-token latency is fine, both scraped over HTTP into the store; the autoscaler's Celery task then scales the
decode pool out because of the queue wait, and the action row says so."""
import logging
import time

from prometheus_client import CollectorRegistry

from controlplane.autoscaling.services import autoscaling_update
from controlplane.autoscaling.tasks import autoscale_cycle_task
from controlplane.models import Action, ActorType, Pool
from controlplane.observability.store import scrape_cycle
from inference.gateway.admission import Admission
from inference.gateway.fair_queue import Waiter
from inference.gateway.config import Config
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.routing import Router
from inference.metrics import TandemMetrics


def test_the_autoscaler_task_scales_decode_out_on_a_stored_queue_wait(deployment, make_worker, metrics_servers,
                                                                      operator, caplog):
    gateway = GatewayMetrics(model="demo", router=Router(Config(port=0, colocated_urls=["http://127.0.0.1:1"])))
    admission = Admission(lambda: 4)
    gateway.registry.register(admission.collector("demo"))
    decode = TandemMetrics(role="decode", model="demo", registry=CollectorRegistry(), gpu=False)
    make_worker(deployment, "gateway", port=metrics_servers.serve(lambda: (200, gateway.render())))
    make_worker(deployment, "decode", port=metrics_servers.serve_metrics(decode))
    autoscaling_update(deployment=deployment, actor=operator, enabled=True,
                       pools={"decode": {"queue_wait_target": 0.5}})

    admission._admit("acme", "standard", 0.0)  # served before: its series exist at the first scrape
    now = time.time()
    scrape_cycle(now=now - 5)
    # Between the scrapes the decode worker streams at 20 ms a token (a fifth of its 100 ms target), while the
    # gateway admits 50 requests after 2 s each in its queue and 3 more wait.
    for _ in range(50):
        decode.inter_token_latency.observe(0.02)
        decode.count_success("stop")
        admission._admit("acme", "standard", 2.0)
    for _ in range(3):
        admission.queue.push(Waiter("acme", "standard", enqueued=0.0, deadline=30.0))
    scrape_cycle(now=now)

    with caplog.at_level(logging.INFO, logger="controlplane.autoscaling.autoscaler"):
        result = autoscale_cycle_task()

    assert result["num_scaled"] == 1
    [action] = Action.objects.filter(deployment=deployment, kind="scale", actor_type=ActorType.AUTOSCALER)
    assert action.params == {"role": "decode", "from": 1, "to": 3}  # the step of ±2 bounds it
    assert "queue wait P99 2.4" in action.reason and "s > target 0.5 s" in action.reason, action.reason
    assert "itl_p99_seconds 0.0" in action.reason  # the worker metric alone would keep 1
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3
    assert any("1 → 3" in r.getMessage() and "queue wait P99 2.4" in r.getMessage() for r in caplog.records)
