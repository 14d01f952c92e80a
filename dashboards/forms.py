"""Form input checks for the buttons that take more than one click (silences, alert rules). Types and ranges here;
the alerting services check the rest and answer ControlPlaneError with a message naming the field."""
from __future__ import annotations

import json

from django import forms

from controlplane.alerting.models import CONTROL_LOOP_METRIC, Aggregation, Comparison, Severity
from controlplane.alerting.models.rules import ScopeRole
from controlplane.alerting.services.action_kinds import actions_help
from controlplane.models import Deployment
from controlplane.observability.catalog import METRICS

MAX_SECONDS = 366 * 86400
SILENCE_DURATIONS = [("900", "15 minutes"), ("3600", "1 hour"), ("14400", "4 hours"), ("86400", "24 hours"),
                     ("604800", "7 days")]


class SilenceForm(forms.Form):
    duration_s = forms.TypedChoiceField(choices=SILENCE_DURATIONS, coerce=int, initial="3600", label="for")
    comment = forms.CharField(max_length=2000, widget=forms.TextInput(attrs={"placeholder": "why (required)"}))


class JSONField(forms.CharField):
    """A JSON object or list typed into a textarea."""

    def __init__(self, *, kind: type, **kwargs):
        self.kind = kind
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 2}))
        super().__init__(**kwargs)

    def prepare_value(self, value):
        return value if isinstance(value, str) else json.dumps(value)

    def clean(self, value):
        value = super().clean(value).strip()
        if not value:
            return self.kind()
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})")
        if not isinstance(parsed, self.kind):
            raise forms.ValidationError(f"must be a JSON {'object' if self.kind is dict else 'list'}")
        return parsed


def _seconds(label: str, *, required: bool = False, initial=0) -> forms.IntegerField:
    return forms.IntegerField(min_value=0, max_value=MAX_SECONDS, required=required, initial=initial, label=label)


class RuleForm(forms.Form):
    name = forms.CharField(max_length=100)
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.order_by("name"), to_field_name="name",
                                        required=False, empty_label="every deployment")
    role = forms.ChoiceField(choices=ScopeRole.choices, required=False)
    per_worker = forms.BooleanField(required=False, label="one alert per worker")
    tenant = forms.CharField(max_length=63, required=False,
                             help_text="a tenant's name: read its series (one alert per deployment it uses)")
    # The control plane's own loops last: a rule on them is stepped by /healthz (alerting.services.watchdog).
    metric = forms.ChoiceField(choices=[(m, m) for m in (*METRICS, CONTROL_LOOP_METRIC)])
    aggregation = forms.ChoiceField(choices=Aggregation.choices, initial=Aggregation.AVG)
    window_s = forms.IntegerField(min_value=1, max_value=MAX_SECONDS, initial=60, label="window (s)")
    comparison = forms.ChoiceField(choices=Comparison.choices)
    threshold = forms.FloatField()
    compare_to_offset_s = forms.IntegerField(min_value=1, max_value=MAX_SECONDS, required=False,
                                             label="compare to value this many s ago (ratio)")
    for_s = _seconds("for (s)")
    keep_firing_for_s = _seconds("keep firing for (s)")
    fire_on_no_data = forms.BooleanField(required=False, label="fire when there is no data")
    severity = forms.ChoiceField(choices=Severity.choices, initial=Severity.WARNING)
    cooldown_s = _seconds("cooldown (s)", initial=300)
    enabled = forms.BooleanField(required=False, initial=True)
    advisory = forms.BooleanField(required=False, label="advisory: record scale, restart and rollback as advice "
                                                        "to apply instead of acting (notify still goes)")
    actions = JSONField(kind=list, help_text='e.g. [{"type": "scale", "direction": "up", "step": 1}, '
                                             f'{{"type": "notify"}}]. Types: {actions_help()}')
    labels = JSONField(kind=dict)
    annotations = JSONField(kind=dict)

    def service_kwargs(self) -> dict:
        data = dict(self.cleaned_data)
        for field in ("for_s", "keep_firing_for_s", "cooldown_s"):
            if data.get(field) is None:
                data[field] = 300 if field == "cooldown_s" else 0
        data["role"] = data.get("role") or ""
        return data

    @classmethod
    def initial_from(cls, rule) -> dict:
        fields = list(cls.base_fields)
        initial = {field: getattr(rule, field) for field in fields if field != "deployment"}
        initial["deployment"] = rule.deployment.name if rule.deployment else None
        return initial
