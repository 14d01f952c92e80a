"""Writing alert rules (admins): cross-field validation with messages that name the field, then one save."""
from __future__ import annotations

import re

from django.db import IntegrityError, transaction

from controlplane.alerting.models import CONTROL_LOOP_METRIC, AlertRule
from controlplane.alerting.models.rules import ScopeRole
from controlplane.alerting.services.action_kinds import ALERT, action_acts_on, action_validate
from controlplane.alerting.services.advice import advice_withdraw
from controlplane.errors import conflict, invalid
from controlplane.services.validation import each_object

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
LABEL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Labels the evaluator sets itself: a rule's own labels may not redefine an instance's identity.
RESERVED_LABELS = {"alertname", "severity", "deployment", "role", "worker", "tenant"}


def _label_map(value, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise invalid(f"{field} must be an object of strings", field=field)
    for key, item in value.items():
        if not LABEL_NAME_RE.fullmatch(str(key)):
            raise invalid(f"{field}: {key!r} is not a valid label name", field=f"{field}.{key}")
        if not isinstance(item, str):
            raise invalid(f"{field}.{key} must be a string", field=f"{field}.{key}")
    return dict(value)


def validate_actions(actions, *, role: str, per_worker: bool) -> list[dict]:
    """A list of action entries (action_kinds.ALERT_ACTIONS) → the same, normalised; 400 naming the entry for
    anything else."""
    if not isinstance(actions, list):
        raise invalid("actions must be a list", field="actions")
    return [action_validate(spec, where=where, role=role, per_worker=per_worker)
            for where, spec in each_object(actions, field="actions")]


def rule_validate(data: dict, *, instance: AlertRule | None = None) -> dict:
    """Check a full rule (merged with `instance` for a partial update). Returns the cleaned fields."""
    from controlplane.observability.series import AGGREGATIONS, METRICS

    merged = {}
    if instance is not None:
        merged = {f: getattr(instance, f) for f in ("name", "deployment", "role", "per_worker", "tenant", "metric",
                                                      "aggregation", "window_s", "comparison", "threshold",
                                                      "compare_to_offset_s", "for_s", "keep_firing_for_s",
                                                      "fire_on_no_data", "severity", "labels", "annotations",
                                                      "actions", "cooldown_s", "enabled", "advisory")}
    merged.update(data)
    name = merged.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise invalid("name must be 1-100 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
                      field="name")
    if merged.get("metric") not in METRICS and merged.get("metric") != CONTROL_LOOP_METRIC:
        raise invalid(f"unknown metric {merged.get('metric')!r}; known: {', '.join(METRICS)}, "
                      f"{CONTROL_LOOP_METRIC}", field="metric")
    if merged.get("aggregation", "avg") not in AGGREGATIONS:
        raise invalid(f"aggregation must be one of {', '.join(AGGREGATIONS)}", field="aggregation")
    for field in ("window_s", "for_s", "keep_firing_for_s", "cooldown_s"):
        value = merged.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(f"{field} must be a non-negative number of seconds, not {value!r}", field=field)
    if merged.get("window_s", 60) < 1:
        raise invalid("window_s must be at least 1 second", field="window_s")
    offset = merged.get("compare_to_offset_s")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 1):
        raise invalid("compare_to_offset_s must be a positive number of seconds (or null)",
                      field="compare_to_offset_s")
    if offset is not None and merged.get("threshold", 0) < 0:
        raise invalid("a relative rule's threshold is a ratio (e.g. 0.7 = down 30%) and cannot be negative",
                      field="threshold")
    role = merged.get("role") or ""
    if role not in ScopeRole.values:
        raise invalid("role must be one of prefill, decode, colocated, gateway or empty (every role)", field="role")
    deployment = merged.get("deployment")
    if role and role != ScopeRole.GATEWAY and deployment is not None:
        if not deployment.pools.filter(role=role).exists():
            raise invalid(f"deployment {deployment.name!r} has no {role} pool", field="role")
    merged["labels"] = _label_map(merged.get("labels") or {}, "labels")
    reserved = RESERVED_LABELS & set(merged["labels"])
    if reserved:
        raise invalid(f"labels may not set {sorted(reserved)}: the evaluator sets them", field="labels")
    merged["annotations"] = _label_map(merged.get("annotations") or {}, "annotations")
    merged["actions"] = validate_actions(merged.get("actions") or [], role=role,
                                         per_worker=bool(merged.get("per_worker")))
    if not isinstance(merged.get("advisory", False), bool):
        raise invalid("advisory must be true or false", field="advisory")
    merged["role"] = role
    merged["tenant"] = _tenant_scope(merged)
    if merged["metric"] == CONTROL_LOOP_METRIC:
        _control_loop_scope(merged)
    return merged


def _control_loop_scope(merged: dict) -> None:
    """A control-loop rule is about the control plane itself, stepped per loop by the web process's watchdog
    (alerting.services.watchdog): no deployment, role, worker or tenant to scope it, nothing to do but notify."""
    for field, value in (("deployment", merged.get("deployment")), ("role", merged.get("role")),
                         ("per_worker", merged.get("per_worker")),
                         ("compare_to_offset_s", merged.get("compare_to_offset_s"))):
        if value:
            raise invalid(f"{CONTROL_LOOP_METRIC} is the control plane's own, per control loop: {field} must be "
                          f"empty", field=field)
    for index, action in enumerate(merged["actions"]):
        if action_acts_on(action) != ALERT:
            raise invalid(f"actions[{index}]: a control-loop rule may only notify", field=f"actions[{index}].type")


def _tenant_scope(merged: dict) -> str:
    """The rule's tenant ("" for none), checked against its metric, scope and actions: a tenant's series are per
    deployment as its gateways measured them, and some series exist only per tenant."""
    from controlplane.observability.catalog import TENANT_METRICS, TENANT_ONLY_METRICS
    from controlplane.tenants.models import Tenant

    tenant, metric = merged.get("tenant") or "", merged.get("metric")
    if not isinstance(tenant, str):
        raise invalid("tenant must be a tenant's name (or empty: no tenant)", field="tenant")
    if not tenant:
        if metric in TENANT_ONLY_METRICS:
            raise invalid(f"metric {metric!r} exists per tenant only: set tenant to the tenant it is about",
                          field="tenant")
        return ""
    if not Tenant.objects.filter(name=tenant).exists():
        raise invalid(f"no tenant named {tenant!r}", field="tenant")
    if metric not in TENANT_METRICS:
        raise invalid(f"metric {metric!r} is not stored per tenant; a rule with a tenant reads one of "
                      f"{', '.join(TENANT_METRICS)}", field="metric")
    if merged.get("role") not in ("", ScopeRole.GATEWAY):
        raise invalid("a tenant's series are its gateways': role must be gateway or empty", field="role")
    if merged.get("per_worker"):
        raise invalid("a tenant's series are per deployment, not per worker: per_worker must be false",
                      field="per_worker")
    if merged.get("fire_on_no_data"):
        raise invalid("a tenant's series exist only while it sends requests, so no data is its usual state: a rule "
                      "with a tenant cannot fire on no data", field="fire_on_no_data")
    for index, action in enumerate(merged["actions"]):
        if action_acts_on(action) != ALERT:
            raise invalid(f"actions[{index}]: a rule scoped to a tenant may only notify (it is about one "
                          f"tenant's traffic, not the pools')", field=f"actions[{index}].type")
    return tenant


def rule_create(**data) -> AlertRule:
    clean = rule_validate(data)
    try:
        with transaction.atomic():
            return AlertRule.objects.create(**clean)
    except IntegrityError:
        raise conflict(f"an alert rule named {clean['name']!r} already exists", field="name") from None


def rule_update(*, rule: AlertRule, **data) -> AlertRule:
    """Save the changes; a rule that stops advising (advisory off, disabled) or whose actions changed withdraws its
    open advice (services.advice): it is no longer what the rule would do."""
    clean = rule_validate(data, instance=rule)
    withdrawn = _withdrawal(rule, clean)
    for field, value in clean.items():
        setattr(rule, field, value)
    try:
        with transaction.atomic():
            rule.save()
            if withdrawn:
                advice_withdraw(rule=rule, outcome=f"superseded: {withdrawn}")
    except IntegrityError:
        raise conflict(f"an alert rule named {clean['name']!r} already exists", field="name") from None
    return rule


def _withdrawal(rule: AlertRule, clean: dict) -> str:
    if rule.advisory and not clean.get("advisory"):
        return "the rule's advisory mode was turned off"
    if rule.enabled and not clean.get("enabled", True):
        return "the rule was disabled"
    if clean["actions"] != rule.actions:
        return "the rule's actions changed"
    return ""


def rule_delete(*, rule: AlertRule) -> None:
    rule.delete()
