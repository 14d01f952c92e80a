"""make run picks the demo's engine settings per role for the CPU it runs on: prefill `auto` (bfloat16 where native,
compute-bound); decode, with TANDEM_DEMO_DECODE_INT8=1, INT8 weights where the CPU steps them faster (an int8 dot
product, or AVX2 for Tandem's int8 kernel; memory-bound), as prefill on a CPU with neither or by default (the demo's
2 GB); the reason is the revision's comment,
which the deployment page shows beside the settings."""
from __future__ import annotations

import json

import pytest

from controlplane.run import demo
from inference import hardware

VNNI_BF16 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"})
AVX2_ONLY = frozenset({"avx2", "fma"})
NEITHER = frozenset({"sse4_2", "avx"})


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.fixture(autouse=True)
def int8_decode_on(settings):
    settings.TANDEM_DEMO_DECODE_INT8 = True


@pytest.fixture
def cpu(monkeypatch):
    def set_flags(flags):
        monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)

    return set_flags


def test_decode_runs_int8_weights_where_the_cpu_has_an_int8_dot_product(cpu):
    cpu(VNNI_BF16)
    engine_settings, why = demo.demo_engine_settings()
    assert engine_settings == {"common": {"threads": 1}, "decode": {"quantization": "int8"}}
    assert "decode INT8 weights" in why and "bfloat16, computed natively here" in why


def test_by_default_both_roles_run_auto_within_the_demos_memory(cpu, settings):
    settings.TANDEM_DEMO_DECODE_INT8 = False
    cpu(VNNI_BF16)
    engine_settings, why = demo.demo_engine_settings()
    assert engine_settings == {"common": {"threads": 1}}
    assert "TANDEM_DEMO_DECODE_INT8=1" in why and "2 GB" in why


def test_an_avx2_only_cpu_decodes_int8_through_tandems_kernel_and_one_with_neither_keeps_auto(cpu):
    cpu(AVX2_ONLY)
    engine_settings, why = demo.demo_engine_settings()
    assert engine_settings == {"common": {"threads": 1}, "decode": {"quantization": "int8"}}
    assert "float32, no native bfloat16 here" in why
    cpu(NEITHER)
    engine_settings, why = demo.demo_engine_settings()
    assert engine_settings == {"common": {"threads": 1}}
    assert "neither an int8 dot product nor AVX2" in why


def test_the_demo_is_created_with_the_pick_and_the_page_says_why(db, cpu, model, settings, client):
    from django.contrib.auth import get_user_model

    from controlplane.auth import Role, set_role
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    cpu(VNNI_BF16)
    deployment, what = demo.demo_deployment_ensure(model)
    revision = deployment.current_revision
    assert what == "created" and revision.engine_settings["decode"] == {"quantization": "int8"}
    assert revision.settings_for("decode")["quantization"] == "int8"
    assert "quantization" not in revision.settings_for("prefill")
    user = get_user_model().objects.create_user("watcher")
    set_role(user, Role.VIEWER)
    client.force_login(user)
    html = client.get("/deployments/demo/").content.decode()
    assert 'data-setting="decode.quantization"' in html
    assert "Revision comment: make run picked per role for this CPU" in html


def test_a_demo_of_an_earlier_make_run_rolls_to_the_pick_but_an_operators_revision_stays(db, cpu, model, settings,
                                                                                         admin):
    from controlplane.models import Action
    from controlplane.services import action_succeed, revision_create
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    cpu(NEITHER)
    deployment, _ = demo.demo_deployment_ensure(model)
    cpu(VNNI_BF16)  # the same database on a host with VNNI (or a make run from before the pick)
    deployment, what = demo.demo_deployment_ensure(model)
    deployment.refresh_from_db()
    assert what == "new revision with engine settings picked per role for this CPU"
    assert deployment.current_revision.number == 2
    assert deployment.current_revision.engine_settings["decode"] == {"quantization": "int8"}
    action_succeed(action_id=Action.objects.get(kind="revision").pk)  # the rollout finished
    revision_create(deployment=deployment, actor=admin, engine_settings={"threads": 2}, reason="mine")
    deployment, what = demo.demo_deployment_ensure(model)
    deployment.refresh_from_db()
    assert what == "exists" and deployment.current_revision.engine_settings == {"common": {"threads": 2}}
