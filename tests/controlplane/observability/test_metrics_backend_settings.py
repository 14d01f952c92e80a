"""TANDEM_METRICS_BACKEND, TANDEM_PROMETHEUS_URL and TANDEM_PROMETHEUS_TIMEOUT_S: a bad value stops the process at
start with one line naming the variable, as every other setting does."""
import pytest

from tests.controlplane.test_settings import manage


@pytest.mark.parametrize("env, message", [
    ({"TANDEM_METRICS_BACKEND": "influx"}, "TANDEM_METRICS_BACKEND='influx' is not embedded or prometheus"),
    ({"TANDEM_METRICS_BACKEND": "prometheus"}, "TANDEM_METRICS_BACKEND=prometheus needs TANDEM_PROMETHEUS_URL"),
    ({"TANDEM_METRICS_BACKEND": "prometheus", "TANDEM_PROMETHEUS_URL": "localhost:9090"},
     "TANDEM_PROMETHEUS_URL='localhost:9090' is not an http:// or https:// URL"),
    ({"TANDEM_PROMETHEUS_TIMEOUT_S": "0"}, "TANDEM_PROMETHEUS_TIMEOUT_S=0 is below its minimum 1"),
])
def test_a_bad_metrics_backend_setting_fails_at_start(tmp_path, env, message):
    out = manage(["check"], tmp_path, **env)
    assert out.returncode != 0
    assert f"ImproperlyConfigured: {message}" in out.stderr


def test_the_prometheus_backend_with_a_url_starts(tmp_path):
    code = "from django.conf import settings; print(settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL)"
    out = manage(["shell", "-c", code], tmp_path, TANDEM_METRICS_BACKEND="Prometheus",
                 TANDEM_PROMETHEUS_URL="http://prometheus:9090/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "prometheus http://prometheus:9090"
