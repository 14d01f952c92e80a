import pytest


@pytest.fixture
def scaled(deployment, make_worker):
    """The test deployment with autoscaling on and one ready decode worker."""
    deployment.autoscale_enabled = True
    deployment.save()
    make_worker(deployment, "decode")
    return deployment
