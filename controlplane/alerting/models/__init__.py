"""Alerting state. Rules are configuration; alerts, transitions, action runs and deliveries are history rows."""
from .alerts import ACTIVE_STATES, Alert, AlertState, AlertTransition, RuleActionRun, RunStatus, Silence
from .channels import Channel, ChannelKind, Delivery, DeliveryStatus
from .rules import CONTROL_LOOP_METRIC, AlertRule, Aggregation, Comparison, Severity

__all__ = [
    "ACTIVE_STATES", "Alert", "AlertState", "AlertTransition", "RuleActionRun", "RunStatus", "Silence",
    "Channel", "ChannelKind", "Delivery", "DeliveryStatus",
    "CONTROL_LOOP_METRIC", "AlertRule", "Aggregation", "Comparison", "Severity",
]
