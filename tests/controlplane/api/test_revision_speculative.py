"""A revision may carry `speculative` (an object) in common, decode or colocated; a bad value is a 400 naming the
key inside it (`decode.speculative.num_tokens`), a prefill part is refused, and no revision is made."""
from __future__ import annotations

import pytest

from controlplane.models import Deployment

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/demo/revisions/"


def test_speculation_for_the_decode_workers_is_made_current_with_its_defaults(admin_api, deployment):
    response = admin_api.post(URL, {"engine_settings": {"decode": {"speculative": {"method": "ngram",
                                                                                   "num_tokens": 4}}}},
                              format="json")
    assert response.status_code == 202, response.content
    revision = Deployment.objects.get(pk=deployment.pk).current_revision
    assert revision.settings_for("decode")["speculative"] == {"method": "ngram", "num_tokens": 4, "ngram_max": 4,
                                                             "ngram_min": 2, "min_acceptance": 0.2}
    assert "speculative" not in revision.settings_for("prefill")


@pytest.mark.parametrize("spec, field, fragment", [
    ({"method": "ngram", "num_tokens": 0}, "decode.speculative.num_tokens", "1..16"),
    ({"method": "ngram", "num_tokens": 99}, "decode.speculative.num_tokens", "99"),
    ({"method": "medusa", "num_tokens": 2}, "decode.speculative.method", "ngram, layers"),
    ({"method": "layers", "num_tokens": 2}, "decode.speculative.layers", "None"),
    ({"method": "ngram", "num_tokens": 2, "layers": 3}, "decode.speculative.layers", "not a key of method ngram"),
    ({"method": "ngram", "num_tokens": 2, "ngram_min": 5, "ngram_max": 3}, "decode.speculative.ngram_min",
     "at most ngram_max"),
    ({"method": "ngram", "num_tokens": True}, "decode.speculative.num_tokens", "True"),
    ("ngram", "decode.speculative", "must be null or an object"),
])
def test_a_bad_speculative_setting_is_400_naming_its_key_and_makes_no_revision(admin_api, deployment, spec, field,
                                                                                fragment):
    response = admin_api.post(URL, {"engine_settings": {"decode": {"speculative": spec}}}, format="json")
    assert response.status_code == 400, response.content
    body = str(response.json())
    assert f"engine_settings.{field}" in body and fragment in body, body
    assert deployment.revisions.count() == 1


def test_speculation_in_the_prefill_part_is_400(admin_api, deployment):
    response = admin_api.post(URL, {"engine_settings": {"prefill": {"speculative": {"method": "ngram",
                                                                                    "num_tokens": 4}}}},
                              format="json")
    assert response.status_code == 400, response.content
    assert "engine_settings.prefill.speculative" in str(response.json())
    assert "decode and colocated" in str(response.json())
    assert deployment.revisions.count() == 1
