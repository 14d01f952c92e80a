"""A pass reads each kind of series once for all the rules that read it (the default rules of every deployment are
hundreds of rules over a handful of series), and every rule observes exactly what its own read would have: its own
deployment's instances, or every deployment's for a rule of all deployments, silent workers included."""
from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.alerting.models import AlertRule
from controlplane.alerting.services.evaluation import _observations_by_rule, evaluate_rules, rule_observations


def _fleet(make_deployment, make_worker, write_sample, at, n: int):
    deployments = [make_deployment(f"dep-{i}") for i in range(n)]
    for i, deployment in enumerate(deployments):
        worker = make_worker(deployment, "decode")
        make_worker(deployment, "decode", port=43000 + i)  # silent: no sample
        write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.5 + i / 100, at(0))
        write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.2 + i / 100, at(0), worker=worker)
    return deployments


def test_each_rule_observes_what_its_own_read_would(make_deployment, make_worker, write_sample, make_rule, at):
    deployments = _fleet(make_deployment, make_worker, write_sample, at, 3)
    make_rule(None, name="all-pools", comparison=">", threshold=0.51)
    make_rule(None, name="all-workers", per_worker=True, compare_to_offset_s=30)
    for deployment in deployments:
        make_rule(deployment, name=f"{deployment.name}-workers", per_worker=True)
    rules = list(AlertRule.objects.filter(enabled=True).order_by("id"))
    ids = [d.id for d in deployments]
    batched = _observations_by_rule(rules, now=at(1), deployment_ids=ids)
    for rule in rules:
        assert batched[rule.id] == rule_observations(rule, now=at(1)), rule.name
    assert {o.deployment_id for o in batched[AlertRule.objects.get(name="all-pools").id]} == set(ids)
    own = batched[AlertRule.objects.get(name="dep-1-workers").id]
    assert {o.deployment_id for o in own} == {deployments[1].id} and len(own) == 2
    assert sorted(o.value is None for o in own) == [False, True]  # the silent worker is observed, with no value


def test_the_queries_of_a_pass_do_not_grow_with_the_deployments(make_deployment, make_worker, write_sample, at):
    _fleet(make_deployment, make_worker, write_sample, at, 2)
    evaluate_rules(now=at(1))
    with CaptureQueriesContext(connection) as few:
        evaluate_rules(now=at(2))
    _fleet_more = [make_deployment(f"more-{i}") for i in range(4)]
    assert AlertRule.objects.filter(deployment__in=_fleet_more).exists()  # each came with its default rules
    with CaptureQueriesContext(connection) as many:
        evaluate_rules(now=at(3))
    assert len(many) <= len(few) + 2, (len(few), len(many))
