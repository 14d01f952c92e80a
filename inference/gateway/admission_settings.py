"""A deployment's admission settings, checked where they enter: the control plane stores them and the gateways poll
them (check_admission_settings), and the gateway's `--queue-deadline` flag (parse_deadline). The queue they set up
is admission.py's; the preemption fields are preemption.py's."""
from __future__ import annotations

import math

from inference.gateway.fair_queue import BANDS

MAX_QUEUED_LIMIT = 1_000_000
MAX_DEADLINE_S = 86_400.0
MAX_PREEMPTIONS_LIMIT = 100
MAX_PREEMPT_MARGIN = 1e12
ADMISSION_FIELDS = ("max_queued", "queue_deadlines", "max_preemptions", "preempt_margin", "preempt_min_tokens_left")
# Preemption's settings (preemption.py): name → (smallest, largest, whole numbers only).
PREEMPTION_BOUNDS = {"max_preemptions": (0, MAX_PREEMPTIONS_LIMIT, True),
                     "preempt_margin": (0, MAX_PREEMPT_MARGIN, False),
                     "preempt_min_tokens_left": (0, MAX_QUEUED_LIMIT, True)}


class AdmissionSettingsError(ValueError):
    def __init__(self, param: str, requirement: str) -> None:
        super().__init__(f"{param}: {requirement}")
        self.param, self.requirement = param, requirement


def check_admission_settings(settings: object) -> dict:
    """A deployment's admission settings as the control plane stores them and the gateways poll them: an object with
    `max_queued` (requests that may wait, 0..MAX_QUEUED_LIMIT; 0: no queue), `queue_deadlines` (class → seconds a
    request may wait, > 0 and at most a day) and preemption's `max_preemptions`, `preempt_margin` and
    `preempt_min_tokens_left` (PREEMPTION_BOUNDS), each optional; what it leaves out, the gateway's flags say. A checked
    copy, or AdmissionSettingsError naming the field (`max_queued`, `queue_deadlines.batch`)."""
    if not isinstance(settings, dict):
        raise AdmissionSettingsError("admission", "must be an object of " + ", ".join(ADMISSION_FIELDS))
    for key in settings:
        if key not in ADMISSION_FIELDS:
            raise AdmissionSettingsError(str(key), "unknown setting (known: " + ", ".join(ADMISSION_FIELDS) + ")")
    checked: dict = {}
    if settings.get("max_queued") is not None:
        value = settings["max_queued"]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_QUEUED_LIMIT:
            raise AdmissionSettingsError("max_queued", f"must be a whole number in 0..{MAX_QUEUED_LIMIT}, "
                                                       f"not {value!r}")
        checked["max_queued"] = value
    for name, (low, high, whole) in PREEMPTION_BOUNDS.items():
        value = settings.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
                or not math.isfinite(value) or not low <= value <= high):
            raise AdmissionSettingsError(name, f"must be {'a whole number' if whole else 'a number'} in "
                                               f"{low}..{high:g}, not {value!r}")
        checked[name] = value
    deadlines = settings.get("queue_deadlines")
    if deadlines is not None:
        if not isinstance(deadlines, dict):
            raise AdmissionSettingsError("queue_deadlines", "must be an object of class → seconds")
        checked_deadlines = {}
        for priority_class, seconds in deadlines.items():
            if priority_class not in BANDS:
                raise AdmissionSettingsError(f"queue_deadlines.{priority_class}",
                                             "unknown class (known: " + ", ".join(BANDS) + ")")
            if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds)
                    or not 0 < seconds <= MAX_DEADLINE_S):
                raise AdmissionSettingsError(f"queue_deadlines.{priority_class}",
                                             f"must be a number of seconds > 0 and <= {MAX_DEADLINE_S:g}, "
                                             f"not {seconds!r}")
            checked_deadlines[priority_class] = float(seconds)
        if checked_deadlines:
            checked["queue_deadlines"] = checked_deadlines
    return checked


def parse_deadline(text: str) -> tuple[str, float]:
    """`CLASS=SECONDS` of --queue-deadline."""
    priority_class, sep, seconds = text.partition("=")
    if not sep or priority_class not in BANDS:
        raise ValueError(f"--queue-deadline {text!r}: give CLASS=SECONDS, CLASS one of {', '.join(BANDS)}")
    try:
        value = float(seconds)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--queue-deadline {text!r}: the seconds must be a number > 0")
    return priority_class, value
