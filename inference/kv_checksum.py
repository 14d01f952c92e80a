"""The KV payload's checksum (docs/contracts.md, "Decode: POST /v1/kv"), shared by the real codec (inference.kv_wire)
and the simulated one (inference.worker.sim.kv), so that a simulated decode worker refuses a corrupted push exactly
as a real one does. Torch-free.

`checksum` is "crc32:<8 hex digits>" over the `tandem` header's fields except `checksum` itself (as canonical JSON:
sorted keys, no spaces), then the bytes of `k`, then those of `v`. The header is covered because a byte flipped
there can leave valid JSON that means something else (another `first_token_id`, a prompt token), which no shape or
layout check would notice; and the checksum is required, because a flip in the key `checksum` would otherwise turn a
corrupted payload into one "from an older sender", accepted unchecked. CRC-32 catches every error burst up to 32
bits and misses others with probability 2^-32: enough for faults in flight, not a defence against a forger.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

PREFIX = "crc32:"


class ChecksumMismatch(ValueError):
    """A payload whose checksum is missing or does not match: corrupted in flight, worth pushing again."""


def signed_header(header: dict) -> bytes:
    """The header's fields that the checksum covers, as canonical JSON (a parsed and re-dumped header gives the same
    bytes, whatever spacing and key order the sender wrote)."""
    return json.dumps({k: v for k, v in header.items() if k != "checksum"}, sort_keys=True,
                      separators=(",", ":")).encode()


def payload_checksum(header: dict, chunks: Iterable) -> str:
    """crc32 of signed_header(header), then each chunk (bytes-like: the tensors' bytes, k then v)."""
    crc = zlib.crc32(signed_header(header))
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return f"{PREFIX}{crc:08x}"


def verify(header: dict, chunks: Iterable, error: type[ChecksumMismatch] = ChecksumMismatch) -> None:
    """Raise `error` (a ChecksumMismatch) unless the header's `checksum` is that of the header and chunks."""
    sent = header.get("checksum")
    if not isinstance(sent, str) or not sent.startswith(PREFIX):
        raise error(f"KV payload has no checksum ({PREFIX}<8 hex digits> in the header's 'checksum'): corrupted in "
                    "transit, or a sender too old to write one; push it again")
    got = payload_checksum(header, chunks)
    if sent != got:
        raise error(f"KV payload checksum mismatch: the header says {sent!r}, the payload hashes to {got!r} "
                    "(corrupted in transit); push it again")
