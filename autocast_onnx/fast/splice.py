"""Converted payloads held beside the model until it is written in one piece, then spliced into
its encoding.

The rewrite converts initializers into buffers that already exist: the weight screen's shared
memory (plan/screen.py) or a chunk of tensors converted together. Giving each payload to its
TensorProto copies every converted byte into the protobuf (0.13 s for the 70 MB of fp16 weights
of a 100k-node chain, most of it the page faults of fresh memory), and serializing the model
copies them all once more. A save in one piece instead serializes the model without them and
splices each payload into that encoding while joining the file's bytes:

    in memory:   Tensor{dims, data_type=FLOAT16, name}                 + held fp16 bytes
    written:     Tensor{dims, data_type=FLOAT16, name, raw_data=...}     (the same bytes
                 model.SerializeToString() gives once the payloads are in their tensors)

How the splice finds the tensors: for the serialization only, each held tensor of the main
graph gets a raw_data marker (a nonce drawn for this save and the tensor's rank), so its
raw_data field sits exactly where protobuf puts one. A byte search finds the first marker; the
first tensor's own encoding says where its field starts; from there the walk steps from
initializer to initializer (one contiguous run of the graph's field 5), checking that each
expected marker lies inside its tensor. Only the lengths that enclose a payload change: its
tensor's, the raw_data field's, and the graph's. Anything that does not fit (a tensor held in
a subgraph, an encoding the walk does not expect) is given its payload the ordinary way: the
output is the same either way, only slower.

The stand-in for the check: onnx.checker parses every payload it is given again (a copy of the
file's weights in fresh memory) only to compare each one's size with its dims. The same walk
therefore also writes the encoding with each held initializer replaced by a graph input of the
same name, element type and shape; the sizes are compared here, where the payloads already are.
Every node, attribute and type the file holds is in the stand-in; what differs is that the
held tensors are inputs rather than initializers. The checker's verdict does not depend on
that: the values shape inference reads (shapes, axes, sizes, pads) are integer tensors, never
converted and so never held, and a float weight of 1k+ elements is only ever typed and shaped.
A failure found on the stand-in is confirmed on the whole file before it is reported
(check_with_stand_in).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import onnx

from ..dtypes import ITEMSIZE
from ..errors import InternalCheckError
from ..filesys import write_all
from ..io import PiecesLike
from . import wire

log = logging.getLogger(__name__)

HOLD_MIN_BYTES = 2048  # smaller payloads are copied into their tensors: splicing them costs more
_NONCE_BYTES = 16
_MARK_BYTES = _NONCE_BYTES + 8  # nonce + the tensor's rank among the held ones
_MARK_FIELD = bytes([wire.RAW_KEY, _MARK_BYTES])  # raw_data key and the marker's one-byte length
_INITIALIZER = bytes([wire.INITIALIZER_KEY])
_RAW = bytes([wire.RAW_KEY])
_INPUT = bytes([wire.INPUT_KEY])


class HeldPayloads:
    """Converted payloads of whole initializers, held outside their tensors (which have no
    raw_data meanwhile) until `serialize` splices them into the model's encoding or `inline`
    gives them to the tensors."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[onnx.TensorProto, memoryview]] = {}  # id(tensor) -> (tensor, bytes)

    def __len__(self) -> int:
        return len(self._held)

    def put(self, tensor: onnx.TensorProto, payload) -> bool:
        """Hold `payload` (bytes-like) as the raw_data of `tensor`, whose own raw_data is
        cleared; the tensor's other fields are the caller's to set. False (nothing held) for a
        payload under HOLD_MIN_BYTES."""
        view = memoryview(payload)
        if view.nbytes < HOLD_MIN_BYTES:
            return False
        tensor.ClearField("raw_data")
        self._held[id(tensor)] = (tensor, view if view.format == "B" and view.ndim == 1 else view.cast("B"))
        return True

    def put_new(self, tensor: onnx.TensorProto, payload) -> bool:
        """Nothing held for a tensor the rewrite adds to the model later (False): protobuf copies
        it into the graph then, so the tensor held here would not be the model's."""
        return False

    def inline(self) -> int:
        """Give every held payload to its tensor; returns how many. The model is whole again."""
        held, self._held = self._held, {}
        for tensor, payload in held.values():
            tensor.raw_data = payload.tobytes()
        return len(held)

    def serialize(self, model: onnx.ModelProto) -> bytes:
        """The encoding of `model` with every held payload in its tensor: byte for byte what
        `inline()` then `model.SerializeToString()` gives, without copying the payloads into
        the tensors. The payloads stay held (and the tensors without them)."""
        return bytes(self._serialize(model, False)[0])

    def serialize_with_stand_in(self, model: onnx.ModelProto) -> tuple[bytes | Pieces, bytes | None]:
        """The encoding `serialize(model)` joins, as the pieces it is made of (io.Pieces: the save
        writes them without joining them) where the splice made it, and the stand-in the check
        reads instead (module docstring): the same encoding with each held initializer of the
        main graph made a graph input of its type and shape. None instead where it cannot stand
        in: nothing held in the main graph, a held tensor named like a graph input, a payload
        whose size does not fit its dims, an IR version before 4 (initializers had to be
        inputs), or an encoding the walk does not expect."""
        return self._serialize(model, True)

    def _serialize(self, model: onnx.ModelProto, stand_in: bool) -> tuple[bytes | Pieces, bytes | None]:
        if not self._held:
            return model.SerializeToString(), None
        order = []  # (ordinal, tensor, payload) of the main graph's held tensors, in graph order
        held = self._held
        for ordinal, tensor in enumerate(model.graph.initializer):
            entry = held.get(id(tensor))
            if entry is not None:
                order.append((ordinal, entry[0], entry[1]))
        if len(order) != len(held):  # held in a subgraph (or no longer in the model): given now
            placed = {id(t) for _, t, _ in order}
            for key in [k for k in held if k not in placed]:
                tensor, payload = held.pop(key)
                tensor.raw_data = payload.tobytes()
            if not order:
                return model.SerializeToString(), None
        inputs = _stand_in_inputs(model, order) if stand_in else None
        nonce = os.urandom(_NONCE_BYTES)
        for rank, (_, tensor, _) in enumerate(order):
            tensor.raw_data = nonce + rank.to_bytes(8, "little")
        try:
            first = order[0][1].SerializeToString()
            lean = model.SerializeToString()
        finally:
            for _, tensor, _ in order:
                tensor.ClearField("raw_data")
        try:
            return _splice(lean, first, nonce, order, inputs)
        except (wire.Unwalked, IndexError, ValueError) as exc:
            log.debug("splice: %s; serializing with the payloads in their tensors", exc)
        self.inline()
        return model.SerializeToString(), None


def check_with_stand_in(check: Callable[[bytes], None], whole: bytes | PiecesLike, stand_in: bytes | None) -> None:
    """Run the checker `check` on the stand-in when there is one (serialize_with_stand_in: the
    same bytes with the held weights as graph inputs, whose sizes were compared with their dims
    already), else on the `whole` bytes (joined first when they come as Pieces). A failure on
    the stand-in (InternalCheckError) is checked again on the whole bytes, whose verdict and
    message are the ones that count (module docstring: why the stand-in's verdict is the whole's)."""
    if stand_in is not None:
        try:
            check(stand_in)
            return
        except InternalCheckError:
            pass
    check(whole if isinstance(whole, bytes) else bytes(whole))


def _stand_in_inputs(model: onnx.ModelProto, order: list) -> list[bytes] | None:
    """For each held tensor of `order`, the graph's input field (a ValueInfoProto of its name,
    element type and dims) that stands in for it in the check; None where inputs cannot stand in
    (see HeldPayloads.serialize_with_stand_in)."""
    if model.ir_version < 4:
        return None
    taken = {vi.name for vi in model.graph.input}
    types: dict = {}  # (element type, dims) -> (TypeProto field, payload bytes)
    encode = wire.encode_varint
    out = []
    for _, tensor, payload in order:
        name = tensor.name
        if name in taken:
            return None
        key = (tensor.data_type, tuple(tensor.dims))
        known = types.get(key)
        if known is None:
            known = types[key] = _type_field(*key)
        if known[1] != len(payload):
            return None
        text = name.encode("utf-8")
        info = b"\x0a" + encode(len(text)) + text + known[0]
        out.append(_INPUT + encode(len(info)) + info)
    return out


def _type_field(elem_type: int, dims: tuple) -> tuple[bytes, int]:
    """ValueInfoProto's type field for a tensor of `elem_type` and `dims`, and the bytes a raw
    payload of that type and shape has. TypeProto: tensor_type=1; its Tensor: elem_type=1,
    shape=2; TensorShapeProto: dim=1; Dimension: dim_value=1."""
    encode = wire.encode_varint
    shape = b""
    for d in dims:
        dim = b"\x08" + encode(d)
        shape += b"\x0a" + encode(len(dim)) + dim
    tensor = b"\x08" + encode(elem_type) + b"\x12" + encode(len(shape)) + shape
    typed = b"\x0a" + encode(len(tensor)) + tensor
    size = math.prod(dims) * ITEMSIZE.get(elem_type, 0)  # 0: a type never held, never fits
    return b"\x12" + encode(len(typed)) + typed, size


def _splice(lean: bytes, first: bytes, nonce: bytes, order: list, inputs: list | None = None) -> tuple:
    """`lean` (the model's encoding with markers in place of the held payloads) with each marker
    field replaced by its payload and the lengths that enclose them mended, as io.Pieces. `first`
    is the encoding of the first held tensor, with its marker. With `inputs` (an input field per
    held tensor), also the stand-in: `lean` with each held initializer field replaced by its
    input field (else None). Raises wire.Unwalked where the encoding is not what `serialize`
    made."""
    data = memoryview(lean)
    graph_key, graph_start, graph_end = wire.main_graph(data)
    mark0 = nonce + bytes(8)
    found = lean.find(mark0, graph_start, graph_end)
    inside = first.find(mark0)
    if found < 0 or inside < 0:
        raise wire.Unwalked("the first marker is missing")
    body = found - inside  # where the first held tensor's encoding starts in the graph
    header = _INITIALIZER + wire.encode_varint(len(first))
    pos = body - len(header)
    if pos < graph_start or lean[pos:body] != header or lean[body : body + len(first)] != first:
        raise wire.Unwalked("the first held tensor is not where its marker says")
    pieces: list = [data[:graph_key], None]  # [1]: the graph's key and length, once known
    copied = graph_start  # the lean bytes from here on are not yet among the pieces
    grown = 0  # bytes the graph's body gains
    ordinal = order[0][0]
    rank, want, payload = 0, ordinal, order[0][2]
    varint, encode, key = wire.varint, wire.encode_varint, wire.INITIALIZER_KEY
    stand: list = [data[:graph_key], None]  # the stand-in's pieces, as `pieces`
    stand_copied, stand_grown = graph_start, 0
    while True:
        if data[pos] != key:
            raise wire.Unwalked("the initializers are not one run of fields")
        length, start = varint(data, pos + 1)
        stop = start + length
        if ordinal == want:
            at = lean.find(nonce + rank.to_bytes(8, "little"), start, stop)
            if at < 0 or not lean.startswith(_MARK_FIELD, at - 2):
                raise wire.Unwalked(f"no marker in initializer #{ordinal}")
            raw_field = _RAW + encode(len(payload))
            new_length = length - len(_MARK_FIELD) - _MARK_BYTES + len(raw_field) + len(payload)
            new_header = _INITIALIZER + encode(new_length)
            pieces += (data[copied:pos], new_header, data[start : at - 2], raw_field, payload)
            copied = at + _MARK_BYTES
            grown += (len(new_header) - (start - pos)) + (new_length - length)
            if inputs is not None:
                stand += (data[stand_copied:pos], inputs[rank])
                stand_copied = stop
                stand_grown += len(inputs[rank]) - (stop - pos)
            rank += 1
            if rank == len(order):
                break
            want, _, payload = order[rank]
        ordinal += 1
        pos = stop
        if pos >= graph_end:
            raise wire.Unwalked("the graph ends before every held tensor was found")
    pieces.append(data[copied:])
    pieces[1] = bytes([wire.GRAPH_KEY]) + encode(graph_end - graph_start + grown)
    if inputs is None:
        return Pieces(pieces), None
    stand.append(data[stand_copied:])
    stand[1] = bytes([wire.GRAPH_KEY]) + encode(graph_end - graph_start + stand_grown)
    return Pieces(pieces), b"".join(stand)


class Pieces:
    """A model's encoding as the buffers it is made of, in order (splice.py hands the save one):
    written with a writev per IOV_MAX buffers, so the file's bytes are never joined in memory
    (for 100 MB of weights, 100 MB of fresh pages and a copy saved). `bytes(pieces)` joins them
    where whole bytes are needed after all."""

    def __init__(self, parts: list):
        self._parts = parts
        self._size = sum(len(p) for p in parts)  # bytes or one-dimensional byte views

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self._parts)

    def write_to(self, fd: int) -> None:
        parts, batch = self._parts, _IOV_MAX
        if not batch:  # no writev on this platform
            for part in parts:
                write_all(fd, part)
            return
        for start in range(0, len(parts), batch):
            group = parts[start : start + batch]
            written = os.writev(fd, group)
            if written < sum(len(p) for p in group):  # a short write: the rest one buffer at a time
                for part in group:
                    view = memoryview(part)
                    skip = min(written, len(view))
                    written -= skip
                    write_all(fd, view[skip:])


_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "writev") else 0  # buffers per writev
