"""The alert and delivery lists: paginated as their OpenAPI schema says, and a filter out of range is a 400."""


def test_alerts_and_deliveries_are_documented_as_the_paginated_envelope_they_answer(admin_api, anon_api):
    schema = anon_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path in ("/api/v1/alerts/", "/api/v1/deliveries/"):
        documented = schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        name = documented["$ref"].rsplit("/", 1)[-1]
        assert name.startswith("Paginated"), (path, documented)
        assert {"count", "next", "previous", "results"} <= set(schema["components"]["schemas"][name]["properties"])
        body = admin_api.get(path).json()
        assert set(body) == {"count", "next", "previous", "results"}, (path, body)


def test_the_export_is_documented_as_the_rule_file_a_yaml_client_reads(anon_api):
    schema = anon_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    documented = schema["paths"]["/api/v1/alert-rules/export"]["get"]["responses"]["200"]["content"]
    name = documented["application/yaml"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert schema["components"]["schemas"][name]["properties"]["groups"]["type"] == "array"


def test_a_rule_filter_past_64_bits_answers_400_not_500(viewer_api):
    response = viewer_api.get("/api/v1/alerts/", {"rule": "9" * 30})
    assert response.status_code == 400, response.content
    assert "rule" in response.json()["error"]["fields"]
