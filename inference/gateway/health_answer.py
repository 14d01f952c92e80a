"""What a worker's /health answer says, read onto the router's Worker: whether it serves (None) or why not, and
what it runs (dtype, KV cache dtype, context, prefix caching, sequences at once, the longest prompt it takes).

A Tandem worker says all of it; a vLLM worker answers a bare 200 once its engine runs (it listens only once loaded)
and 503 once its engine died: what it serves is the revision's, which the membership gives (routing.set_groups).
Pure: no I/O; health_probe.probe fetches the answer and acts on the verdict.
"""
from __future__ import annotations

from inference.checks import is_int
from inference.engines import TANDEM


def health_read(worker, status: int, body: object) -> str | None:
    """None when the answer says the worker serves (its facts then set on `worker`, a routing.Worker), else the
    reason it does not."""
    if worker.engine != TANDEM:
        return None if status == 200 else f"HTTP {status} from its /health"
    if not isinstance(body, dict):
        body = {}
    if status != 200 or body.get("status") != "ok":
        return f"HTTP {status} {body.get('status', '')} {body.get('reason', '')}".strip()
    role = body.get("role")
    if role is not None and role != worker.role.value:
        return f"is a {role} worker, listed as {worker.role.value}"
    dtype, kv_cache_dtype = body.get("dtype"), body.get("kv_cache_dtype")
    worker.dtype = dtype if isinstance(dtype, str) else None
    worker.kv_cache_dtype = kv_cache_dtype if isinstance(kv_cache_dtype, str) else None
    max_model_len = body.get("max_model_len")
    worker.max_model_len = max_model_len if is_int(max_model_len) else None
    worker.prefix_caching = body.get("prefix_caching") is True
    max_num_seqs = body.get("max_num_seqs")
    worker.max_num_seqs = max_num_seqs if is_int(max_num_seqs) and max_num_seqs >= 1 else None
    batch_limit = body.get("batch_limit")
    worker.batch_limit = batch_limit if is_int(batch_limit) and batch_limit >= 1 else None
    max_prompt_chars = body.get("max_prompt_chars")
    worker.max_prompt_chars = max_prompt_chars if is_int(max_prompt_chars) else None
    return None
