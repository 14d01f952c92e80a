"""The decode column shows speculative decoding: proposed and accepted draft tokens per second as a chart, and the
acceptance ratio as its current value (a dash when the workers drafted nothing)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _value(html: str, cell: str) -> str:
    match = re.search(rf'data-stage-value="{re.escape(cell)}">([^<]*)<', html)
    assert match, cell
    return match.group(1)


def test_the_decode_column_charts_drafts_and_shows_the_acceptance_ratio(client_for, viewer, deployment,
                                                                          seed_samples):
    client = client_for(viewer)
    assert _value(client.get("/deployments/demo/").content.decode(), "decode:spec").startswith("–")
    seed_samples(deployment, "spec_proposed_tokens_per_second", [40.0, 50.0], role="decode")
    seed_samples(deployment, "spec_accepted_tokens_per_second", [30.0, 35.0], role="decode")
    seed_samples(deployment, "spec_acceptance_ratio", [0.75, 0.7], role="decode")
    assert _value(client.get("/deployments/demo/").content.decode(), "decode:spec") == "70.0%"
    figure = client.get("/deployments/demo/stages.json?range=15m").json()["figures"]["stage-decode-spec"]
    assert {"proposed decode", "accepted decode"} <= {trace["name"] for trace in figure["data"]}
