"""The protobuf encoding of an ONNX file, walked without parsing it: where the main graph and
its initializers lie in the file's bytes, and where each initializer keeps its payload. Two
stages use it on a mapped file: the loader (io.load_model, which leaves large fp32 payloads in
the file) and the weight screen's worker (plan/screen.py, which converts them from the file).

Field numbers (onnx.proto): ModelProto.graph 7; GraphProto.initializer 5; TensorProto dims 1,
data_type 2, segment 3, float_data 4, int32_data 5, string_data 6, int64_data 7, name 8,
raw_data 9, double_data 10, uint64_data 11, external_data 13, data_location 14.

The walk reads what protobuf's parser reads, not only what protobuf writes: a field key or a
length written as a longer varint than it needs (0xAA 0x00 for the key 0x2A), fields in any
order, a field given twice (the last one wins), unknown fields of wire types 0, 1, 2 and 5,
repeated scalars packed or not, a known field number with a wire type other than its own (an
unknown field to protobuf too), data_type read as an int32 (the low 32 bits of its varint) and
data_location as the closed enum it is (a value other than 0 or 1 leaves it as it was).
One-byte keys and lengths of one or two bytes, what protobuf writes, are read inline; any other
goes through the same checks. Anything else raises Unwalked and the caller parses the file the ordinary way: a
second graph field (which a parser merges), a group (wire types 3 and 4), wire types 6 and 7,
field number 0, a key above 2**32 - 1, a key or a length of more than 5 bytes or a length of
2**31 or more (which protobuf refuses), a varint of more than 10 bytes, a field that overruns
its message, a file that ends inside a field.

The walk is a fast path, not a source of truth: what the loader and the screen take from it is
checked against protobuf's parse (io._left_in_file, plan.screen.WeightScreen.results), and a
walk that disagrees with the parse is never used."""

from __future__ import annotations

from typing import NamedTuple

from ..varint import encode_varint as encode_varint  # re-exported: the walk writes keys and lengths

GRAPH_KEY = 7 << 3 | 2  # ModelProto.graph
INITIALIZER_KEY = 5 << 3 | 2  # GraphProto.initializer
INPUT_KEY = 11 << 3 | 2  # GraphProto.input
_DATA_TYPE = 2 << 3
_NAME = 8 << 3 | 2
RAW_KEY = 9 << 3 | 2  # TensorProto.raw_data
_LOCATION = 14 << 3
# keys of fields that hold a payload some other way than raw_data, or say where it is: any such
# field (length-delimited: segment, string_data, external_data) ...
_OTHER_DATA = frozenset({3 << 3 | 2, 6 << 3 | 2, 13 << 3 | 2})
# ... a packed repeated scalar with at least one element (float, int32, int64, double, uint64) ...
_PACKED = frozenset({4 << 3 | 2, 5 << 3 | 2, 7 << 3 | 2, 10 << 3 | 2, 11 << 3 | 2})
# ... or one element of them unpacked: each with its own wire type (float 5, double 1, others 0)
_UNPACKED = frozenset({4 << 3 | 5, 5 << 3, 7 << 3, 10 << 3 | 1, 11 << 3})
EXTERNAL = 1  # TensorProto.EXTERNAL
FLOAT = 1  # TensorProto.FLOAT
# fp32 payloads at least this large may be left in the model's file by the loader (io.load_model)
LEFT_IN_FILE_MIN_BYTES = 4096
_SHORT_BYTES = 5  # protobuf reads a field key or a length in at most 5 bytes
_VARINT_BYTES = 10  # and any other varint in at most 10 (bits past the 64th are dropped)


class Unwalked(Exception):
    """An encoding the walk does not follow."""


class Initializer(NamedTuple):
    """One initializer of the main graph as the file encodes it. `key` is where its field key
    starts, `start`/`stop` bound its TensorProto bytes, `dtype` is its data_type, `name` its
    name (the last one given), `raw` is (key position, payload start, payload length) of its
    raw_data (the last one given) or None; `external` says data_location is EXTERNAL; `plain`
    says that raw_data is its only payload (given once; no typed data, no segment, no external
    data) and that no data_location is given (not even DEFAULT, which a tensor whose payload is
    read back into it would lose: io.PayloadsInFile)."""

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
    """(value, position after it) of the varint at `pos`, at most 10 bytes, its value the low 64
    bits as protobuf reads it; a longer one raises Unwalked."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift, last = byte & 0x7F, 7, pos + _VARINT_BYTES - 1
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, pos + 1
        if pos == last:
            raise Unwalked("a varint of more than 10 bytes")
        shift += 7


def field_key(data, pos: int) -> tuple[int, int]:
    """(key, position after it) of the field key at `pos`, however many bytes (up to 5) it was
    written in; a key protobuf refuses (field number 0, above 2**32 - 1, longer) raises Unwalked."""
    key, after = varint(data, pos)
    if key < 8 or key >> 32 or after - pos > _SHORT_BYTES:
        raise Unwalked(f"a field key protobuf refuses at byte {pos}")
    return key, after


def length(data, pos: int) -> tuple[int, int]:
    """(length, position after it) of the length of a length-delimited field at `pos` (up to 5
    bytes, below 2**31, as protobuf reads it), else Unwalked."""
    n, after = varint(data, pos)
    if n >> 31 or after - pos > _SHORT_BYTES:
        raise Unwalked(f"a length protobuf refuses at byte {pos}")
    return n, after


def _int32(value: int) -> int:
    """An int32 field's value from its varint: the low 32 bits, signed."""
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value >> 31 else value


def skip(data, pos: int, wire: int) -> int:
    """The position after a field's value of wire type `wire` that starts at `pos`; a group
    (wire types 3 and 4) or an invalid wire type raises Unwalked."""
    if wire == 0:
        return varint(data, pos)[1]
    if wire == 2:
        n, pos = length(data, pos)
        return pos + n
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
    try:
        while pos < end:
            at = pos
            key, pos = field_key(data, pos)
            if key == GRAPH_KEY:
                n, pos = length(data, pos)
                if graph is not None:
                    raise Unwalked("two graph fields")
                graph = (at, pos, pos + n)
                pos += n
            else:
                pos = skip(data, pos, key & 7)
    except IndexError:
        raise Unwalked("the file ends inside a field") from None
    if graph is None or pos != end:
        raise Unwalked("no graph, or a field overruns the file")
    return graph


def initializers(data, graph: tuple[int, int, int] | None = None):
    """Each initializer of the main graph of the serialized ModelProto `data`, in the order
    protobuf parses them (ordinal = position in graph.initializer). Raises Unwalked (when the
    generator is advanced) at an encoding the walk does not follow."""
    _, pos, end = main_graph(data) if graph is None else graph
    if end > len(data):
        raise Unwalked("the graph overruns the file")
    ordinal = 0
    try:
        while pos < end:
            at = pos
            key = data[pos]
            if 8 <= key < 0x80:  # a one-byte key: what protobuf writes
                pos += 1
            else:
                key, pos = field_key(data, pos)
            if key & 7 != 2:
                pos = skip(data, pos, key & 7)
                continue
            # a length-delimited field (nodes, initializers, inputs...): a length of one or two
            # bytes read inline
            n = data[pos]
            if n < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                n = n & 0x7F | data[pos + 1] << 7
                pos += 2
            else:
                n, pos = length(data, pos)
            stop = pos + n
            if stop > end:
                raise Unwalked("a field overruns the graph")
            if key == INITIALIZER_KEY:
                yield _tensor(data, ordinal, at, pos, stop)
                ordinal += 1
            pos = stop
    except IndexError:
        raise Unwalked("the file ends inside a field") from None
    if pos != end:
        raise Unwalked("the graph overruns its length")


def _tensor(data, ordinal: int, at: int, start: int, stop: int) -> Initializer:
    """The initializer whose TensorProto bytes are data[start:stop] (its field key at `at`)."""
    dtype, name, raw, location, raws, other, located = 0, b"", None, 0, 0, False, False
    pos = start
    while pos < stop:
        field_at = pos
        key = data[pos]  # every TensorProto field number is below 16: one-byte keys, unless written longer
        if 8 <= key < 0x80:
            pos += 1
        else:
            key, pos = field_key(data, pos)
        if key & 7 == 2:
            n = data[pos]  # the length, read inline while it fits one or two bytes
            if n < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                n = n & 0x7F | data[pos + 1] << 7
                pos += 2
            else:
                n, pos = length(data, pos)
            if key == RAW_KEY:
                raw = (field_at, pos, n)
                raws += 1
            elif key == _NAME:
                name = bytes(data[pos : pos + n])
            elif key in _OTHER_DATA or (n and key in _PACKED):
                other = True
            pos += n
        elif key & 7 == 0:
            value = data[pos]
            if value < 0x80:
                pos += 1
            else:
                value, pos = varint(data, pos)
            if key == _DATA_TYPE:
                dtype = _int32(value)
            elif key == _LOCATION:
                value = _int32(value)
                if value == 0 or value == EXTERNAL:  # a closed enum: any other value is an unknown field
                    location, located = value, True
            elif key in _UNPACKED:
                other = True
        else:
            if key in _UNPACKED:
                other = True
            pos = skip(data, pos, key & 7)
    if pos != stop:
        raise Unwalked("a tensor overruns its length")
    plain = raws == 1 and not other and not located
    return Initializer(ordinal, at, start, stop, dtype, name, raw, location == EXTERNAL, plain)


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
