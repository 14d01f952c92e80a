"""The what-if pages' tests' deployment: `demo` with 1 prefill + 2 decode, profiled, objectives of 2 s TTFT and
0.1 s ITL, and a short trace (`peak`, 20 requests/s) that two decode workers carry and one cannot (the same setup as
tests/controlplane/replay/test_what_if.py, with fewer requests)."""
from __future__ import annotations

import json

from controlplane.capacity.models import Profile
from controlplane.models import Deployment, Pool
from controlplane.replay.services import trace_import

NUM_REQUESTS = 400


def profile_with_peak_trace(deployment, *, num_requests: int = NUM_REQUESTS):
    revision = deployment.current_revision
    common = {"max_num_seqs": 32, "max_batch_tokens": 2048, "kv_capacity_tokens": 200_000, "kv_bytes_per_token": 4096}
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}},
                           **common)
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 5e-4, "c": 1e-7},
                                                                   "kv_transfer": {"seconds_per_token": 1e-5}},
                           **common)
    Pool.objects.filter(deployment=deployment, role="decode").update(desired_replicas=2)
    Deployment.objects.filter(pk=deployment.pk).update(objectives={"ttft_p99_seconds": 2.0, "itl_p99_seconds": 0.1,
                                                                   "e2e_p99_seconds": 60.0})
    lines = [json.dumps({"at_s": i / 20, "prompt_tokens": 50, "completion_tokens": 100, "tenant": f"t{i % 3}",
                         "class": "standard", "outcome": "ok"}) for i in range(num_requests)]
    trace_import(deployment, name="peak", fmt="tandem", text="\n".join(lines), actor="test")
    return Deployment.objects.get(pk=deployment.pk)
