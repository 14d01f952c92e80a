"""Chaos Toolkit interop: an exported experiment is valid for chaoslib's own validator (which imports the extension's
modules and binds each activity's arguments to its function), imports back unchanged, and an import names the place
in the document that cannot be mapped; the steady-state read the probes use judges the checks as a run's start does.
"""
from __future__ import annotations

import ast
import copy
import time
from pathlib import Path

import pytest

from tests.controlplane.chaos.conftest import chaos_pass
from tests.controlplane.chaos.test_driver import steady_history

BASE = "/api/v1/deployments/demo/chaos"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def exported(experiment, viewer_api):
    response = viewer_api.get(f"{BASE}/experiments/pause-decode/chaostoolkit.json")
    assert response.status_code == 200, response.content
    assert 'filename="pause-decode.json"' in response["Content-Disposition"]
    return response.json()


@pytest.mark.django_db
def test_an_exported_experiment_passes_the_chaos_toolkits_own_validation(exported, monkeypatch):
    from chaoslib.experiment import ensure_experiment_is_valid

    monkeypatch.setenv("TANDEM_TOKEN", "a token")  # the validator loads the secrets, as `chaos validate` does
    ensure_experiment_is_valid(copy.deepcopy(exported))
    assert exported["title"] == "pause-decode"
    assert exported["configuration"]["tandem_deployment"] == "demo"
    probes = exported["steady-state-hypothesis"]["probes"]
    assert [(p["provider"]["func"], p["tolerance"]["range"]) for p in probes] == [
        ("metric_value", [0, 0.05]), ("baseline_ratio", [0, 2]), ("metric_value", [1, 1e12])]
    assert probes[2]["provider"]["arguments"] == {"experiment": "pause-decode", "metric": "ready_workers",
                                                  "role": "decode"}
    [action] = exported["method"]
    assert action["provider"]["func"] == "run_experiment"
    assert action["provider"]["arguments"]["faults"] == [{"kind": "pause"}]
    assert [r["provider"]["func"] for r in exported["rollbacks"]] == ["abort_run"]


@pytest.mark.django_db
def test_an_export_imports_back_unchanged(exported, experiment, admin_api):
    document = {**exported, "title": "pause-decode-copy"}
    for activity in [*document["steady-state-hypothesis"]["probes"], *document["method"], *document["rollbacks"]]:
        activity["provider"]["arguments"]["experiment"] = "pause-decode-copy"
    response = admin_api.post(f"{BASE}/import", document, format="json")
    assert response.status_code == 201, response.content
    from controlplane.chaos.models import Experiment

    copied = Experiment.objects.get(name="pause-decode-copy")
    assert {**copied.spec(), "name": "pause-decode"} == experiment.spec()
    assert admin_api.post(f"{BASE}/import", document, format="json").status_code == 409


def _foreign(kind: str) -> dict:
    return {"type": kind, "name": "kill a pod", "provider": {
        "type": "python", "module": "chaosk8s.pod.actions", "func": "terminate_pods", "arguments": {}}}


def _set(path: list, value):
    def change(document):
        node = document
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


PROBE0 = ["steady-state-hypothesis", "probes", 0]
RUN = ["method", 0, "provider", "arguments"]


@pytest.mark.django_db
@pytest.mark.parametrize("change,field,words", [
    (lambda d: d["method"].append(_foreign("action")), "method[1]", "chaosk8s.pod.actions.terminate_pods"),
    (lambda d: d["method"].insert(0, {"type": "probe", "name": "p", "provider": {"type": "http", "url": "x"}}),
     "method[0]", "cannot be mapped"),
    (_set(["method"], []), "method", "exactly one"),
    (lambda d: d["rollbacks"].append(_foreign("action")), "rollbacks[1]", "Tandem reverts every fault itself"),
    (lambda d: d["steady-state-hypothesis"]["probes"].append(_foreign("probe")),
     "steady-state-hypothesis.probes[3]", "a hypothesis check is a probe of tandem_chaostoolkit.probes"),
    (_set([*PROBE0, "tolerance"], True), "steady-state-hypothesis.probes[0].tolerance", "range"),
    (_set([*PROBE0, "tolerance"], {"type": "range", "range": [0.01, 0.05]}),
     "steady-state-hypothesis.probes[0].tolerance", "make it two probes"),
    (_set(["method", 0, "pauses"], {"after": 5}), "method[0].pauses", "cannot be mapped"),
    (_set(["controls"], []), "controls", "no Chaos Toolkit controls"),
    (_set(["title"], "Pause Decode"), "title", "lowercase"),
    (_set([*RUN, "faults"], [{"kind": "cpu-hog"}]), "method[0].provider.arguments.faults[0].kind",
     "is not a fault this version carries out"),
    (_set([*RUN, "chaos"], 1), "method[0].provider.arguments.chaos", "cannot be mapped"),
    (lambda d: d["method"][0]["provider"]["arguments"].pop("target"), "method[0].provider.arguments.target",
     "is required"),
    (_set([*PROBE0, "provider", "arguments", "experiment"], "other"),
     "steady-state-hypothesis.probes[0].provider.arguments.experiment", "must be the title"),
    (_set(["steady-state-hypothesis", "probes", 2, "provider", "arguments", "role"], "nope"),
     "steady-state-hypothesis.probes[2].provider.arguments.role", "must name a pool"),
    (_set([*PROBE0, "tolerance", "range"], [0, -1]), "steady-state-hypothesis.probes[0].tolerance",
     "hypothesis[0].max must be a number"),
    # Written for another deployment: imported into this one it would break workers it was not meant for.
    (_set(["configuration", "tandem_deployment"], "billing"), "configuration.tandem_deployment",
     "the document is for deployment 'billing', not 'demo'"),
    (lambda d: (d.pop("configuration"), d.__setitem__("tags", ["tandem", "deployment:billing"])), "tags",
     "/api/v1/deployments/billing/chaos/experiments/import"),
])
def test_an_import_names_what_cannot_be_mapped(exported, admin_api, change, field, words):
    from controlplane.chaos.models import Experiment

    document = copy.deepcopy(exported)
    document["title"] = "imported"
    for activity in [*document["steady-state-hypothesis"]["probes"], *document["method"], *document["rollbacks"]]:
        activity["provider"]["arguments"]["experiment"] = "imported"
    change(document)
    response = admin_api.post(f"{BASE}/import", document, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert not Experiment.objects.filter(name="imported").exists()


@pytest.mark.django_db
def test_only_admins_import(exported, operator_api):
    response = operator_api.post(f"{BASE}/import", exported, format="json")
    assert response.status_code == 403 and "the admin role" in response.json()["error"]["message"]


@pytest.mark.django_db
def test_the_steady_state_read_judges_each_check_against_the_runs_baseline(experiment, world, gateway, viewer_api,
                                                                         operator, agent_inline,
                                                                         django_capture_on_commit_callbacks):
    from controlplane.chaos.services import run_start

    t = time.time()
    ok = steady_history(gateway, t)
    before = viewer_api.get(f"{BASE}/experiments/pause-decode/steady-state").json()
    assert before["holds"] and before["baseline_run"] is None
    assert [c["value"] for c in before["checks"]] == [0.0, pytest.approx(0.05, rel=0.05), 1.0]
    assert before["checks"][1]["ratio"] == pytest.approx(1.0)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    # The TTFT triples under the fault: the ratio is read against the run's baseline, not against itself.
    gateway.serve(ok + 10, ttft=0.3)
    chaos_pass(now=time.time())
    during = viewer_api.get(f"{BASE}/experiments/pause-decode/steady-state").json()
    assert during["baseline_run"] == run.pk and not during["holds"]
    assert during["checks"][1]["ratio"] > 2 and not during["checks"][1]["holds"]


def test_the_extension_imports_neither_django_nor_the_control_plane():
    for path in sorted((ROOT / "tandem_chaostoolkit").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("django", "rest_framework", "controlplane", "celery"), \
                    f"{path.name} imports {name}"
