"""The KV wire format round-trips exactly and rejects every malformed payload with a message naming the problem; a
payload corrupted anywhere (tensor bytes, header values) or without its checksum is refused as corrupted."""
from __future__ import annotations

import json
import pickle
import struct

import pytest
import torch
from safetensors.torch import save as st_save

from inference.kv_checksum import ChecksumMismatch, payload_checksum
from inference.kv_wire import KVPayload, KVWireError, decode_payload, encode_payload

LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": "float32", "block_size": 16}


def payload(num_tokens: int = 5, **overrides) -> KVPayload:
    g = torch.Generator().manual_seed(0)
    shape = (LAYOUT["num_layers"], num_tokens, LAYOUT["num_kv_heads"], LAYOUT["head_dim"])
    fields = dict(request_id="r1", prompt_token_ids=list(range(10, 10 + num_tokens)), first_token_id=7,
                  sampling={"max_tokens": 4, "temperature": 0.0}, kv_layout=dict(LAYOUT), revision="3",
                  k=torch.randn(shape, generator=g), v=torch.randn(shape, generator=g))
    fields.update(overrides)
    return KVPayload(**fields)


def signed_save(tensors: dict, header: dict) -> bytes:
    """A payload as a sender other than encode_payload writes it (any tensors, any header), with a valid checksum:
    that of the header and the data that follows safetensors' header (which the metadata does not change)."""
    bare = st_save(tensors)
    (header_len,) = struct.unpack("<Q", bare[:8])
    header = {**header, "checksum": payload_checksum(header, (bare[8 + header_len:],))}
    return st_save(tensors, metadata={"tandem": json.dumps(header)})


def test_it_round_trips_tensors_and_header_exactly():
    sent = payload()
    got = decode_payload(encode_payload(sent), kv_layout=LAYOUT, revision="3")
    assert torch.equal(got.k, sent.k) and torch.equal(got.v, sent.v)
    assert (got.request_id, got.prompt_token_ids, got.first_token_id) == ("r1", sent.prompt_token_ids, 7)
    assert got.sampling == sent.sampling


def test_it_accepts_a_non_contiguous_export_view():
    base = torch.randn(2, 2, 5, 8)  # [L, H, S, D]: an export in another order, transposed into the wire order
    sent = payload(k=base.transpose(1, 2), v=base.transpose(1, 2))
    got = decode_payload(encode_payload(sent), kv_layout=LAYOUT)
    assert torch.equal(got.k, base.transpose(1, 2))


def test_a_different_block_size_is_fine_because_the_wire_carries_tokens():
    sent = payload(kv_layout={**LAYOUT, "block_size": 32})
    got = decode_payload(encode_payload(sent), kv_layout=LAYOUT)
    assert torch.equal(got.k, sent.k) and torch.equal(got.v, sent.v) and got.prompt_token_ids == sent.prompt_token_ids


@pytest.mark.parametrize("data, message", [
    (b"", "too short"),
    (b"garbage bytes that are not a safetensors file", "does not fit"),
    (b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all", "not valid JSON"),
    (pickle.dumps({"k": [1, 2, 3]}), "safetensors"),
])
def test_it_rejects_garbage(data, message):
    with pytest.raises(KVWireError, match=message):
        decode_payload(data, kv_layout=LAYOUT)


def test_it_rejects_a_truncated_payload():
    data = encode_payload(payload())
    for cut in (len(data) - 1, len(data) // 2, 20):
        with pytest.raises(KVWireError, match="corrupt|does not fit|truncated|JSON"):
            decode_payload(data[:cut], kv_layout=LAYOUT)


@pytest.mark.parametrize("key, value", [("num_layers", 3), ("num_kv_heads", 4), ("head_dim", 16)])
def test_it_rejects_a_layout_mismatch_naming_the_field(key, value):
    data = encode_payload(payload(kv_layout={**LAYOUT, key: value}))
    with pytest.raises(KVWireError, match=f"mismatch on {key}"):
        decode_payload(data, kv_layout=LAYOUT)


def test_it_rejects_kv_of_another_dtype_naming_both_dtypes():
    sent = payload(kv_layout={**LAYOUT, "dtype": "bfloat16"})
    sent.k, sent.v = sent.k.bfloat16(), sent.v.bfloat16()
    with pytest.raises(KVWireError, match="KV dtype mismatch: the payload's KV cache is 'bfloat16' .* this decode "
                                          "worker's is 'float32'"):
        decode_payload(encode_payload(sent), kv_layout=LAYOUT)


def test_it_rejects_tensors_whose_shape_disagrees_with_the_prompt_length():
    sent = payload(num_tokens=5)
    sent.prompt_token_ids = sent.prompt_token_ids[:4]
    with pytest.raises(KVWireError, match=r"shape \[2, 5, 2, 8\], expected \[2, 4, 2, 8\]"):
        decode_payload(encode_payload(sent), kv_layout=LAYOUT)


def test_encoding_converts_the_tensors_to_the_dtype_the_layout_names():
    sent = payload(kv_layout={**LAYOUT, "dtype": "bfloat16"})  # float32 tensors, a bfloat16 receiver
    got = decode_payload(encode_payload(sent), kv_layout={**LAYOUT, "dtype": "bfloat16"})
    assert got.k.dtype == torch.bfloat16 and torch.equal(got.k, sent.k.to(torch.bfloat16))


def test_it_rejects_a_dtype_that_the_layout_does_not_announce():
    sent = payload()  # a sender that writes float16 tensors under a float32 layout (not encode_payload: it converts)
    data = signed_save({"k": sent.k.half(), "v": sent.v.half()}, sent.header())
    with pytest.raises(KVWireError, match="dtype float16, expected float32"):
        decode_payload(data, kv_layout=LAYOUT)


def test_it_rejects_another_revision():
    with pytest.raises(KVWireError, match="revision mismatch"):
        decode_payload(encode_payload(payload(revision="2")), kv_layout=LAYOUT, revision="3")


def test_it_rejects_missing_or_mistyped_header_fields():
    good = payload()
    t = {"k": good.k, "v": good.v}
    with pytest.raises(KVWireError, match="no 'tandem' metadata"):
        decode_payload(st_save(t), kv_layout=LAYOUT)
    header = good.header()
    del header["first_token_id"]
    with pytest.raises(KVWireError, match="lacks the field 'first_token_id'"):
        decode_payload(signed_save(t, header), kv_layout=LAYOUT)
    header = {**good.header(), "prompt_token_ids": ["a", "b"]}
    with pytest.raises(KVWireError, match="prompt_token_ids"):
        decode_payload(signed_save(t, header), kv_layout=LAYOUT)
    with pytest.raises(KVWireError, match="exactly the tensors"):
        decode_payload(signed_save({"k": good.k}, good.header()), kv_layout=LAYOUT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_bit_flipped_in_flight_is_refused_by_its_checksum(dtype):
    layout = {**LAYOUT, "dtype": str(dtype).removeprefix("torch.")}
    sent = payload(kv_layout=layout, k=payload().k.to(dtype), v=payload().v.to(dtype))
    data = bytearray(encode_payload(sent))
    assert torch.equal(decode_payload(bytes(data), kv_layout=layout).v, sent.v)  # intact: accepted
    data[-3] ^= 0x10  # one bit of the last tensor's bytes: shapes, dtype and header all still parse
    with pytest.raises(KVWireError, match="checksum mismatch.*corrupted in transit") as refused:
        decode_payload(bytes(data), kv_layout=layout)
    assert isinstance(refused.value, ChecksumMismatch)  # the decode worker's kv_checksum_mismatch


# The `tandem` header is a JSON string inside safetensors' JSON header: its quotes are escaped there.
@pytest.mark.parametrize("old, new", [(rb'\"first_token_id\": 7', rb'\"first_token_id\": 8'),
                                      (rb'\"prompt_token_ids\": [10, ', rb'\"prompt_token_ids\": [11, '),
                                      (rb'\"temperature\": 0.0', rb'\"temperature\": 0.9')])
def test_a_header_value_flipped_in_flight_is_refused_by_its_checksum(old, new):
    """Valid JSON that says something else (one byte changed): no shape or layout check would notice it, the
    checksum does."""
    data = encode_payload(payload())
    assert data.count(old) == 1
    with pytest.raises(KVWireError, match="checksum mismatch") as refused:
        decode_payload(data.replace(old, new), kv_layout=LAYOUT)
    assert isinstance(refused.value, ChecksumMismatch)


def test_a_payload_without_a_checksum_is_refused_as_corrupted():
    """A flip in the key `checksum` must not turn a corrupted payload into an unchecked one."""
    sent = payload()
    data = st_save({"k": sent.k, "v": sent.v}, metadata={"tandem": json.dumps(sent.header())})
    with pytest.raises(KVWireError, match="no checksum") as refused:
        decode_payload(data, kv_layout=LAYOUT)
    assert isinstance(refused.value, ChecksumMismatch)
    renamed = encode_payload(sent).replace(rb'\"checksum\"', rb'\"checksuN\"')
    assert renamed != encode_payload(sent)
    with pytest.raises(KVWireError, match="no checksum"):
        decode_payload(renamed, kv_layout=LAYOUT)
