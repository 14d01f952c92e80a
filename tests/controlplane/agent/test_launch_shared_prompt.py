"""A revision's `shared_prompt` engine setting (the system prompt whose prefix-cache blocks all tenants reuse) reaches
its workers as --shared-prompt, whatever characters it begins with; a value that is not a text is refused with a
400 naming it."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.errors import ControlPlaneError
from controlplane.models import Worker
from controlplane.services import action_succeed, revision_create
from inference.worker.config import parse_args

pytestmark = pytest.mark.django_db

SYSTEM = "- You are the support assistant of Acme.\n- Answer briefly."


def test_the_shared_prompt_reaches_the_workers_engine_as_given(deployment, admin, online_node):
    action = revision_create(deployment=deployment, actor=admin, engine_settings={"shared_prompt": SYSTEM},
                             comment="shared prompt")
    action_succeed(action_id=action.pk)
    deployment.refresh_from_db()
    worker = Worker(deployment=deployment, role="prefill", node=online_node, id=77,
                    revision=deployment.current_revision)
    argv = launch.argv_for(worker, 1234)
    assert parse_args(argv[argv.index("inference.worker") + 1:]).engine.shared_prompt == SYSTEM


@pytest.mark.parametrize("value", ["", 7, "a\x00b", "x" * 40_000])
def test_a_shared_prompt_that_is_not_a_text_is_refused_naming_it(deployment, admin, value):
    with pytest.raises(ControlPlaneError) as raised:
        revision_create(deployment=deployment, actor=admin, engine_settings={"shared_prompt": value}, comment="bad")
    assert "shared_prompt" in raised.value.message
