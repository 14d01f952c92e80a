"""The KV handoff wire format (docs/contracts.md, "Decode: POST /v1/kv").

A payload is a safetensors file: tensors `k` and `v`, each [num_layers, num_prompt_tokens, num_kv_heads, head_dim]
in the revision's dtype, and one string metadata entry `tandem` holding the JSON header
{"request_id", "prompt_token_ids", "first_token_id", "sampling", "kv_layout", "revision", "checksum"}.

`checksum` (inference.kv_checksum) is "crc32:<8 hex digits>" of the header's other fields, then the bytes of `k` then
`v`: a transfer corrupted in flight (a flipped bit that leaves shapes, dtype and JSON intact, which nothing else
would notice) is refused, never decoded into garbage. It is checked first, on the raw tensor bytes, so that a
corrupted payload is named as one (KVChecksumError: the decode worker answers `kv_checksum_mismatch`, and the prefill
worker pushes once more) rather than as whatever field the flip happened to land in. A payload without it is refused.

safetensors never executes code on load (unlike pickle), and its own parser rejects offsets that point outside the
buffer; `decode_payload` adds what safetensors cannot know: that the header is complete and well typed, and that the
tensors match the receiver's KV layout. Every failure is a `KVWireError` whose message says what is wrong, for the
decode worker's 400 answer.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from inference import json_body
from inference.kv_checksum import ChecksumMismatch, payload_checksum, verify

METADATA_KEY = "tandem"
HEADER_LEN_BYTES = 8  # safetensors: little-endian u64 header length, then the JSON header, then tensor bytes
# A header can only be this big for an absurd prompt; a larger length field means garbage, not a big request.
MAX_HEADER_BYTES = 64 << 20
# Fields of the layout that change the meaning of the tensors. block_size is not one: the wire carries tokens
# contiguously, and each side re-blocks them into its own pool.
LAYOUT_KEYS = ("num_layers", "num_kv_heads", "head_dim", "dtype")


class KVWireError(ValueError):
    """A payload that cannot be accepted; the message is meant for the sender."""


class KVChecksumError(KVWireError, ChecksumMismatch):
    """A payload corrupted in flight (its checksum is missing or does not match)."""


@dataclass(slots=True)
class KVPayload:
    request_id: str
    prompt_token_ids: list[int]
    first_token_id: int
    sampling: dict
    kv_layout: dict
    revision: str | None
    k: torch.Tensor  # [num_layers, num_prompt_tokens, num_kv_heads, head_dim]
    v: torch.Tensor  # [num_layers, num_prompt_tokens, num_kv_heads, head_dim]
    extra: dict = field(default_factory=dict)

    def header(self) -> dict:
        return {"request_id": self.request_id, "prompt_token_ids": list(self.prompt_token_ids),
                "first_token_id": int(self.first_token_id), "sampling": self.sampling,
                "kv_layout": self.kv_layout, "revision": self.revision, **self.extra}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32", the spelling of kv_layout["dtype"]."""
    return str(dtype).removeprefix("torch.")


def checksum(header: dict, *tensors: torch.Tensor) -> str:
    """kv_checksum.payload_checksum of the header and the tensors' bytes in order (contiguous CPU tensors; any
    dtype)."""
    return payload_checksum(header, (t.reshape(-1).view(torch.uint8).numpy() for t in tensors if t.numel()))


def encode_payload(payload: KVPayload) -> bytes:
    """Serialize for the push. CPU and torch work: callers run it in a thread executor, off the event loop."""
    # k, v may be views into a larger export buffer, or on a GPU; safetensors wants contiguous CPU tensors, in the
    # dtype the layout names (the receiver's, when the sender was told it: a float32 prefill feeding a bfloat16
    # decode converts here, and sends half the bytes).
    dtype = getattr(torch, str(payload.kv_layout.get("dtype", dtype_name(payload.k.dtype))))
    k = payload.k.detach().to("cpu", dtype).contiguous()
    v = payload.v.detach().to("cpu", dtype).contiguous()
    header = payload.header()
    header["checksum"] = checksum(header, k, v)
    return st_save({"k": k, "v": v}, metadata={METADATA_KEY: json.dumps(header)})


def decode_payload(data: bytes, *, kv_layout: dict, revision: str | None = None) -> KVPayload:
    """Parse and check a payload against the receiver's kv_layout (and revision, when both sides have one).

    1. The safetensors header: length field, JSON, our `tandem` metadata; its checksum against the header and the
       tensor bytes (safetensors writes `k` then `v`, contiguous, after the header); then its fields with their types.
    2. The layout: the dtype (first, naming both), then every LAYOUT_KEYS field equal to ours; the revisions equal
       when both are set.
    3. The tensors: exactly `k` and `v`, loaded by safetensors (which bounds-checks every offset), with our dtype and
       the shape [num_layers, len(prompt_token_ids), num_kv_heads, head_dim].
    """
    header, data_start = _read_metadata(data)
    verify(header, (memoryview(data)[data_start:],), KVChecksumError)
    request_id = _field(header, "request_id", str)
    if not request_id:
        raise KVWireError("header field 'request_id' is empty")
    prompt_token_ids = _field(header, "prompt_token_ids", list)
    if not prompt_token_ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                       for t in prompt_token_ids):
        raise KVWireError("header field 'prompt_token_ids' must be a non-empty list of non-negative integers")
    first_token_id = _field(header, "first_token_id", int)
    if isinstance(first_token_id, bool) or first_token_id < 0:
        raise KVWireError("header field 'first_token_id' must be a non-negative integer")
    sampling = _field(header, "sampling", dict)
    their_layout = _field(header, "kv_layout", dict)
    their_revision = header.get("revision")

    if their_layout.get("dtype") != kv_layout.get("dtype"):
        # Checked first and by name: a float32 prefill must never feed a bfloat16 decode (or the reverse), and the
        # operator needs both dtypes to see which worker runs the other one.
        raise KVWireError(f"KV dtype mismatch: the payload's KV cache is {their_layout.get('dtype')!r} (the prefill "
                          f"worker's KV cache dtype), this decode worker's is {kv_layout.get('dtype')!r}; the prefill "
                          "worker converts only when the request names the decode worker's KV cache dtype "
                          "(decode_kv_dtype)")
    for key in LAYOUT_KEYS:
        if their_layout.get(key) != kv_layout.get(key):
            raise KVWireError(f"KV layout mismatch on {key}: payload has {their_layout.get(key)!r}, "
                              f"this worker has {kv_layout.get(key)!r}")
    if revision is not None and their_revision is not None and str(their_revision) != str(revision):
        raise KVWireError(f"revision mismatch: payload is from revision {their_revision!r}, "
                          f"this worker runs {revision!r}")

    try:
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError (truncated, overlapping, bad dtype...)
        raise KVWireError(f"corrupt safetensors payload: {exc}") from None
    if set(tensors) != {"k", "v"}:
        raise KVWireError(f"payload must hold exactly the tensors 'k' and 'v', got {sorted(tensors)}")
    expected_shape = (kv_layout["num_layers"], len(prompt_token_ids), kv_layout["num_kv_heads"],
                      kv_layout["head_dim"])
    for name in ("k", "v"):
        t = tensors[name]
        if dtype_name(t.dtype) != kv_layout["dtype"]:
            raise KVWireError(f"tensor {name!r} has dtype {dtype_name(t.dtype)}, expected {kv_layout['dtype']}")
        if tuple(t.shape) != expected_shape:
            raise KVWireError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(expected_shape)} "
                              "[num_layers, num_prompt_tokens, num_kv_heads, head_dim]")
    known = {"request_id", "prompt_token_ids", "first_token_id", "sampling", "kv_layout", "revision", "checksum"}
    return KVPayload(request_id=request_id, prompt_token_ids=prompt_token_ids, first_token_id=first_token_id,
                     sampling=sampling, kv_layout=their_layout, revision=their_revision,
                     k=tensors["k"], v=tensors["v"], extra={k: v for k, v in header.items() if k not in known})


def _read_metadata(data: bytes) -> tuple[dict, int]:
    """The `tandem` header, and where the tensor bytes begin."""
    if len(data) < HEADER_LEN_BYTES:
        raise KVWireError(f"payload of {len(data)} bytes is too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:HEADER_LEN_BYTES])
    if header_len > MAX_HEADER_BYTES or HEADER_LEN_BYTES + header_len > len(data):
        raise KVWireError(f"safetensors header length {header_len} does not fit the {len(data)}-byte payload "
                          "(truncated or not safetensors)")
    try:
        st_header = json_body.loads(data[HEADER_LEN_BYTES:HEADER_LEN_BYTES + header_len])
    except json_body.JSONBodyError as exc:
        raise KVWireError(f"safetensors header: {exc}") from None
    except (UnicodeDecodeError, ValueError):
        raise KVWireError("safetensors header is not valid JSON (corrupt payload)") from None
    if not isinstance(st_header, dict):
        raise KVWireError("safetensors header is not a JSON object")
    metadata = st_header.get("__metadata__") or {}
    raw = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(raw, str):
        raise KVWireError(f"payload has no {METADATA_KEY!r} metadata header")
    try:
        header = json_body.loads(raw)
    except json_body.JSONBodyError as exc:
        raise KVWireError(f"{METADATA_KEY!r} metadata: {exc}") from None
    except ValueError:
        raise KVWireError(f"{METADATA_KEY!r} metadata is not valid JSON") from None
    if not isinstance(header, dict):
        raise KVWireError(f"{METADATA_KEY!r} metadata is not a JSON object")
    return header, HEADER_LEN_BYTES + header_len


def _field(header: dict, name: str, kind: type):
    if name not in header:
        raise KVWireError(f"header lacks the field {name!r}")
    value = header[name]
    if not isinstance(value, kind):
        raise KVWireError(f"header field {name!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value
