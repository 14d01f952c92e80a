"""The built-in templates: at least ten, each an experiment that Tandem's own validation accepts on a
disaggregated deployment against the role it is written for, with the hypothesis and abort condition they share."""
from __future__ import annotations

import pytest

from controlplane.chaos.library import TEMPLATES
from controlplane.chaos.services import experiment_from_template
from controlplane.errors import ControlPlaneError


def test_there_are_at_least_ten_templates_with_distinct_keys():
    assert len(TEMPLATES) >= 10
    assert len({template.key for template in TEMPLATES}) == len(TEMPLATES)


@pytest.mark.django_db
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda template: template.key)
def test_each_template_makes_a_valid_experiment(deployment, admin, template):
    experiment = experiment_from_template(deployment=deployment, actor=admin, template=template.key)
    assert experiment.name == template.key and experiment.target == {"role": template.role, "count": 1}
    assert [fault["kind"] for fault in experiment.faults] == [fault["kind"] for fault in template.faults]
    assert experiment.duration_s == template.duration_s
    assert experiment.hypothesis[0] == {"metric": "server_error_ratio", "role": "gateway", "max": 0.005,
                                        "window_s": 10}
    assert experiment.abort_conditions == [{"metric": "server_error_ratio", "role": "gateway", "above": 0.05,
                                            "for_s": 10.0, "window_s": 5}]
    ready = [check for check in experiment.hypothesis if check["metric"] == "ready_workers"]
    assert ready == ([] if template.role == "gateway" else [{"metric": "ready_workers", "role": template.role,
                                                             "min": 1.0}])


@pytest.mark.django_db
def test_a_template_against_a_role_the_deployment_lacks_is_a_400_naming_the_field(deployment, admin):
    with pytest.raises(ControlPlaneError) as refused:
        experiment_from_template(deployment=deployment, actor=admin, template="decode-kill", role="colocated")
    assert refused.value.status == 400 and refused.value.extra["field"] == "target.role"
