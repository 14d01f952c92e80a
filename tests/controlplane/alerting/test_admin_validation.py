"""Django admin edits go through the same validation as the API: a broken rule or silence is refused."""
import pytest


def test_django_admin_validation_refuses_a_broken_rule(quiet_deployment):
    from django.core.exceptions import ValidationError

    from controlplane.alerting.models import AlertRule

    rule = AlertRule(name="broken", deployment=quiet_deployment, role="decode", metric="kv_cache_usage_ratio",
                     comparison=">", threshold=1, actions=[{"type": "restart"}])
    with pytest.raises(ValidationError, match="per-worker"):
        rule.full_clean()


def test_django_admin_validation_refuses_a_broken_silence():
    from datetime import timedelta

    from django.core.exceptions import ValidationError
    from django.utils import timezone

    from controlplane.alerting.models import Silence

    silence = Silence(matchers=[{"name": "role", "value": "(", "is_regex": True}], comment="x",
                      ends_at=timezone.now() + timedelta(hours=1))
    with pytest.raises(ValidationError, match="not a valid regex"):
        silence.full_clean()
