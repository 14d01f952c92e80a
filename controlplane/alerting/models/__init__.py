"""Alerting state. Rules are configuration; alerts, transitions, action runs, advice and deliveries are history
rows."""
from .advice import ActionAdvice, ActionAdviceStatus
from .alerts import ACTIVE_STATES, Alert, AlertState, AlertTransition, RuleActionRun, RunStatus, Silence
from .channels import Channel, ChannelKind, Delivery, DeliveryStatus
from .rules import CONTROL_LOOP_METRIC, AlertRule, Aggregation, Comparison, Severity

__all__ = [
    "ActionAdvice", "ActionAdviceStatus",
    "ACTIVE_STATES", "Alert", "AlertState", "AlertTransition", "RuleActionRun", "RunStatus", "Silence",
    "Channel", "ChannelKind", "Delivery", "DeliveryStatus",
    "CONTROL_LOOP_METRIC", "AlertRule", "Aggregation", "Comparison", "Severity",
]
