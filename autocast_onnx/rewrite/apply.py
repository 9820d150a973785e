"""Stage: apply the plan. The only module that edits the graph.

For every tensor it works out the type its producer now gives it and the type each consumer
needs; where they differ it adds one Cast per (tensor, type), shared by all consumers and
placed in the graph that defines the tensor, right after its producer. Initializers get one
converted copy per type that is needed (converted in place when nobody needs the original).
Graph outputs keep their names and, by default, their types. Existing Casts and dtype
attributes (Cast.to, ConstantOfShape.value, EyeLike/Random*.dtype, Constant.value) are
retargeted to the node's planned type. Nodes are written back in topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..dtypes import BFLOAT16, FLOAT, FLOAT16, MIXABLE, PRECISION_OF, bf16_bits_to_float, dtype_name, float_to_bf16_bits
from ..errors import InternalCheckError
from ..graph import GraphIndex
from ..io import is_external, tensor_array, tensor_bytes, tensor_nbytes
from ..plan.classify import Classification, chunked
from ..plan.model import PrecisionPlan


@dataclass
class ApplyStats:
    casts_added: int = 0
    initializers_converted: int = 0
    initializer_copies: int = 0
    attributes_retargeted: int = 0
    clamped_values: int = 0
    initializer_bytes_delta: int = 0
    outputs_renamed: list = field(default_factory=list)   # graph outputs now written by a Cast
    graphs_sorted: list = field(default_factory=list)     # graphs that were not topologically sorted


class _Names:
    """Collision-free, deterministic names for new tensors and nodes."""

    def __init__(self, index: GraphIndex):
        self.tensors = set()
        for scope in index.scopes:
            self.tensors.update(scope.values)
            for vi in scope.graph.output:
                self.tensors.add(vi.name)
        self._index = index
        self._nodes = None

    @staticmethod
    def _fresh(base: str, taken: set) -> str:
        name = base
        k = 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    def fresh(self, base: str) -> str:
        """A tensor name used nowhere in the model (any graph)."""
        return self._fresh(base, self.tensors)

    def fresh_node(self, base: str) -> str:
        """A node name used by no other node (built on first use: most conversions need few)."""
        if self._nodes is None:
            self._nodes = {node.name for node in self._index.nodes}
        return self._fresh(base, self._nodes)


def apply_plan(index: GraphIndex, plan: PrecisionPlan, cls: Classification) -> ApplyStats:
    stats = ApplyStats()
    target = PRECISION_OF[plan.target]
    keep_io = plan.keep_io_types
    nodes = index.nodes
    roles_in, roles_out = cls.roles_in, cls.roles_out
    node_type = [None] * len(nodes)
    for i, precision in enumerate(plan.precisions):
        if precision != "unchanged":
            node_type[i] = PRECISION_OF[precision]

    # 1. The type each value will have.
    new_type = {}
    for node in nodes:
        t = node_type[node.id]
        ro = roles_out[node.id]
        for k, value in enumerate(node.outputs):
            if value is None:
                continue
            role = ro[k]
            if role == "p" and t is not None and t != value.dtype:
                new_type[value] = t
            elif role == "f" and value.dtype != FLOAT and value.dtype in MIXABLE:
                new_type[value] = FLOAT

    def requirement(consumer, port, value):
        role = roles_in[consumer.id][port]
        if role == "f":
            return FLOAT
        if role == "p":
            t = node_type[consumer.id]
            return t if t is not None else value.dtype
        if role == "o":
            return value.dtype
        return None

    main_inputs = set(index.main.inputs) if not keep_io else set()
    for value in main_inputs:
        if value.dtype not in MIXABLE or value.initializer is not None:
            continue   # an input with a default (initializer) keeps the type of its default
        needs = {requirement(c, p, value) for c, p in value.consumers} - {None}
        if needs == {target} and not value.graph_outputs:
            new_type[value] = target

    names = _Names(index)
    jobs: list = []   # initializer conversions, run in one batch: (source, target proto or None, dst, clamp)
    # scope id -> list of new nodes to place at the head, and node id -> casts to place after it
    head: dict[int, list] = {}
    after: dict[int, list] = {}
    new_inits: dict[int, list] = {}

    def cast_node(src_name, dst_name, to):
        stats.casts_added += 1
        return _cast_bytes(src_name, dst_name, names.fresh_node(dst_name), to)

    def place(value, node_proto):
        if value.producer is not None:
            after.setdefault(value.producer.id, []).append(node_proto)
        else:
            head.setdefault(value.scope.id, []).append(node_proto)

    node_type_or = node_type
    for scope in index.scopes:
        for value in scope.values.values():
            dt = value.dtype
            if dt not in MIXABLE:
                continue
            have = new_type.get(value, dt)
            wanted = {}
            for consumer, port in value.consumers:
                role = roles_in[consumer.id][port]
                if role == "p":
                    need = node_type_or[consumer.id] or dt
                elif role == "f":
                    need = FLOAT
                elif role == "o":
                    need = dt
                else:
                    continue
                if need != have:
                    users = wanted.get(need)
                    if users is None:
                        wanted[need] = [(consumer, port)]
                    else:
                        users.append((consumer, port))
            out_need = None
            if value.graph_outputs and have != value.dtype and (keep_io or value.scope is not index.main):
                out_need = value.dtype
            if not wanted and out_need is None:
                continue
            if value.kind == "initializer":
                if _plan_initializer(value, wanted, out_need, names, new_inits, plan, jobs):
                    new_type[value] = next(iter(wanted))
                continue
            src_name = value.name
            if out_need is not None:
                # The graph output keeps its name and type: the producer writes a renamed tensor and a
                # Cast restores the original name.
                internal = names.fresh(f"{value.name}_{dtype_name(have)}")
                producer = value.producer
                producer.proto.output[value.out_port] = internal
                for consumer, port in value.consumers:
                    need = requirement(consumer, port, value)
                    if need is None or need == have:
                        consumer.proto.input[port] = internal
                place(value, cast_node(internal, value.name, out_need))
                stats.outputs_renamed.append(value.name)
                src_name = internal
                if out_need in wanted:
                    # consumers wanting the original type read the graph output itself
                    wanted.pop(out_need)
            for need, users in wanted.items():
                exact = _exact_source(value, need)
                if exact is not None:
                    # value = Cast(exact) widened exact to fp32: the consumers read exact itself
                    # rather than a cast back (which would round-trip for nothing - and ONNX
                    # Runtime's removal of such pairs breaks when a subgraph reads them)
                    for consumer, port in users:
                        consumer.proto.input[port] = exact.name
                    continue
                cast_out = names.fresh(f"{value.name}_{dtype_name(need)}")
                place(value, cast_node(src_name, cast_out, need))
                for consumer, port in users:
                    consumer.proto.input[port] = cast_out

    _run_conversions(jobs, stats)

    # 2. Attributes of retyped nodes.
    for node in nodes:
        t = node_type[node.id]
        if t is None or node.domain not in ("", "ai.onnx"):
            continue
        op = node.op
        if op == "Cast":
            if roles_out[node.id][:1] == "p":
                _set_int_attr(node.proto, "to", t, stats)
        elif op in ("EyeLike", "RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform", "Bernoulli"):
            if roles_out[node.id][:1] == "p":
                _set_int_attr(node.proto, "dtype", t, stats)
        elif op == "ConstantOfShape":
            if node.outputs[0] in new_type:
                _retype_constant_of_shape(node.proto, t, stats)
        elif op == "Constant":
            if node.outputs[0] in new_type:
                _retype_constant(node.proto, t, node.outputs[0].name in plan.clamp_initializers, stats)

    # 3. Declared types: value_info, graph inputs and outputs.
    by_scope: dict[int, dict] = {}
    for value, t in new_type.items():
        by_scope.setdefault(value.scope.id, {})[value.name] = t
    for scope in index.scopes:
        changed = by_scope.get(scope.id)
        if changed:
            for vi in scope.graph.value_info:
                t = changed.get(vi.name)
                if t is not None and vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.elem_type = t
        if scope is index.main and not keep_io:
            for vi in scope.graph.input:
                v = scope.values.get(vi.name)
                if v in new_type:
                    vi.type.tensor_type.elem_type = new_type[v]
            for vi, v in zip(scope.graph.output, scope.outputs):
                if v in new_type and vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.elem_type = new_type[v]

    # 4. Write nodes back in order, with the new casts in place.
    # Innermost graphs first: a body graph is edited through its owner node's proto, which must
    # not have been copied into its parent's rebuilt node list yet.
    for scope in reversed(index.scopes):
        graph = scope.graph
        extra = new_inits.get(scope.id)
        if extra:
            graph.initializer.extend(extra)
        first = head.get(scope.id, [])
        if not first and scope.sorted and not any(n.id in after for n in scope.nodes):
            continue
        if not scope.sorted:
            stats.graphs_sorted.append(scope.path)
        ordered = list(first)
        for node in scope.order:
            ordered.append(node.proto)
            ordered.extend(after.get(node.id, ()))
        _replace_nodes(graph, ordered)
    return stats


def _field(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8")
    return tag + _varint(len(data)) + data


def _cast_bytes(src: str, dst: str, name: str, to: int) -> bytes:
    """A serialized NodeProto `Cast(src) -> dst` with attribute to: protobuf wire format, written
    directly because building 10^4 small messages through the Python API is the slow part of
    large conversions. Fields: input=1, output=2, name=3, op_type=4, attribute=5; in the
    AttributeProto: name=1, i=3, type=20 (INT=2)."""
    attr = b"\x0a\x02to\x18" + _varint(to) + b"\xa0\x01\x02"
    return (_field(b"\x0a", src) + _field(b"\x12", dst) + _field(b"\x1a", name) + b"\x22\x04Cast"
            + b"\x2a" + _varint(len(attr)) + attr)


_SMALL_VARINTS = []


def _exact_source(value, need):
    """The tensor `value` was widened from by a Cast, when that tensor already has type `need`
    (fp16/bf16 -> fp32 is exact, so casting back would give it again)."""
    producer = value.producer
    if producer is None or producer.op != "Cast" or producer.domain not in ("", "ai.onnx"):
        return None
    source = producer.inputs[0] if producer.inputs else None
    if source is None or source.dtype != need or need not in (FLOAT16, BFLOAT16) or value.dtype != FLOAT:
        return None
    return source


def _varint(n: int) -> bytes:
    if n < 16384 and _SMALL_VARINTS:
        return _SMALL_VARINTS[n]
    return _encode_varint(n)


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _replace_nodes(graph, ordered) -> None:
    """Set graph.node to `ordered`. Copying 100k messages one by one through the protobuf API is
    slow; serializing each and merging them as `node` fields (tag 1, length-delimited) in one
    parse is several times faster and gives the same message."""
    parts = []
    varint = _varint
    for proto in ordered:
        payload = proto if proto.__class__ is bytes else proto.SerializeToString()
        parts.append(b"\x0a" + varint(len(payload)) + payload)
    del graph.node[:]
    graph.MergeFromString(b"".join(parts))


def _set_int_attr(proto, name, value, stats):
    for attr in proto.attribute:
        if attr.name == name:
            if attr.i != value:
                attr.i = value
                stats.attributes_retargeted += 1
            return
    proto.attribute.append(helper.make_attribute(name, value))
    stats.attributes_retargeted += 1


def convert_array(data: np.ndarray, src: int, dst: int, clamp: bool = False):
    """Convert array `data` stored as `src` into a TensorProto payload of type `dst`:
    returns (raw bytes, clamped count)."""
    if src == BFLOAT16:
        data = bf16_bits_to_float(data.view(np.uint16) if data.dtype != np.uint16 else data)
    values = np.asarray(data, dtype=np.float32)
    clamped = 0
    if dst == FLOAT:
        return values.astype("<f4").tobytes(), 0
    if clamp:
        limit = 65504.0 if dst == FLOAT16 else 3.3895313892515355e38
        finite = np.isfinite(values)
        over = finite & (np.abs(values) > limit)
        clamped = int(over.sum())
        values = np.where(over, np.sign(values) * limit, values).astype(np.float32)
    if dst == FLOAT16:
        with np.errstate(over="ignore"):
            return values.astype("<f2").tobytes(), clamped
    if dst == BFLOAT16:
        return float_to_bf16_bits(values).astype("<u2").tobytes(), clamped
    raise InternalCheckError(f"cannot convert to {dst}")


def _converted_tensor(tensor: TensorProto, name: str, dst: int, clamp: bool, stats) -> TensorProto:
    raw, clamped = convert_array(tensor_array(tensor, None), tensor.data_type, dst, clamp)
    stats.clamped_values += clamped
    out = TensorProto()
    out.name = name
    out.dims.extend(tensor.dims)
    out.data_type = dst
    out.raw_data = raw
    return out


def _plan_initializer(value, wanted, out_need, names, new_inits, plan, jobs) -> bool:
    """One converted copy per needed type; in place when nobody needs the original (returns
    True then: the initializer itself changes type)."""
    tensor = value.initializer
    clamp = value.name in plan.clamp_initializers
    served = sum(len(users) for users in wanted.values())
    # A graph output that is an initializer keeps its exact values: consumers get copies.
    needs_original = bool(value.graph_outputs) or out_need is not None or served < len(value.consumers)
    if not needs_original and len(wanted) == 1:
        jobs.append((tensor, None, next(iter(wanted)), clamp, value.scope.base_dir))
        return True
    for need, users in wanted.items():
        copy = TensorProto()
        copy.name = names.fresh(f"{value.name}_{dtype_name(need)}")
        copy.dims.extend(tensor.dims)
        new_inits.setdefault(value.scope.id, []).append(copy)
        jobs.append((tensor, copy, need, clamp, value.scope.base_dir))
        for consumer, port in users:
            consumer.proto.input[port] = copy.name
    return False


def _run_conversions(jobs, stats) -> None:
    """Convert initializers. The common case (fp32 to fp16, no clamping) runs vectorised over
    chunks of tensors; the rest one by one. Sources stored as external data are read a chunk at a
    time, so only the converted payloads accumulate in memory."""
    fast = [j for j in jobs if j[0].data_type == FLOAT and j[2] == FLOAT16 and not j[3]
            and (j[0].HasField("raw_data") or is_external(j[0]))]
    fast_ids = {id(j) for j in fast}
    if fast:
        sizes = [tensor_nbytes(j[0]) for j in fast]
        for group in chunked(sizes):
            raws = [tensor_bytes(fast[k][0], fast[k][4]) for k in group]
            with np.errstate(over="ignore"):
                half = np.frombuffer(b"".join(raws), dtype="<f4").astype("<f2").tobytes()
            del raws
            view = memoryview(half)
            offset = 0
            for k in group:
                n = sizes[k] // 2
                source, copy, dst, _, _ = fast[k]
                _store(source, copy, dst, bytes(view[offset:offset + n]), stats, sizes[k])
                offset += n
    for job in jobs:
        if id(job) in fast_ids:
            continue
        source, copy, dst, clamp, base_dir = job
        array = tensor_array(source, base_dir)
        raw, clamped = convert_array(array, source.data_type, dst, clamp)
        stats.clamped_values += clamped
        _store(source, copy, dst, raw, stats, array.nbytes)


def _store(source, copy, dst, payload, stats, source_bytes) -> None:
    if copy is None:
        stats.initializer_bytes_delta += len(payload) - source_bytes
        for fld in ("float_data", "int32_data", "double_data"):
            source.ClearField(fld)
        if is_external(source):
            del source.external_data[:]
            source.data_location = TensorProto.DEFAULT
        source.data_type = dst
        source.raw_data = payload
        stats.initializers_converted += 1
    else:
        copy.data_type = dst
        copy.raw_data = payload
        stats.initializer_copies += 1
        stats.initializer_bytes_delta += len(payload)


def _retype_constant_of_shape(proto, t, stats):
    for attr in proto.attribute:
        if attr.name == "value":
            attr.t.CopyFrom(_converted_tensor(attr.t, attr.t.name, t, False, stats))
            stats.attributes_retargeted += 1
            return
    zero = TensorProto()
    zero.dims.append(1)
    zero.data_type = t
    zero.raw_data = b"\0\0" if t in (FLOAT16, BFLOAT16) else b"\0\0\0\0"
    proto.attribute.append(helper.make_attribute("value", zero))
    stats.attributes_retargeted += 1


def _retype_constant(proto, t, clamp, stats):
    for k, attr in enumerate(proto.attribute):
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            attr.t.CopyFrom(_converted_tensor(attr.t, attr.t.name, t, clamp, stats))
            stats.attributes_retargeted += 1
            return
        if attr.name in ("value_float", "value_floats"):
            data = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float32)
            tensor = numpy_helper.from_array(data)
            del proto.attribute[k]
            proto.attribute.append(helper.make_attribute("value", _converted_tensor(tensor, "", t, clamp, stats)))
            stats.attributes_retargeted += 1
            return


_SMALL_VARINTS.extend(_encode_varint(i) for i in range(16384))
