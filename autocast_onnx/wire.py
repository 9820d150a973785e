"""The protobuf encoding of an ONNX file, walked without parsing it: where the main graph and
its initializers lie in the file's bytes, and where each initializer keeps its payload. Two
stages use it on a mapped file: the loader (io.load_model, which leaves large fp32 payloads in
the file) and the weight screen's worker (plan/screen.py, which converts them from the file).

Field numbers (onnx.proto): ModelProto.graph 7; GraphProto.initializer 5; TensorProto dims 1,
data_type 2, segment 3, float_data 4, int32_data 5, string_data 6, int64_data 7, name 8,
raw_data 9, double_data 10, uint64_data 11, external_data 13, data_location 14.

Anything the walk does not follow (a second graph field, which a parser would merge; a field
that overruns its message; an unknown wire type) raises Unwalked, and the caller parses the
file the ordinary way."""

from __future__ import annotations

from typing import NamedTuple

GRAPH_KEY = 7 << 3 | 2  # ModelProto.graph
INITIALIZER_KEY = 5 << 3 | 2  # GraphProto.initializer
INPUT_KEY = 11 << 3 | 2  # GraphProto.input
_DATA_TYPE = 2 << 3
_NAME = 8 << 3 | 2
RAW_KEY = 9 << 3 | 2  # TensorProto.raw_data
_LOCATION = 14 << 3
# fields that hold a payload some other way than raw_data (or say where it is)
_OTHER_DATA = frozenset({3, 4, 5, 6, 7, 10, 11, 13})
EXTERNAL = 1  # TensorProto.EXTERNAL
FLOAT = 1  # TensorProto.FLOAT
# fp32 payloads at least this large may be left in the model's file by the loader (io.load_model)
LEFT_IN_FILE_MIN_BYTES = 4096


class Unwalked(Exception):
    """An encoding the walk does not follow."""


class Initializer(NamedTuple):
    """One initializer of the main graph as the file encodes it. `key` is where its field key
    starts, `start`/`stop` bound its TensorProto bytes, `raw` is (key position, payload start,
    payload length) of its raw_data or None; `plain` says that raw_data is its only payload
    (no typed data fields, no segment, no external data, raw_data given once)."""

    ordinal: int
    key: int
    start: int
    stop: int
    dtype: int
    name: bytes
    raw: tuple[int, int, int] | None
    external: bool
    plain: bool


def varint(data, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7


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


def skip(data, pos: int, wire: int) -> int:
    """The position after a field's value of wire type `wire` that starts at `pos`."""
    if wire == 0:
        return varint(data, pos)[1]
    if wire == 2:
        length, pos = varint(data, pos)
        return pos + length
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    raise Unwalked(f"wire type {wire}")


def main_graph(data) -> tuple[int, int, int]:
    """(key position, body start, body stop) of the ModelProto's graph field."""
    end = len(data)
    pos = 0
    graph = None
    while pos < end:
        at = pos
        key, pos = varint(data, pos)
        if key == GRAPH_KEY:
            length, pos = varint(data, pos)
            if graph is not None:
                raise Unwalked("two graph fields")
            graph = (at, pos, pos + length)
            pos += length
        else:
            pos = skip(data, pos, key & 7)
    if graph is None or pos != end:
        raise Unwalked("no graph")
    return graph


def initializers(data, graph: tuple[int, int, int] | None = None):
    """Each initializer of the main graph of the serialized ModelProto `data`, in the order
    protobuf parses them (ordinal = position in graph.initializer)."""
    _, pos, end = main_graph(data) if graph is None else graph
    ordinal = 0
    while pos < end:
        at = pos
        key = data[pos]  # GraphProto's fields are below 16: one-byte keys
        if key > 0x7F or key & 7 != 2:
            key, pos = varint(data, pos)
            pos = skip(data, pos, key & 7)
            continue
        # a length-delimited field (nodes, initializers, inputs...): its length read inline
        length = data[pos + 1]
        pos += 2
        if length > 0x7F:
            length, pos = varint(data, pos - 1)
        if key != INITIALIZER_KEY:
            pos += length
            continue
        start, stop = pos, pos + length
        dtype, name, raw, location, plain = 0, b"", None, 0, True
        while pos < stop:
            field_at = pos
            key = data[pos]  # every TensorProto field number below 16: a one-byte key
            pos += 1
            if key > 0x7F:
                key, pos = varint(data, field_at)
            wire_type = key & 7
            if wire_type == 2:
                n = data[pos]  # the length, read inline while it fits one byte (names, dims)
                pos += 1
                if n > 0x7F:
                    n, pos = varint(data, pos - 1)
                if key == _NAME:
                    name = bytes(data[pos : pos + n])
                elif key == RAW_KEY:
                    if raw is not None:
                        plain = False  # given twice: protobuf keeps the last one
                    raw = (field_at, pos, n)
                elif key >> 3 in _OTHER_DATA:
                    plain = False
                pos += n
            elif wire_type == 0:
                if key == _DATA_TYPE:
                    dtype, pos = varint(data, pos)
                elif key == _LOCATION:
                    location, pos = varint(data, pos)
                else:
                    if key >> 3 in _OTHER_DATA:
                        plain = False
                    pos = varint(data, pos)[1]
            else:
                if key >> 3 in _OTHER_DATA:
                    plain = False
                pos = skip(data, pos, wire_type)
        if pos != stop:
            raise Unwalked("a tensor overruns its length")
        external = location == EXTERNAL
        yield Initializer(ordinal, at, start, stop, dtype, name, raw, external, plain and not external)
        ordinal += 1
    if pos != end:
        raise Unwalked("the graph overruns its length")


def string_entry(field: int, key: str, value: str) -> bytes:
    """A StringStringEntryProto field (`field` of its parent) with `key` and `value`."""
    k, v = key.encode(), value.encode()
    body = b"\x0a" + encode_varint(len(k)) + k + b"\x12" + encode_varint(len(v)) + v
    return encode_varint(field << 3 | 2) + encode_varint(len(body)) + body


def may_leave_in_file(init: Initializer) -> bool:
    """Whether the loader leaves this initializer's payload in the file: a plain fp32 raw
    payload of LEFT_IN_FILE_MIN_BYTES or more, whole float32 values."""
    return (
        init.plain and init.dtype == FLOAT and init.raw is not None
        and init.raw[2] >= LEFT_IN_FILE_MIN_BYTES and not init.raw[2] % 4
    )  # fmt: skip


def leaving_payloads(data, graph: tuple[int, int, int], chosen: list, location: str) -> list:
    """The parts of the encoding of `data` (a serialized ModelProto whose main graph lies at
    `graph`) with each of the `chosen` initializers' raw payloads left where it is: the tensor
    without its raw_data, then external_data entries (field 13) naming the file `location` and
    the payload's own offset and length, then data_location = EXTERNAL (field 14, given last: it
    wins over an earlier one). Joined, the parts parse as that model. `chosen` is in graph order."""
    where = string_entry(13, "location", location)
    parts: list = []
    pos, size = graph[1], 0
    for init in chosen:
        raw_key, raw_start, length = init.raw
        offset, count = b"%d" % raw_start, b"%d" % length
        tail = b"%b\x6a%c\x0a\x06offset\x12%c%b\x6a%c\x0a\x06length\x12%c%b\x70\x01" % (
            where,
            10 + len(offset),
            len(offset),
            offset,
            10 + len(count),
            len(count),
            count,
        )
        header = b"\x2a" + encode_varint((raw_key - init.start) + (init.stop - raw_start - length) + len(tail))
        parts += (data[pos : init.key], header, data[init.start : raw_key], data[raw_start + length : init.stop], tail)
        size += (init.key - pos) + len(header) + (raw_key - init.start) + (init.stop - raw_start - length) + len(tail)
        pos = init.stop
    parts.append(data[pos : graph[2]])
    size += graph[2] - pos
    return [data[: graph[0]], bytes([GRAPH_KEY]), encode_varint(size), *parts, data[graph[2] :]]
