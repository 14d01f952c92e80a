"""Traces through the REST API: imports of the public formats stored whole or not at all (a bad row is a 400 naming
its line and field), the export read back as an import, the recorded trace's sampling, and who may do what."""
from __future__ import annotations

import json

import pytest

from controlplane.replay.models import Trace, TraceRequest

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:47.0000000,879,0
"""
MOONCAKE = "\n".join(json.dumps(row) for row in [
    {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]},
    {"timestamp": 2500, "input_length": 1200, "output_length": 8, "hash_ids": [46, 49]},
])


def _import(api, fmt: str, name: str, body: str, deployment: str = "demo"):
    return api.post(f"/api/v1/deployments/{deployment}/traces/import?format={fmt}&name={name}", data=body,
                    content_type="text/plain")


def test_public_formats_import_in_arrival_order_and_export_as_an_import(operator_api, viewer_api, deployment):
    answer = _import(operator_api, "azure", "azure-code", AZURE)
    assert answer.status_code == 201, answer.content
    summary = answer.json()
    assert summary["requests"] == 3 and summary["format"] == "azure" and summary["start"].startswith("2023-11-16T18")
    assert summary["duration_s"] == pytest.approx(4.314579, abs=1e-5)
    assert _import(operator_api, "mooncake", "mooncake", MOONCAKE).status_code == 201
    listed = {t["name"]: t for t in viewer_api.get("/api/v1/deployments/demo/traces/").json()}
    assert listed["azure-code"]["requests"] == 3 and listed["mooncake"]["requests"] == 2

    exported = b"".join(viewer_api.get("/api/v1/deployments/demo/traces/mooncake/requests.jsonl").streaming_content)
    rows = [json.loads(line) for line in exported.decode().splitlines()]
    assert [(r["prompt_tokens"], r["completion_tokens"], r["hashes"], r["block_tokens"]) for r in rows] == [
        (6955, 52, ["46", "47", "48"], 512), (1200, 8, ["46", "49"], 512)]
    assert _import(operator_api, "tandem", "again", exported.decode()).status_code == 201
    again = b"".join(viewer_api.get("/api/v1/deployments/demo/traces/again/requests.jsonl").streaming_content)
    assert again == exported
    window = b"".join(viewer_api.get("/api/v1/deployments/demo/traces/azure-code/requests.jsonl",
                                     {"since": 0.1, "until": 10}).streaming_content).decode().splitlines()
    assert [json.loads(line)["prompt_tokens"] for line in window] == [879, 396]


@pytest.mark.parametrize("fmt,body,line,field", [
    ("azure", AZURE.replace("396", "lots"), 3, "ContextTokens"),
    ("azure", AZURE.replace("18:15:47", "18:15:77"), 4, "TIMESTAMP"),
    ("azure", "time,ctx,gen\n1,2,3\n", 1, "(header)"),
    ("mooncake", MOONCAKE.replace('"hash_ids": [46, 49]', '"hash_ids": "46"'), 2, "hash_ids"),
    ("mooncake", MOONCAKE + "\n{not json", 3, "(line)"),
    ("tandem", '{"at_s": 0, "prompt_tokens": 5, "completion_tokens": 1}\n{"t": 5, "prompt_tokens": 5, '
               '"completion_tokens": 1}', 2, "at_s"),
    ("tandem", '{"at_s": 0, "prompt_tokens": 0, "completion_tokens": 1}', 1, "prompt_tokens"),
])
def test_a_bad_row_is_a_400_naming_its_line_and_field_and_nothing_is_stored(operator_api, deployment, fmt, body,
                                                                             line, field):
    answer = _import(operator_api, fmt, "bad", body)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error.get("line") == line and error.get("field") == field, error
    assert f"line {line}" in json.dumps(error)
    assert not Trace.objects.filter(name="bad").exists() and TraceRequest.objects.count() == 0


def test_names_formats_and_roles(operator_api, viewer_api, deployment):
    assert _import(viewer_api, "azure", "x", AZURE).status_code == 403
    assert _import(operator_api, "parquet", "x", AZURE).json()["error"]["field"] == "format"
    assert _import(operator_api, "azure", "recorded", AZURE).json()["error"]["field"] == "name"
    assert _import(operator_api, "azure", "a b", AZURE).status_code == 400
    assert _import(operator_api, "azure", "x", "").status_code == 400
    assert _import(operator_api, "azure", "x", AZURE, deployment="nope").status_code == 404
    assert _import(operator_api, "azure", "x", AZURE).status_code == 201
    conflict = _import(operator_api, "azure", "x", AZURE)
    assert conflict.status_code == 409 and "already has a trace named 'x'" in json.dumps(conflict.json())
    assert TraceRequest.objects.count() == 3
    assert viewer_api.delete("/api/v1/deployments/demo/traces/x/").status_code == 403
    assert operator_api.delete("/api/v1/deployments/demo/traces/x/").status_code == 204
    assert viewer_api.get("/api/v1/deployments/demo/traces/x/").status_code == 404
    assert TraceRequest.objects.count() == 0


def test_the_recorded_trace_can_be_sampled_or_paused_and_an_import_cannot(operator_api, viewer_api, deployment):
    recorded = viewer_api.get("/api/v1/deployments/demo/traces/recorded/").json()
    assert recorded["recording"] is True and recorded["sample"] == 1.0 and recorded["requests"] == 0
    changed = operator_api.patch("/api/v1/deployments/demo/traces/recorded/", {"sample": 0.25}, format="json")
    assert changed.status_code == 200 and changed.json()["sample"] == 0.25
    for body in ({"sample": 1.5}, {"sample": 0.5, "colour": "red"}):
        assert operator_api.patch("/api/v1/deployments/demo/traces/recorded/", body,
                                  format="json").status_code == 400
    assert Trace.objects.get(name="recorded").sample == 0.25
    assert _import(operator_api, "azure", "fixed", AZURE).status_code == 201
    refused = operator_api.patch("/api/v1/deployments/demo/traces/fixed/", {"recording": True}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "name"
