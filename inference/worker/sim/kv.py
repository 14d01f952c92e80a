"""The fake KV payload: the real wire format (inference.kv_wire: safetensors with `k`, `v` and the `tandem` JSON
header, its checksum included), written and checked without torch. The tensors are zeros of the profile's small
kv_layout; a real decode worker would refuse them only for that layout, never for their framing. The checksum is the
real one (inference.kv_checksum), checked first, so that a push corrupted in flight is refused by a simulated decode
worker as by a real one.
"""
from __future__ import annotations

import json
import struct

from inference import json_body
from inference.kv_checksum import ChecksumMismatch, payload_checksum, verify

METADATA_KEY = "tandem"
ST_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}
MAX_HEADER_BYTES = 64 << 20


class FakeKVError(ValueError):
    """A payload a simulated decode worker refuses; the message is for the sender."""


class FakeKVChecksumError(FakeKVError, ChecksumMismatch):
    """A payload corrupted in flight."""


def encode_fake_payload(header: dict, kv_layout: dict) -> bytes:
    """A safetensors file holding zero `k` and `v` [num_layers, num_prompt_tokens, num_kv_heads, head_dim]."""
    st_dtype, itemsize = ST_DTYPES[kv_layout["dtype"]]
    shape = [kv_layout["num_layers"], len(header["prompt_token_ids"]), kv_layout["num_kv_heads"],
             kv_layout["head_dim"]]
    nbytes = itemsize * shape[0] * shape[1] * shape[2] * shape[3]
    header = {**header, "checksum": payload_checksum(header, (bytes(2 * nbytes),))}
    st_header = {"__metadata__": {METADATA_KEY: json.dumps(header)},
                 "k": {"dtype": st_dtype, "shape": shape, "data_offsets": [0, nbytes]},
                 "v": {"dtype": st_dtype, "shape": shape, "data_offsets": [nbytes, 2 * nbytes]}}
    raw = json.dumps(st_header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + bytes(2 * nbytes)


def decode_fake_payload(data: bytes, *, kv_layout: dict) -> dict:
    """The `tandem` header of a payload whose framing, fields and tensor shapes match `kv_layout`."""
    if len(data) < 8:
        raise FakeKVError(f"payload of {len(data)} bytes is too short to be a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(data):
        raise FakeKVError(f"safetensors header length {header_len} does not fit the {len(data)}-byte payload")
    try:
        st_header = json_body.loads(data[8:8 + header_len])
        header = json_body.loads(st_header["__metadata__"][METADATA_KEY])
    except (json_body.JSONBodyError, ValueError, KeyError, TypeError):
        raise FakeKVError(f"payload has no readable {METADATA_KEY!r} metadata header") from None
    if not isinstance(header, dict):
        raise FakeKVError(f"{METADATA_KEY!r} metadata is not a JSON object")
    verify(header, (memoryview(data)[8 + header_len:],), FakeKVChecksumError)
    for name, kind in (("request_id", str), ("prompt_token_ids", list), ("first_token_id", int),
                       ("sampling", dict), ("kv_layout", dict)):
        if not isinstance(header.get(name), kind):
            raise FakeKVError(f"header field {name!r} must be a {kind.__name__}")
    ids = header["prompt_token_ids"]
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise FakeKVError("header field 'prompt_token_ids' must be a non-empty list of non-negative integers")
    theirs = header["kv_layout"]
    if theirs.get("dtype") != kv_layout["dtype"]:
        raise FakeKVError(f"KV dtype mismatch: the payload's KV cache is {theirs.get('dtype')!r}, this decode worker "
                          f"runs {kv_layout['dtype']!r}")
    for key in ("num_layers", "num_kv_heads", "head_dim"):
        if theirs.get(key) != kv_layout[key]:
            raise FakeKVError(f"KV layout mismatch on {key}: payload has {theirs.get(key)!r}, "
                              f"this worker has {kv_layout[key]!r}")
    st_dtype, itemsize = ST_DTYPES[kv_layout["dtype"]]
    shape = [kv_layout["num_layers"], len(ids), kv_layout["num_kv_heads"], kv_layout["head_dim"]]
    nbytes = itemsize * shape[0] * shape[1] * shape[2] * shape[3]
    for i, name in enumerate(("k", "v")):
        t = st_header.get(name)
        if not isinstance(t, dict) or t.get("dtype") != st_dtype or t.get("shape") != shape \
                or t.get("data_offsets") != [i * nbytes, (i + 1) * nbytes]:
            raise FakeKVError(f"tensor {name!r} must be {st_dtype} of shape {shape} "
                              "[num_layers, num_prompt_tokens, num_kv_heads, head_dim]")
    if len(data) != 8 + header_len + 2 * nbytes:
        raise FakeKVError(f"payload is {len(data)} bytes; its header describes {8 + header_len + 2 * nbytes}")
    return header


class FakeKV:
    """The KVCodec (inference.worker.seams) of a simulated worker: zeros of the profile's small kv_layout."""

    # A fake payload is tiny whatever the prompt; the bound only keeps a stray upload out.
    BODY_LIMIT = 64 << 20

    def __init__(self, kv_layout: dict):
        self.kv_layout = kv_layout

    def body_limit(self, info: dict) -> int:
        return self.BODY_LIMIT

    async def encode(self, header: dict, kv: tuple) -> bytes:
        return encode_fake_payload(header, self.kv_layout)

    async def decode(self, body: bytes, *, kv_layout: dict, revision: str | None) -> tuple[dict, tuple]:
        """The header (FakeKVError, a ValueError, when the payload does not fit); the revision is not checked."""
        return decode_fake_payload(body, kv_layout=kv_layout), ()
