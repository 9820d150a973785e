"""Re-encode a serialized protobuf message (an ONNX ModelProto) into another encoding that
protobuf parses as the same message: what tests/fast/test_wire_walk.py feeds the walk of wire.py.

The message types come from the descriptors of the generated classes (onnx.ModelProto.DESCRIPTOR
and the types it refers to), so every nested message is re-encoded too: the graph, its nodes and
their attributes, initializers, value infos, subgraphs. The variations, each drawn per field with
`Variations`' probabilities:

- a field key, a length or a varint written longer than it needs (0x80 continuation bytes);
  keys and lengths at most 5 bytes and varints at most 10, as protobuf reads them (longer only
  with `invalid`, which protobuf refuses);
- fields in another order; the occurrences of one field number keep their relative order (a
  repeated field's elements, and the last value of a singular field, stay what they were);
- a singular scalar, string or bytes field given first with another value (the last one wins);
  an int32 or enum written with bits above the 32nd (protobuf keeps the low 32); an enum given
  a value outside the enum after its own (protobuf keeps it as an unknown field);
- unknown fields of wire types 0, 1, 2 and 5: new field numbers, and known numbers with a wire
  type other than their own (unknown to protobuf too);
- repeated numeric fields packed or not, in runs of any length, and empty packed fields;
- with `invalid`: a group (wire types 3 and 4, which protobuf skips as an unknown field).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_WIRE = {
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FLOAT: 5,
    FieldDescriptor.TYPE_INT64: 0,
    FieldDescriptor.TYPE_UINT64: 0,
    FieldDescriptor.TYPE_INT32: 0,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_FIXED32: 5,
    FieldDescriptor.TYPE_BOOL: 0,
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_UINT32: 0,
    FieldDescriptor.TYPE_ENUM: 0,
    FieldDescriptor.TYPE_SFIXED32: 5,
    FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_SINT32: 0,
    FieldDescriptor.TYPE_SINT64: 0,
}
_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_ENUM}


@dataclass
class Variations:
    """How often each variation is applied (probabilities per field, or per message for
    inserted unknown fields)."""

    long_varint: float = 0.3  # a key, a length or a varint written longer
    shuffle: float = 0.5  # a message's fields in another order
    decoy: float = 0.2  # a singular field given first with another value
    unknown: float = 0.3  # unknown fields inserted into a message
    wrong_wire: float = 0.2  # a known field number with a wire type other than its own
    split_packed: float = 0.5  # a repeated numeric field packed, in runs
    invalid: float = 0.0  # keys, lengths, varints longer than protobuf reads; groups


def varint(value: int, size: int = 0) -> bytes:
    """`value` (64-bit two's complement for a negative one) as a varint of at least `size` bytes."""
    value &= (1 << 64) - 1
    groups = []
    while True:
        groups.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    groups += [0] * (size - len(groups))
    return bytes(g | 0x80 for g in groups[:-1]) + bytes(groups[-1:])


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of each field of the message `data` (as protobuf
    writes it: no groups): an int for wire type 0, else the value's bytes."""
    out = []
    pos = 0
    while pos < len(data):
        key, pos = decode_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = decode_varint(data, pos)
        elif wire == 2:
            n, pos = decode_varint(data, pos)
            value, pos = data[pos : pos + n], pos + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, pos = data[pos : pos + n], pos + n
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


class Reencoder:
    def __init__(self, rnd: random.Random, variations: Variations):
        self.rnd = rnd
        self.v = variations

    def chance(self, p: float) -> bool:
        return p > 0 and self.rnd.random() < p

    def size(self, value: int, limit: int) -> int:
        """How many bytes to write a varint of `value` in."""
        least = len(varint(value))
        if self.chance(self.v.invalid):
            return self.rnd.randint(limit + 1, limit + 2)
        if least >= limit or not self.chance(self.v.long_varint):
            return least
        return self.rnd.randint(least + 1, limit)

    def key(self, number: int, wire: int) -> bytes:
        value = number << 3 | wire
        return varint(value, self.size(value, 5))

    def delimited(self, number: int, payload: bytes) -> bytes:
        return self.key(number, 2) + varint(len(payload), self.size(len(payload), 5)) + payload

    def value(self, wire: int, value) -> bytes:
        if wire == 0:
            return varint(value, self.size(value & ((1 << 64) - 1), 10))
        return value

    def message(self, descriptor: Descriptor, data: bytes) -> bytes:
        """`data` (a message of type `descriptor`) re-encoded."""
        by_number = {f.number: f for f in descriptor.fields}
        items: list[tuple[object, bytes]] = []  # (order key, encoded field): one order key per field number
        runs: dict[int, list] = {}
        for number, wire, value in fields(data):
            field = by_number.get(number)
            if field is not None and field.is_repeated and field.type in _WIRE and _WIRE[field.type] != 2:
                runs.setdefault(number, []).extend(self.elements(field, wire, value))
                continue
            if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE and wire == 2:
                items.append((number, self.delimited(number, self.message(field.message_type, value))))
                continue
            if field is not None and not field.is_repeated and field.containing_oneof is None:
                decoy = self.decoy(field, wire, value) if self.chance(self.v.decoy) else None
                if decoy is not None:
                    items.append((number, decoy))
            items.append((number, self.encoded(field, number, wire, value)))
            if field is not None and field.type == FieldDescriptor.TYPE_ENUM and self.chance(self.v.decoy):
                items.append((number, self.key(number, 0) + varint(1000 + self.rnd.randrange(100))))
        for number, elements in runs.items():
            items += [(number, part) for part in self.packed(by_number[number], elements)]
        items += self.unknown(descriptor)
        return b"".join(part for _, part in self.order(items))

    def encoded(self, field, number: int, wire: int, value) -> bytes:
        if wire == 2:
            return self.delimited(number, value)
        if wire == 0 and field is not None and field.type in _INT32 and self.chance(self.v.long_varint):
            high = self.rnd.randrange(1, 1 << 31) << 32  # above the 32 bits protobuf keeps
            return self.key(number, 0) + varint((value & 0xFFFF_FFFF) | high, 10)
        return self.key(number, wire) + self.value(wire, value)

    def decoy(self, field, wire: int, value) -> bytes | None:
        """The field given once before with another value of its own type."""
        if wire == 2:
            other = bytes(self.rnd.choice(b"abcxyz_") for _ in range(self.rnd.randrange(0, 9)))
            return None if other == value else self.delimited(field.number, other)
        if wire == 0:
            if field.type == FieldDescriptor.TYPE_ENUM:
                choices = [v.number for v in field.enum_type.values if v.number != value]
                return self.key(field.number, 0) + varint(self.rnd.choice(choices)) if choices else None
            return self.key(field.number, 0) + self.value(0, (value + self.rnd.randint(1, 9)) & ((1 << 64) - 1))
        return self.key(field.number, wire) + bytes(self.rnd.randrange(256) for _ in range(len(value)))

    def elements(self, field, wire: int, value) -> list:
        """The elements of one occurrence of a repeated numeric field, packed or not."""
        own = _WIRE[field.type]
        if wire == own:
            return [value]
        assert wire == 2, (field.name, wire)
        if own == 0:
            out, pos = [], 0
            while pos < len(value):
                element, pos = decode_varint(value, pos)
                out.append(element)
            return out
        step = 8 if own == 1 else 4
        return [value[k : k + step] for k in range(0, len(value), step)]

    def packed(self, field, elements: list) -> list[bytes]:
        """A repeated numeric field's elements, in order, as runs each packed or not (and maybe
        an empty packed field)."""
        own = _WIRE[field.type]
        out: list[bytes] = []
        if self.chance(self.v.split_packed / 4):
            out.append(self.delimited(field.number, b""))  # an empty packed field: no element
        pos = 0
        while pos < len(elements):
            n = self.rnd.randint(1, len(elements) - pos) if self.chance(self.v.split_packed) else len(elements) - pos
            run = elements[pos : pos + n]
            pos += n
            if self.chance(self.v.split_packed):
                out.append(self.delimited(field.number, b"".join(self.value(own, e) for e in run)))
            else:
                out += [self.key(field.number, own) + self.value(own, e) for e in run]
        return out

    def unknown(self, descriptor: Descriptor) -> list[tuple[object, bytes]]:
        """Fields protobuf keeps as unknown: new numbers, and known ones with a wire type not
        their own."""
        out: list[tuple[object, bytes]] = []
        while self.chance(self.v.unknown):
            known = self.chance(self.v.wrong_wire)
            if known:
                field = self.rnd.choice(descriptor.fields)
                own = _WIRE.get(field.type, 2)
                wrong = [w for w in (0, 1, 2, 5) if w != own and not (w == 2 and field.is_repeated and own != 2)]
                number, wire = field.number, self.rnd.choice(wrong)
            else:
                number = self.rnd.choice([w for w in range(17, 40) if w not in {f.number for f in descriptor.fields}])
                wire = self.rnd.choice((0, 1, 2, 5))
            out.append(((number, wire, len(out)), self.unknown_value(number, wire)))
        if self.chance(self.v.invalid):
            inner = self.key(999, 0) + varint(7)
            out.append(("group", self.key(998, 3) + inner + self.key(998, 4)))
        return out

    def unknown_value(self, number: int, wire: int) -> bytes:
        if wire == 0:
            return self.key(number, 0) + self.value(0, self.rnd.randrange(1 << 64))
        if wire == 2:
            return self.delimited(number, bytes(self.rnd.randrange(256) for _ in range(self.rnd.randrange(0, 12))))
        return self.key(number, wire) + bytes(self.rnd.randrange(256) for _ in range(8 if wire == 1 else 4))

    def order(self, items: list[tuple[object, bytes]]) -> list[tuple[object, bytes]]:
        """`items` interleaved at random, each order key's items in their order."""
        if not self.chance(self.v.shuffle):
            return items
        queues: dict[object, list] = {}
        for item in items:
            queues.setdefault(item[0], []).append(item)
        for queue in queues.values():
            queue.reverse()
        out = []
        pending = list(queues)
        while pending:
            k = self.rnd.choice(pending)
            out.append(queues[k].pop())
            if not queues[k]:
                pending.remove(k)
        return out


def reencode(data: bytes, descriptor: Descriptor, rnd: random.Random, variations: Variations) -> bytes:
    """`data`, a serialized message of type `descriptor`, in another encoding protobuf parses as
    the same message (with unknown fields added), unless `variations.invalid`."""
    return Reencoder(rnd, variations).message(descriptor, data)
