"""In a real browser: the deployment page shows the deployment's sampling defaults and the current revision's
engine settings by part, and the revisions page shows a per-role change."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_a_viewer_sees_sampling_defaults_and_per_role_settings(page, live_server, login, viewer, operator, admin,
                                                               transactional_db, deployment, screenshot):
    from controlplane.models import Action
    from controlplane.services import deployment_sampling_defaults_set, revision_create

    first = revision_create(deployment=deployment, actor=admin, engine_settings={
        "common": {"threads": 1}, "decode": {"max_num_seqs": 64}})
    Action.objects.filter(pk=first.pk).update(status="succeeded")
    revision_create(deployment=deployment, actor=admin, engine_settings={
        "common": {"threads": 1}, "prefill": {"max_num_batched_tokens": 8192}, "decode": {"max_num_seqs": 256}})
    deployment_sampling_defaults_set(deployment=deployment, sampling_defaults={"temperature": 0, "top_p": 0.9},
                                     actor=operator)
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    defaults = page.locator("#sampling-defaults tr")
    assert defaults.all_inner_texts() == ["temperature\t0.0", "top_p\t0.9"]
    assert page.locator("#engine-settings tr[data-setting='decode.max_num_seqs'] td").all_inner_texts() == [
        "decode.max_num_seqs", "256"]
    assert page.locator("#engine-settings tr[data-setting='prefill.max_num_batched_tokens']").is_visible()
    screenshot(page, "deployment-serving-settings")
    page.goto(f"{live_server.url}/deployments/demo/revisions/")
    change = page.locator("#compare tr", has_text="decode.max_num_seqs")
    assert change.locator("td.before").inner_text() == "64" and change.locator("td.after").inner_text() == "256"
