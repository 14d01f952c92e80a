"""`tandem_agent --label tandem.weight=W` sets the routing weight of the node's workers; a value that is not a weight
stops the agent before it registers, with a message naming the label."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from controlplane.models import Node

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value,message", [("0", "must be above 0 and at most 100"),
                                           ("heavy", "must be a decimal number such as 3 or 0.5")])
def test_an_agent_labelled_with_a_bad_weight_refuses_to_start(value, message):
    with pytest.raises(CommandError) as raised:
        call_command("tandem_agent", "--name", "weighed", "--label", f"tandem.weight={value}")
    assert "tandem.weight (a routing weight)" in str(raised.value) and message in str(raised.value)
    assert not Node.objects.filter(name="weighed").exists()
