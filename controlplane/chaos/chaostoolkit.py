"""An experiment in the Chaos Toolkit's experiment format (https://chaostoolkit.org/reference/api/experiment/), both
ways. Pure functions on dicts: the API exports a stored experiment and imports a document through
services.experiment_import, which validates the mapped fields as any other experiment's.

The mapping (each Tandem field has one place in the document, so an export imports back unchanged; the table is
in docs/chaos.md):
- name, description: title, description (an empty one is exported as a sentence naming the experiment: the
  Chaos Toolkit requires a description);
- hypothesis[i]: steady-state-hypothesis.probes[i], a probe of `tandem_chaostoolkit.probes` (`metric_value`, or
  `baseline_ratio` for `max_baseline_ratio`) whose arguments are the check's metric, role, window and aggregation
  and whose `range` tolerance is its bound: [0, max], [min, 1e12], [0, ratio];
- target (a node target's `node` too: a document names the node of the fleet it runs on), faults, duration_s,
  abort_conditions, recovery_timeout_s: the arguments of the method's one action,
  `tandem_chaostoolkit.actions.run_experiment`;
- rollbacks: `tandem_chaostoolkit.actions.abort_run` (Tandem reverts every fault itself).

Tandem runs the faults of an experiment together, for its duration, under its abort conditions, and reverts them
itself; a document whose method or rollbacks hold anything else (another extension's action, a probe, a pause) says
something Tandem does not do, and its import is a 400 naming that activity rather than an experiment that silently
does less. The probes run in the `chaos` process and read Tandem's own evaluation of each check
(GET .../chaos/experiments/{name}/steady-state), so `chaos run` and a Tandem run judge the same numbers.
"""
from __future__ import annotations

import re

from controlplane.errors import invalid
from controlplane.services.validation import NAME_RE

PROBES_MODULE = "tandem_chaostoolkit.probes"
ACTIONS_MODULE = "tandem_chaostoolkit.actions"
VALUE_PROBE, RATIO_PROBE = "metric_value", "baseline_ratio"
RUN_ACTION, ABORT_ACTION = "run_experiment", "abort_run"
SECRETS = "tandem"  # the secrets' scope the activities read their token from
RANGE_TOP = 1e12  # validation's largest bound: a `min` check's range ends here
HYPOTHESIS = "steady-state-hypothesis"
_CHECK_ARGUMENTS = ("metric", "role", "window_s", "aggregation")
_RUN_ARGUMENTS = ("target", "faults", "duration_s", "abort_conditions", "recovery_timeout_s")
# Top-level keys that carry nothing Tandem stores (the `chaos` command's own settings) and are ignored on import.
_IGNORED = ("version", "tags", "configuration", "secrets", "extensions", "contributions", "runtime")


def _provider(module: str, func: str, arguments: dict) -> dict:
    return {"type": "python", "module": module, "func": func, "secrets": [SECRETS], "arguments": arguments}


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _probe(name: str, check: dict) -> dict:
    arguments = {"experiment": name, **{key: check[key] for key in _CHECK_ARGUMENTS if key in check}}
    label = f"{check['metric']} ({check['role']})"
    if "max_baseline_ratio" in check:
        func, bounds, label = RATIO_PROBE, [0, _number(check["max_baseline_ratio"])], \
            f"{label} <= {check['max_baseline_ratio']:g} x its value before the faults"
    elif "max" in check:
        func, bounds, label = VALUE_PROBE, [0, _number(check["max"])], f"{label} <= {check['max']:g}"
    else:
        func, bounds, label = VALUE_PROBE, [_number(check["min"]), RANGE_TOP], f"{label} >= {check['min']:g}"
    return {"type": "probe", "name": label, "tolerance": {"type": "range", "range": bounds},
            "provider": _provider(PROBES_MODULE, func, arguments)}


def to_chaostoolkit(*, deployment: str, spec: dict, description: str = "") -> dict:
    """A stored experiment (Experiment.spec()) as a Chaos Toolkit experiment that `chaos run` runs against Tandem:
    the API's address from $TANDEM_URL, a token from $TANDEM_TOKEN (an operator's, to start and abort runs)."""
    name = spec["name"]
    run_arguments = {"experiment": name, **{key: spec[key] for key in _RUN_ARGUMENTS}}
    return {
        "version": "1.0.0",
        "title": name,
        "description": description or f"Tandem chaos experiment {name} of deployment {deployment}",
        "tags": ["tandem", f"deployment:{deployment}"],
        "configuration": {
            "tandem_url": {"type": "env", "key": "TANDEM_URL", "default": "http://localhost:8000"},
            "tandem_deployment": deployment,
        },
        "secrets": {SECRETS: {"token": {"type": "env", "key": "TANDEM_TOKEN"}}},
        HYPOTHESIS: {"title": f"{name}: the steady-state hypothesis holds",
                     "probes": [_probe(name, check) for check in spec["hypothesis"]]},
        "method": [{"type": "action", "name": f"run the Tandem experiment {name}",
                    "provider": _provider(ACTIONS_MODULE, RUN_ACTION, run_arguments)}],
        "rollbacks": [{"type": "action", "name": f"abort the Tandem run of {name}",
                       "provider": _provider(ACTIONS_MODULE, ABORT_ACTION, {"experiment": name})}],
    }


# --- import -------------------------------------------------------------------------------------------------------

def _object(value, field: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"{field} must be an object", field=field)
    return value


def _list(value, field: str) -> list:
    if not isinstance(value, list):
        raise invalid(f"{field} must be a list", field=field)
    return value


def _python(activity, where: str, kind: str, module: str, funcs: tuple[str, ...], why: str) -> tuple[str, dict]:
    """(func, arguments) of a Tandem activity; a 400 naming the activity when it is anything else."""
    activity = _object(activity, where)
    provider = activity.get("provider")
    if activity.get("type") != kind or not isinstance(provider, dict) or provider.get("type") != "python" \
            or provider.get("module") != module or provider.get("func") not in funcs:
        found = "no provider" if not isinstance(provider, dict) else \
            f"{provider.get('module')}.{provider.get('func')}" if provider.get("type") == "python" else \
            f"a {provider.get('type')} provider"
        raise invalid(f"{where} ({activity.get('type')} {activity.get('name', '')!r}, {found}) cannot be mapped: "
                      f"{why}", field=where)
    # A pause, a reference or a control says something a Tandem run does not do: refused, not dropped.
    unknown = sorted(set(activity) - {"type", "name", "provider", *(("tolerance",) if kind == "probe" else ())})
    if unknown:
        raise invalid(f"{where}.{unknown[0]} cannot be mapped: Tandem keeps a {kind}'s name and provider only",
                      field=f"{where}.{unknown[0]}")
    unknown = sorted(set(provider) - {"type", "module", "func", "secrets", "arguments"})
    if unknown:
        raise invalid(f"{where}.provider.{unknown[0]} cannot be mapped", field=f"{where}.provider.{unknown[0]}")
    arguments = _object(provider.get("arguments", {}), f"{where}.provider.arguments")
    return provider["func"], arguments


def _arguments(arguments: dict, allowed: tuple[str, ...], where: str, name: str) -> dict:
    unknown = sorted(set(arguments) - {"experiment", *allowed})
    if unknown:
        raise invalid(f"{where}.provider.arguments.{unknown[0]} cannot be mapped; known: experiment, "
                      f"{', '.join(allowed)}", field=f"{where}.provider.arguments.{unknown[0]}")
    if arguments.get("experiment", name) != name:
        # The activities address the Tandem experiment by name: another one's would read or run that one.
        raise invalid(f"{where}.provider.arguments.experiment {arguments['experiment']!r} must be the title, "
                      f"{name!r}", field=f"{where}.provider.arguments.experiment")
    return {key: arguments[key] for key in allowed if key in arguments}


def _bound(probe: dict, func: str, where: str) -> dict:
    tolerance = probe.get("tolerance")
    field = f"{where}.tolerance"
    if not isinstance(tolerance, dict) or tolerance.get("type") != "range" or "target" in tolerance \
            or not isinstance(tolerance.get("range"), list) or len(tolerance["range"]) != 2 \
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in tolerance["range"]):
        raise invalid(f"{field} cannot be mapped: a Tandem check's tolerance is {{\"type\": \"range\", \"range\": "
                      f"[low, high]}}", field=field)
    low, high = tolerance["range"]
    if func == RATIO_PROBE:
        if low != 0:
            raise invalid(f"{field}: a baseline_ratio probe's range starts at 0, [0, ratio]", field=field)
        return {"max_baseline_ratio": high}
    if low == 0:
        return {"max": high}
    if high >= RANGE_TOP:
        return {"min": low}
    raise invalid(f"{field} [{low:g}, {high:g}] cannot be mapped: a Tandem check has one bound, [0, max] or "
                  f"[min, {RANGE_TOP:g}]; make it two probes", field=field)


def named_deployment(document: dict) -> str | None:
    """The deployment a document says it is for: its configuration's `tandem_deployment` (what the export writes),
    else a `deployment:<name>` tag; None where it names none."""
    configuration = document.get("configuration")
    named = configuration.get("tandem_deployment") if isinstance(configuration, dict) else None
    if isinstance(named, str):
        return named
    tags = document.get("tags")
    found = [t.split(":", 1)[1] for t in tags if isinstance(t, str) and t.startswith("deployment:")] \
        if isinstance(tags, list) else []
    return found[0] if found else None


def from_chaostoolkit(document, *, deployment: str | None = None) -> dict:
    """The fields of experiment_create from a Chaos Toolkit experiment (the mapping in the module docstring). A
    400 names what cannot be mapped, by its place in the document (`method[1]`, `steady-state-hypothesis.probes[0]
    .tolerance`), and a document that names another deployment than `deployment` (the URL's): imported here, its
    faults would hit workers it was not written for. The fields themselves are validated by experiment_create; its
    errors name Tandem's fields, which ctk_field turns back into the document's."""
    document = _object(document, "document")
    named = named_deployment(document)
    if deployment is not None and named is not None and named != deployment:
        field = "configuration.tandem_deployment" if isinstance(document.get("configuration"), dict) and \
            "tandem_deployment" in document["configuration"] else "tags"
        raise invalid(f"the document is for deployment {named!r}, not {deployment!r}: import it at "
                      f"/api/v1/deployments/{named}/chaos/experiments/import, or change its {field}", field=field)
    if "controls" in document:
        raise invalid("controls cannot be mapped: a Tandem run loads no Chaos Toolkit controls", field="controls")
    unknown = sorted(set(document) - {"title", "description", HYPOTHESIS, "method", "rollbacks", *_IGNORED})
    if unknown:
        raise invalid(f"{unknown[0]} is not a key of a Chaos Toolkit experiment that Tandem maps", field=unknown[0])
    name = document.get("title")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid(f"title {name!r} becomes the experiment's name: 1-63 lowercase letters, digits or '-', "
                      "starting and ending with a letter or digit", field="title")
    description = document.get("description", "")
    if not isinstance(description, str):
        raise invalid("description must be a string", field="description")

    hypothesis = _object(document.get(HYPOTHESIS), HYPOTHESIS)
    checks = []
    for index, probe in enumerate(_list(hypothesis.get("probes"), f"{HYPOTHESIS}.probes")):
        where = f"{HYPOTHESIS}.probes[{index}]"
        func, arguments = _python(probe, where, "probe", PROBES_MODULE, (VALUE_PROBE, RATIO_PROBE),
                                  f"a hypothesis check is a probe of {PROBES_MODULE} ({VALUE_PROBE}, {RATIO_PROBE})")
        checks.append({**_arguments(arguments, _CHECK_ARGUMENTS, where, name), **_bound(probe, func, where)})

    method = _list(document.get("method"), "method")
    runs = []
    for index, activity in enumerate(method):
        func, arguments = _python(activity, f"method[{index}]", "action", ACTIONS_MODULE, (RUN_ACTION,),
                                  f"a Tandem experiment's method is one {ACTIONS_MODULE}.{RUN_ACTION} action (its "
                                  "faults run together, for its duration, under its abort conditions)")
        runs.append((index, arguments))
    if len(runs) != 1:
        raise invalid(f"method must hold exactly one {ACTIONS_MODULE}.{RUN_ACTION} action, not {len(runs)}",
                      field="method")
    index, arguments = runs[0]
    fields = _arguments(arguments, _RUN_ARGUMENTS, f"method[{index}]", name)
    for key in ("target", "faults", "duration_s"):
        if key not in fields:
            raise invalid(f"method[{index}].provider.arguments.{key} is required",
                          field=f"method[{index}].provider.arguments.{key}")
    for where_index, activity in enumerate(_list(document.get("rollbacks", []), "rollbacks")):
        where = f"rollbacks[{where_index}]"
        _arguments(_python(activity, where, "action", ACTIONS_MODULE, (ABORT_ACTION,),
                           f"Tandem reverts every fault itself; the only rollback is {ACTIONS_MODULE}.{ABORT_ACTION}"
                           )[1], ("reason",), where, name)
    return {"name": name, "description": description, "hypothesis": checks, **fields}


_HYPOTHESIS_FIELD = re.compile(r"^hypothesis\[(\d+)\](?:\.(\w+))?(.*)$")


def ctk_field(field: str, document: dict) -> str:
    """Where a Tandem field of an imported document lies in the document: `hypothesis[1].max` →
    `steady-state-hypothesis.probes[1].tolerance`, `target.role` → `method[0].provider.arguments.target.role`."""
    if field == "name":
        return "title"
    if field == "description":
        return field
    match = _HYPOTHESIS_FIELD.match(field)
    if match:
        index, key, rest = match.groups()
        where = f"{HYPOTHESIS}.probes[{index}]"
        if key in ("max", "min", "max_baseline_ratio"):
            return f"{where}.tolerance"
        return f"{where}.provider.arguments" + (f".{key}{rest}" if key else "")
    if field == "hypothesis":
        return f"{HYPOTHESIS}.probes"
    index = next((i for i, activity in enumerate(document.get("method", []))
                  if isinstance(activity, dict) and activity.get("type") == "action"), 0)
    return f"method[{index}].provider.arguments.{field}"
