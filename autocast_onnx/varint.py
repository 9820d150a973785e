"""The protobuf varint encoding of lengths and field keys, for the code that writes encodings by
hand: the rewrite's Cast nodes (rewrite/edit.py) and the fast path's walk and splice (fast/)."""

from __future__ import annotations

_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def encode_varint(value: int) -> bytes:
    """The varint encoding of a non-negative `value` (lengths, field keys)."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
