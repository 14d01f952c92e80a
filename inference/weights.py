"""Routing weights: how much of a role's traffic a worker takes relative to its peers, as nginx's `weight=`.

One definition of a valid weight for every edge that takes one: the gateway's --worker-weight and its membership,
a pool's routing_weights and a node's `tandem.weight` label at the control plane.
"""
from __future__ import annotations

import re

from inference.checks import is_number

DEFAULT_WEIGHT = 1
# A weight is relative, so a bound costs nothing real; past it a value is a typo (30 for 3.0), and 0 or less would
# make a ready worker unpickable, which is what draining is for.
MAX_WEIGHT = 100
# The node label that gives a worker on that node its weight when its pool's routing_weights name none.
WEIGHT_LABEL = "tandem.weight"
_DECIMAL = re.compile(r"\d{1,3}(\.\d{1,6})?")


def weight_problem(value: object) -> str:
    """Why `value` is not a weight ("" when it is one): a number above 0 and at most MAX_WEIGHT."""
    if not is_number(value):
        return f"must be a number, not {value!r}"
    if not 0 < value <= MAX_WEIGHT:
        return f"must be above 0 and at most {MAX_WEIGHT}, not {value!r}"
    return ""


def parse_weight(text: str) -> int | float:
    """A weight written as text ("3", "0.5"): a label value or a command-line flag. ValueError saying why not."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"must be a decimal number such as 3 or 0.5, not {text!r}")
    value = float(text)
    value = int(value) if value.is_integer() else value
    problem = weight_problem(value)
    if problem:
        raise ValueError(problem)
    return value
