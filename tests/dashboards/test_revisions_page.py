"""Revisions page: the history, which revision is current and which ones workers still run, and the diff."""
from __future__ import annotations

import html
import re

import pytest

pytestmark = pytest.mark.django_db


def test_it_marks_the_current_revision_and_counts_the_workers_of_each(client_for, viewer, deployment,
                                                                      second_revision, make_worker):
    make_worker(deployment, "decode", revision=deployment.revisions.get(number=1))
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    text = client_for(viewer).get("/deployments/demo/revisions/").content.decode()
    row2 = re.search(r'<tr data-revision="2">(.*?)</tr>', text, re.S).group(1)
    row1 = re.search(r'<tr data-revision="1">(.*?)</tr>', text, re.S).group(1)
    assert "current" in row2 and '<td class="num">2</td>' in row2
    assert "still running" in row1 and '<td class="num">1</td>' in row1
    assert "two threads" in row2


def test_it_shows_what_changed_between_two_revisions(client_for, viewer, deployment, second_revision):
    text = html.unescape(client_for(viewer).get("/deployments/demo/revisions/?a=1&b=2").content.decode())
    assert "common.threads" in text
    diff = text.split('id="compare"')[1]
    assert re.search(r'class="after">2<', diff)


def test_a_single_revision_has_nothing_to_compare_and_bad_numbers_fall_back(client_for, viewer, deployment):
    client = client_for(viewer)
    assert "nothing to compare yet" in client.get("/deployments/demo/revisions/").content.decode()
    assert client.get("/deployments/demo/revisions/?a=x&b=99999999999999").status_code == 200


def test_after_a_rollback_to_the_first_revision_it_compares_the_rolled_back_one_against_it(
        client_for, viewer, deployment, second_revision):
    deployment.current_revision = deployment.revisions.get(number=1)
    deployment.save(update_fields=["current_revision"])
    text = html.unescape(client_for(viewer).get("/deployments/demo/revisions/").content.decode())
    diff = text.split('id="compare"')[1]
    assert "nothing to compare" not in diff
    assert "common.threads" in diff
    assert re.search(r'<option value="2" selected>', diff.split('name="b"')[0])
