"""The deployment page hides stopped workers by default (replaced, drained, scaled away: after a few restarts of
the stack they outnumber the live ones), with a toggle that shows them and that the 5-second refresh keeps."""
from __future__ import annotations

import re

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _worker_ids(html: str) -> set[int]:
    return {int(i) for i in re.findall(r'<tr data-worker="(\d+)"', html)}


def test_stopped_workers_are_hidden_until_the_toggle_shows_them(client_for, viewer, deployment, make_worker):
    live = make_worker(deployment, "decode")
    gone = [make_worker(deployment, "decode", status="stopped", stopped_at=timezone.now()) for _ in range(3)]
    client = client_for(viewer)

    page = client.get("/deployments/demo/").content.decode()
    assert _worker_ids(page) == {live.pk}
    assert re.search(r'<a href="\?stopped=1"[^>]*id="toggle-stopped">show 3 stopped in the last 15 min</a>', page)

    shown = client.get("/deployments/demo/?stopped=1").content.decode()
    assert _worker_ids(shown) == {live.pk, *(w.pk for w in gone)}
    assert "hide stopped workers" in shown
    # The page's live fragment is refreshed from this URL: it keeps showing them.
    fragment_url = re.search(r'<div id="live" data-url="([^"]+)"', shown).group(1)
    assert fragment_url == "/deployments/demo/live?stopped=1"
    assert _worker_ids(client.get(fragment_url).content.decode()) == _worker_ids(shown)
    assert _worker_ids(client.get("/deployments/demo/live").content.decode()) == {live.pk}


def test_without_stopped_workers_there_is_no_toggle(client_for, viewer, deployment, make_worker):
    make_worker(deployment, "decode")
    assert 'id="toggle-stopped"' not in client_for(viewer).get("/deployments/demo/").content.decode()
