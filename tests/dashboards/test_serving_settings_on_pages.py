"""The deployment page shows the sampling defaults and the current revision's engine settings by part; the
revisions page's diff names per-role changes."""
from __future__ import annotations

import re

import pytest

from controlplane.models import Action
from controlplane.services import deployment_sampling_defaults_set, revision_create

pytestmark = pytest.mark.django_db


def _rows(html: str, table_id: str) -> list[str]:
    table = re.search(rf'<table[^>]*id="{table_id}".*?</table>', html, re.S).group(0)
    return [" ".join(re.sub(r"<[^>]+>", " ", row).split()) for row in re.findall(r"<tr.*?</tr>", table, re.S)]


def test_the_deployment_page_shows_sampling_defaults(client_for, viewer, operator, deployment):
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _rows(html, "sampling-defaults")[0].startswith("None: OpenAI's")
    deployment_sampling_defaults_set(deployment=deployment, sampling_defaults={"temperature": 0, "max_tokens": 64},
                                     actor=operator)
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _rows(html, "sampling-defaults") == ["temperature 0.0", "max_tokens 64"]


def test_the_deployment_page_shows_engine_settings_per_role(client_for, viewer, admin, deployment):
    revision_create(deployment=deployment, actor=admin, engine_settings={
        "common": {"threads": 1, "dtype": "bfloat16"}, "decode": {"max_num_seqs": 256},
        "prefill": {"max_num_batched_tokens": 8192}})
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _rows(html, "engine-settings") == ["dtype bfloat16", "common.threads 1",
                                              "prefill.max_num_batched_tokens 8192", "decode.max_num_seqs 256"]


def test_the_revisions_diff_names_the_role(client_for, viewer, admin, deployment):
    first = revision_create(deployment=deployment, actor=admin, engine_settings={"decode": {"max_num_seqs": 64}})
    Action.objects.filter(pk=first.pk).update(status="succeeded")
    revision_create(deployment=deployment, actor=admin, engine_settings={"decode": {"max_num_seqs": 256}})
    html = client_for(viewer).get("/deployments/demo/revisions/").content.decode()
    compare = html[html.index('id="compare"'):]
    assert "<code>decode.max_num_seqs</code>" in compare
    assert '<td class="before">64</td><td class="after">256</td>' in compare
