"""The what-if page: the form filled with the deployment as it stands; a POST replays the window before and after and
shows the verdict, the figures side by side, the two fleets and the charts' figures; a refused change is the page
with the what-if's message (a 400), never a 500; viewers may use it, anonymous visitors are sent to sign in; the
deployment page links it."""
from __future__ import annotations

import json

import pytest

from tests.dashboards.what_if_fleet import NUM_REQUESTS, profile_with_peak_trace

URL = "/deployments/demo/what-if"


@pytest.fixture
def fleet(deployment):
    return profile_with_peak_trace(deployment)


def figures_of(html: str) -> list[dict]:
    start = html.index('<script id="what-if-figures-data" type="application/json">')
    body = html[html.index(">", start) + 1:html.index("</script>", start)]
    return json.loads(body)


def test_it_renders_the_form_with_the_fleet_as_it_stands(fleet, viewer, client_for):
    answer = client_for(viewer).get(URL)
    assert answer.status_code == 200
    html = answer.content.decode()
    assert 'id="what-if-form"' in html and 'name="csrfmiddlewaretoken"' in html
    assert '<option value="peak">peak (400 requests' in html
    assert '<option value="recorded" selected>recorded (0 requests' in html  # listed before its gateways record
    assert 'name="replicas_decode" value="2"' in html and 'name="replicas_prefill" value="1"' in html
    assert 'id="verdict"' not in html and "what-if-error" not in html


def posted_as_rendered(client) -> dict:
    """Every field of the form as the page fills it (what a browser posts when nothing is touched)."""
    form = client.get(URL).context["form"]
    fields = {key: str(form[key]) for key in ("trace", "since", "until", "autoscale", "max_queued",
                                              "prefix_caching", "routing", "traffic_rate")}
    return {**fields, **{f"replicas_{role}": str(value) for role, _, _, value in form["replicas"]}}


def test_halving_the_decode_pool_shows_both_sides_and_a_verdict_below_the_objective(fleet, viewer, client_for):
    client = client_for(viewer)
    answer = client.post(URL, {**posted_as_rendered(client), "trace": "peak", "replicas_decode": "1"})
    assert answer.status_code == 200, answer.content.decode()[-2000:]
    html = answer.content.decode()
    report = answer.context["report"]
    # Only what the operator changed is sent: the other fields were posted as the deployment has them.
    assert report["change"] == {"pools": {"decode": {"replicas": 1}}}
    assert json.loads(answer.context["request_json"])["change"] == report["change"]
    assert report["trace"]["requests"] == NUM_REQUESTS
    assert report["verdict"]["attainment_before"] >= 0.99 > report["verdict"]["attainment_after"]
    assert 'data-testid="verdict">below the objective' in html and 'data-testid="worse"' in html
    rows = {row["key"]: row for row in answer.context["rows"]}
    assert rows["ttft_p99"]["judged"] == rows["goodput_rps"]["judged"] == "worse" and rows["served"]["judged"] == ""
    assert rows["ttft_p99"]["before"] in html and rows["ttft_p99"]["after"] in html
    changed = [row for row in answer.context["fleet_rows"] if row["changed"]]
    assert changed == [{"label": "decode replicas", "before": "2", "after": "1", "changed": True}]
    figures = {figure["key"]: figure for figure in figures_of(html)}
    assert set(figures) == {"ttft", "replicas", "traffic"}
    assert {trace["name"] for trace in figures["ttft"]["data"]} == {"TTFT P99 before", "TTFT P99 after",
                                                                    "objective 2 s"}
    replicas = {trace["name"]: trace["y"] for trace in figures["replicas"]["data"]}
    assert set(replicas["decode before"]) == {2} and set(replicas["decode after"]) == {1}


def test_a_window_and_a_harmless_change_meet_the_objective(fleet, operator, client_for):
    answer = client_for(operator).post(URL, {"trace": "peak", "since": "5", "until": "15", "max_queued": "4096"})
    assert answer.status_code == 200
    report = answer.context["report"]
    assert report["change"] == {"admission": {"max_queued": 4096}} and report["trace"]["requests"] == 200
    assert 'data-testid="verdict">meets the objective' in answer.content.decode()


@pytest.mark.parametrize("form,message", [
    ({"replicas_decode": "9"}, "change.pools.decode.replicas: 9 is outside min..max (1..8)"),
    ({"replicas_decode": "two"}, "change.pools.decode.replicas must be a whole number"),
    ({"traffic_rate": "-1"}, "change.traffic.rate must be a number &gt; 0"),
    ({"routing": "random"}, "change.routing must be one of least_loaded, prefix"),
    ({"since": "soon"}, "since must be seconds from the trace&#x27;s start"),
    ({"since": "30", "until": "40"}, "holds no request in this window"),
])
def test_a_refused_change_shows_the_what_ifs_message(fleet, viewer, client_for, form, message):
    answer = client_for(viewer).post(URL, {"trace": "peak", **form})
    assert answer.status_code == 400
    html = answer.content.decode()
    assert 'id="what-if-error"' in html and message in html and 'id="verdict"' not in html
    assert 'id="what-if-form"' in html  # the form again, with what was typed


def test_no_profile_and_no_trace_are_messages_too(deployment, viewer, client_for):
    client = client_for(viewer)
    empty = client.post(URL, {"trace": "recorded"})
    assert empty.status_code == 400 and "holds no request" in empty.content.decode()
    missing = client.post(URL, {"trace": "nope"})
    assert missing.status_code == 404 and "has no trace named" in missing.content.decode()
    trace_import_one(deployment)
    unprofiled = client.post(URL, {"trace": "one"})
    assert unprofiled.status_code == 400 and "no profile" in unprofiled.content.decode()


def trace_import_one(deployment):
    from controlplane.replay.services import trace_import

    trace_import(deployment, name="one", fmt="tandem", text='{"at_s": 0, "prompt_tokens": 5, "completion_tokens": 2}')


def test_anonymous_visitors_are_sent_to_sign_in_and_outsiders_refused(fleet, outsider, client_for):
    answer = client_for(None).get(URL)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    assert client_for(None).post(URL, {"trace": "peak"}).status_code == 302
    assert client_for(outsider).get(URL).status_code == 403


def test_the_deployment_page_links_it(deployment, viewer, client_for):
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert f'href="{URL}"' in html
