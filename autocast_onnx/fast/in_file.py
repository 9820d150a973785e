"""Loading a model with the main graph's large fp32 payloads left in its file: each such
initializer is parsed as external data that points at its own payload in this file (which is
what it is), so the parse copies none of them, and a payload the rewrite replaces with fp16 never
sits in memory at all. `PayloadsInFile.inline()` reads back the ones still there before the model
is written.

Part of the fast path (fast/__init__.py): io.load_model takes `parser(prepared)` as its `parse`.
Where the file's encoding is one the walk does not follow (wire.py), or the walk and protobuf's
parse disagree on any tensor (_left_in_file), nothing is left in the file: the loader parses it
whole, as without the fast path."""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..errors import AutocastError
from ..filesys import stat_identity
from ..io import LeavingParse, restore_tensor
from . import wire

LEFT_IN_FILE_MIN_BYTES = wire.LEFT_IN_FILE_MIN_BYTES  # fp32 payloads this large may be left in the file


def parser(prepared=None) -> LeavingParse:
    """io.load_model's `parse`: leave the payloads in the file. `prepared()` (the weight screen's
    WeightScreen.encoding, the worker's walk of this file) gives that encoding, its payloads'
    places and the file's identity as the worker found it; from a None, or a file that is not the
    one the worker walked, this process walks the file itself."""
    return functools.partial(_parse_leaving_payloads, prepared=prepared)


def _parse_leaving_payloads(
    view: memoryview, path: Path, model: onnx.ModelProto, st, prepared=None
) -> PayloadsInFile | None:
    """Parse `view` (the mapped file at `path`) into `model` with the main graph's large plain
    fp32 payloads left in the file, as external data at their own offsets (possibly none: each
    payload that does not fit its tensor's dims is put back); None, with nothing parsed, when the
    file has no such payload, an encoding the walk does not follow, or a walk the parse does not
    bear out (_left_in_file): the caller then parses the file whole. `prepared()` gives the
    encoding and the payloads' places from the worker's walk of the same file (worker.py)."""
    # read first, whatever follows: the worker waits for it to be read before it goes on
    ready = prepared() if prepared is not None else None
    base = path.parent.resolve()
    if not (base / path.name).resolve().is_relative_to(base):
        return None  # a link to a file elsewhere: its data would be refused as outside the folder
    if ready is not None and ready[2] == stat_identity(st):
        encoding, rows, _ = ready
        del ready
        try:
            model.ParseFromString(encoding)
        except (DecodeError, RuntimeError, ValueError):
            model.Clear()  # not an encoding of this file after all
            return None
        return _left_in_file(view, path, model, st, rows)
    try:
        graph = wire.main_graph(view)
        chosen = [init for init in wire.initializers(view, graph) if wire.may_leave_in_file(init)]
    except (wire.Unwalked, IndexError):
        return None
    if not chosen:
        return None
    parts = wire.leaving_payloads(view, graph, chosen, path.name)
    try:
        model.ParseFromString(b"".join(parts))
    except (DecodeError, RuntimeError, ValueError):
        model.Clear()  # the file itself may parse: the caller says what is wrong with it
        return None
    del parts
    rows = [(init.ordinal, init.raw[1], init.raw[2], init.name) for init in chosen]
    return _left_in_file(view, path, model, st, rows)


def _left_in_file(view: memoryview, path: Path, model: onnx.ModelProto, st, rows) -> PayloadsInFile | None:
    """The payloads left in the file at `path` (mapped as `view`): `rows` gives the ordinal of
    each such initializer of the main graph, its payload's offset and length, and its name, as
    the walk found them. A payload that does not fit its tensor's dims (or dims with a negative
    one) is put back into the tensor, as it was, for the input checks to judge. Each row is
    checked against the parse first (_walked_as, and the payload inside the file): where the
    tensor at that ordinal is not the one the walk wrote that payload's place into, `model` is
    cleared and None returned, and the caller parses the file whole. A walk that numbered the
    initializers otherwise than protobuf would otherwise read each tensor's weight from another
    tensor's bytes, silently. What stays left in the file is thereby checked as the input checks
    would check it (graph/sanity.py takes PayloadsInFile.ordinals as checked)."""
    inits = model.graph.initializer
    count = len(inits)
    location = path.name
    size = len(view)
    left = []
    for ordinal, raw_start, length, name in rows:
        tensor = inits[ordinal] if 0 <= ordinal < count else None
        dims = _walked_as(tensor, name, location, raw_start, length) if tensor is not None else None
        if tensor is None or dims is None or raw_start < 0 or raw_start + length > size:
            model.Clear()
            return None
        if 4 * math.prod(dims) != length or (dims and min(dims) < 0):  # not a payload of its dims: stays as it was
            restore_tensor(tensor, bytes(view[raw_start : raw_start + length]))
            continue
        left.append((ordinal, tensor, raw_start, length))
    return PayloadsInFile(path, left, stat_identity(st))


def _walked_as(tensor: onnx.TensorProto, name: bytes, location: str, offset: int, length: int) -> list | None:
    """The dims of `tensor` if it is, as protobuf parsed the walk's encoding, the initializer the
    walk left in the file at `offset`, `length` (wire.leaving_payloads): named `name`, fp32, no
    payload of its own (no raw_data, typed data or segment), and exactly the external data the
    walk wrote into it (this file, that offset and length), which no other tensor has; None
    where it is not.

    Compared as protobuf writes the tensor (one call) with the bytes of such a tensor: its dims,
    data_type, name, the walk's three entries and data_location, nothing else. A tensor with more
    (a doc_string, metadata, unknown fields) is judged field by field (_walked_fields)."""
    written = tensor.SerializeToString()
    tail = _walked_tail(name, location, offset, length)
    if written.endswith(tail) and _DIMS_ONLY.fullmatch(written, 0, len(written) - len(tail)):
        return tensor.dims[:] if len(written) > len(tail) else []
    return _walked_fields(tensor, name, location, offset, length)


# dims as protobuf writes them: field 1, one varint each (the key, then 0-9 bytes of 0x80 and up,
# then one below: the split into fields is unique, so nothing backtracks)
_DIMS_ONLY = re.compile(rb"(?:\x08[\x80-\xff]{0,9}[\x00-\x7f])*")


def _walked_tail(name: bytes, location: str, offset: int, length: int) -> bytes:
    """What protobuf writes after the dims of an fp32 tensor named `name` whose payload is in
    `location` at `offset`, `length`, and that holds nothing else: data_type, name, the three
    external_data entries (field 13: key 1, value 2) and data_location, in field order."""
    named = b"\x42%b%b" % (wire.encode_varint(len(name)), name) if name else b""
    at, size = b"%d" % offset, b"%d" % length  # each entry is under 128 bytes: its lengths are one byte
    return b"\x10\x01%b%b\x6a%c\x0a\x06offset\x12%c%b\x6a%c\x0a\x06length\x12%c%b\x70\x01" % (
        named,
        _location_entry(location),
        len(at) + 10,
        len(at),
        at,
        len(size) + 10,
        len(size),
        size,
    )


@functools.lru_cache(maxsize=8)
def _location_entry(location: str) -> bytes:
    """The external_data entry ("location", `location`) as protobuf writes it."""
    key, value = b"location", location.encode("utf-8")
    body = b"\x0a" + wire.encode_varint(len(key)) + key + b"\x12" + wire.encode_varint(len(value)) + value
    return b"\x6a" + wire.encode_varint(len(body)) + body


_EXTERNAL_KEYS = ("location", "offset", "length")  # as wire.leaving_payloads writes them
# TensorProto fields that hold no payload nor say where one is: dims (1), name (8), doc_string (12),
# metadata_props (16)
_NOT_DATA = frozenset({1, 8, 12, 16})


def _walked_fields(tensor: onnx.TensorProto, name: bytes, location: str, offset: int, length: int) -> list | None:
    """_walked_as for a tensor that holds more than the walk left in it, field by field. Reads
    the fields present (ListFields), never one that may be absent: a repeated field read from a
    parsed message that lacks it is given to it, empty, which slows every later pass over the
    model (see graph/sanity.py, _plainly_sound)."""
    dims: list = []
    tensor_name = dtype = place = entries = None
    for descriptor, value in tensor.ListFields():
        number = descriptor.number
        if number == 13:
            entries = value
        elif number == 14:
            place = value
        elif number == 2:
            dtype = value
        elif number == 8:
            tensor_name = value
        elif number == 1:
            dims = value[:]
        elif number not in _NOT_DATA:
            return None  # raw_data, typed data, segment
    if place != onnx.TensorProto.EXTERNAL or dtype != onnx.TensorProto.FLOAT or entries is None or len(entries) != 3:
        return None
    first, second, third = entries
    if (
        first.value != location
        or second.value != str(offset)
        or third.value != str(length)
        or (first.key, second.key, third.key) != _EXTERNAL_KEYS
    ):
        return None
    try:
        return dims if (tensor_name or "") == name.decode("utf-8") else None
    except UnicodeDecodeError:
        return None


class PayloadsInFile:
    """The fp32 payloads load_model left in the model's file (leave_in_file=True), and how to
    read back those the conversion kept before the model is written."""

    def __init__(self, path: Path, tensors: list, identity: tuple):
        self.path = path
        self._tensors = tensors  # (ordinal, TensorProto, offset, length)
        self.ordinals = frozenset(t[0] for t in tensors)
        self._identity = identity

    def __len__(self) -> int:
        return len(self._tensors)

    def places(self, identity: tuple) -> set[tuple[int, int, int]]:
        """(ordinal, offset, length) of each payload still left in the file (its tensor still
        external), each checked against protobuf's parse when it was loaded (_left_in_file);
        none unless the file is the one whose identity (filesys.stat_identity) is `identity`."""
        if identity != self._identity:
            return set()
        external = onnx.TensorProto.EXTERNAL
        return {(o, offset, length) for o, tensor, offset, length in self._tensors if tensor.data_location == external}

    def sizes(self) -> dict[int, int]:
        """id(TensorProto) -> payload bytes of each tensor still left in the file."""
        return {id(t): length for _, t, _, length in self._tensors}

    def inline(self) -> int:
        """Read the payloads still left in the file into their tensors (raw_data, no longer
        external), from the file as it was loaded; returns how many. Refuses a file that was
        replaced or rewritten since it was loaded: what was read from it may not be the model."""
        where = str(self.path)
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            raise AutocastError(
                f"the input model can no longer be read: {exc.strerror}", where, "convert it again"
            ) from None
        with fh:
            st = os.fstat(fh.fileno())
            if stat_identity(st) != self._identity:
                raise AutocastError(
                    "the input model changed while it was being converted",
                    where,
                    "convert it again once nothing else writes to it",
                )
            count = 0
            for _, tensor, offset, length in self._tensors:
                if tensor.data_location != onnx.TensorProto.EXTERNAL:
                    continue  # the conversion replaced it
                fh.seek(offset)
                payload = fh.read(length)
                if len(payload) != length:
                    raise AutocastError("the input model was truncated while it was being converted", where,
                                        "convert it again once nothing else writes to it")  # fmt: skip
                restore_tensor(tensor, payload)
                count += 1
        self._tensors = []
        return count
