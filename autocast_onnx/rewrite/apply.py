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

import logging
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from onnx import AttributeProto, SparseTensorProto, TensorProto, helper, numpy_helper

from ..dtypes import (
    BFLOAT16,
    FLOAT,
    FLOAT16,
    LIMITS,
    MIXABLE,
    bf16_bits_to_float,
    dtype_name,
    float_to_bf16_bits,
    to_half,
)
from ..errors import InternalCheckError
from ..graph import GraphIndex
from ..io import is_external, tensor_array, tensor_bytes, tensor_nbytes
from ..plan.classify import chunked
from ..plan.model import PlanWarning, PrecisionPlan
from ..plan.paint import forced_low_reach
from ..plan.vocab import PortRole, Precision, required_type
from .checks import check_container_elements
from .edit import Names, cast_node, write_nodes
from .provenance import examine as examine_provenance
from .provenance import record as record_provenance
from .provenance import replaced_warning

log = logging.getLogger(__name__)
_FOLLOW, _FP32 = PortRole.FOLLOW.value, PortRole.FP32.value
_ELEM_TYPE = {p: p.elem_type for p in Precision}


@dataclass
class ApplyStats:
    casts_added: int = 0
    initializers_converted: int = 0
    initializer_copies: int = 0
    attributes_retargeted: int = 0
    clamped_values: int = 0
    sentinel_values: int = 0  # mask values beyond the range that took their sentinel (plan/masks.py)
    initializer_bytes_delta: int = 0
    outputs_renamed: list = field(default_factory=list)  # graph outputs now written by a Cast
    cast_outputs: list = field(default_factory=list)  # the tensors the added Casts write
    graphs_sorted: list = field(default_factory=list)  # graphs that were not topologically sorted


@dataclass
class _Edit:
    """The pending edits of one apply_plan call: nothing touches the graph's node lists until
    `write_nodes` places them."""

    index: GraphIndex
    plan: PrecisionPlan
    node_type: list  # per node id: the type it computes in, None = its own types
    stats: ApplyStats
    names: Names
    new_type: dict = field(default_factory=dict)  # Value -> the type its producer now gives it
    head: dict = field(default_factory=dict)  # scope id -> new nodes placed first
    after: dict = field(default_factory=dict)  # node id -> new nodes placed after it
    new_inits: dict = field(default_factory=dict)  # scope id -> new initializers
    jobs: list = field(default_factory=list)  # initializer conversions, run in one batch
    new_sparse: dict = field(default_factory=dict)  # scope id -> new sparse initializers
    sparse_jobs: list = field(default_factory=list)  # conversions of sparse initializers' values
    # id(Value) of fp32 tensors clipped before their cast to low -> the Clip's lower bound (None: -largest)
    saturate: dict = field(default_factory=dict)

    def need(self, consumer, port: int, value) -> int | None:
        return required_type(self.plan.roles_in[consumer.id][port], self.node_type[consumer.id], value.dtype)

    def final_type(self, node, side: str, k: int) -> int | None:
        """The type port `k` of `node` has once the casts are in (`side` "in" or "out"): an output
        has its producer's new type; an input the type its node needs there, else its value's."""
        if side == "out":
            value = node.outputs[k]
            return self.new_type.get(value, value.dtype)
        value = node.inputs[k]
        need = self.need(node, k, value)
        return need if need is not None else self.new_type.get(value, value.dtype)

    def add_cast(self, value, src_name: str, dst_name: str, to: int) -> None:
        """A Cast right after the producer of `value` (or first in its graph)."""
        self.stats.casts_added += 1
        self.stats.cast_outputs.append(dst_name)
        proto = cast_node(src_name, dst_name, self.names.fresh_node(dst_name), to)
        if value.producer is not None:
            self.after.setdefault(value.producer.id, []).append(proto)
        else:
            self.head.setdefault(value.scope.id, []).append(proto)


class PayloadSink(Protocol):
    """Where converted payloads may go instead of into their tensors' raw_data: `put` takes the
    payload as the data of `tensor`, a tensor of the model converted in place, and `put_new` as
    the data of a new tensor the rewrite adds to the model later (protobuf copies it in then);
    each says whether it took the payload (False: the caller stores it as raw_data). The output's
    external-data file (io.PayloadSpill) and the payloads a save in one piece splices in
    (fast/splice.py HeldPayloads) are sinks."""

    def put(self, tensor: TensorProto, payload) -> bool: ...

    def put_new(self, tensor: TensorProto, payload) -> bool: ...


def apply_plan(
    index: GraphIndex, plan: PrecisionPlan, *, sink: PayloadSink | None = None, converted: dict | None = None
) -> ApplyStats:
    """Edit the indexed model so that every node computes in its planned precision. The plan is
    the only input besides the model: its precisions and port roles say what each tensor's
    producer gives and what each consumer needs. Passes, in order:

      1. `_output_types`: the type each node output will have;
      2. `_low_precision_inputs`: with keep_io_types off, model inputs read only by low nodes go low;
      3. `_insert_casts`: one Cast per (tensor, needed type), graph outputs keep name and type,
         initializers get converted copies; then the tensors that go into or come out of a
         sequence or optional are checked to keep its element type (checks.check_container_elements);
      4. `_run_conversions`: the initializer payloads, vectorised;
      5. `_retarget_attributes`: Cast.to, dtype attributes and Constant values of retyped nodes;
      6. `_declare_types`: value_info, and the model's inputs/outputs when they change type;
      7. `write_nodes`: node lists written back in order with the new casts in place;
      8. `record_provenance`: the model's metadata says how it was made (provenance.py); a model
         that carries a record already keeps it when the passes changed nothing (converting a
         converted model again changes nothing, its bytes included), unless the record cannot be
         read: it is replaced, with a plan warning saying so.

    With a `sink` the converted payloads go there as they are produced (PayloadSink: the
    output's external-data file, or held for a save in one piece, which splices them into the
    encoding) instead of into their tensors. `converted` (id(TensorProto) -> fp16 bytes:
    classify's cache) holds payloads converted already, stored as they are instead of converting
    again."""
    stats = ApplyStats()
    # a converted model converted again: its bytes, to tell whether the passes change anything
    # (a record that cannot be read is replaced whatever they change)
    found, unreadable = examine_provenance(index.model)
    unchanged = index.model.SerializeToString() if found is not None and not unreadable else None
    node_type = [_ELEM_TYPE[p] for p in plan.precisions]
    edit = _Edit(index, plan, node_type, stats, Names(index))
    _output_types(edit)
    _low_precision_inputs(edit)
    edit.saturate = _saturated(index, plan)
    _insert_casts(edit)
    check_container_elements(index.nodes, edit.final_type)
    _run_conversions(edit.jobs, stats, sink, converted)
    _run_conversions(edit.sparse_jobs, stats, None, converted)  # stored in their tensors, never in a sink
    _retarget_attributes(edit)
    _declare_types(edit)
    for scope in index.scopes:
        extra = edit.new_inits.get(scope.id)
        if extra:
            scope.graph.initializer.extend(extra)
        extra = edit.new_sparse.get(scope.id)
        if extra:
            scope.graph.sparse_initializer.extend(extra)
    stats.graphs_sorted = write_nodes(index, edit.head, edit.after)
    if unchanged is None or index.model.SerializeToString() != unchanged:
        record_provenance(index.model, plan)
    if unreadable and replaced_warning(unreadable) not in (w.message for w in plan.warnings):
        plan.warnings.append(PlanWarning("provenance", replaced_warning(unreadable)))
    log.debug(
        "apply: %d casts, %d initializers converted, %d copies, %d attributes retargeted",
        stats.casts_added,
        stats.initializers_converted,
        stats.initializer_copies,
        stats.attributes_retargeted,
    )
    return stats


def _output_types(edit: _Edit) -> None:
    """Pass 1: the type each node output will have.

    MatMul planned fp16: output "p" fp32 -> fp16     Resize "scales" pinned: stays fp32"""
    new_type, node_type, roles_out = edit.new_type, edit.node_type, edit.plan.roles_out
    for node in edit.index.nodes:
        t = node_type[node.id]
        ro = roles_out[node.id]
        for k, value in enumerate(node.outputs):
            if value is None:
                continue
            role = ro[k]
            if role == _FOLLOW and t is not None and t != value.dtype:
                new_type[value] = t
            elif role == _FP32 and value.dtype != FLOAT and value.dtype in MIXABLE:
                new_type[value] = FLOAT


def _low_precision_inputs(edit: _Edit) -> None:
    """Pass 2: a model input named by low_precision_io takes the target type (consumers that
    need fp32 get a cast); with keep_io_types off, a model input that every consumer needs in
    the target type changes its declared type instead of getting a cast.

        input x: float -> MatMul(fp16)    becomes    input x: float16 -> MatMul
        low_precision_io past.0.key: float -> Concat(fp16)   becomes   past.0.key: float16 -> Concat"""
    low_io = frozenset(edit.plan.low_precision_io)
    if edit.plan.keep_io_types and not low_io:
        return
    target = edit.plan.target.elem_type
    for value in edit.index.main.inputs:
        if value.dtype not in MIXABLE or value.initializer is not None:
            continue  # an input with a default (initializer) keeps the type of its default
        if value.name in low_io:
            edit.new_type[value] = target
            continue
        if edit.plan.keep_io_types:
            continue
        needs = {edit.need(c, p, value) for c, p in value.consumers} - {None}
        if needs == {target} and not value.graph_outputs:
            edit.new_type[value] = target


def _insert_casts(edit: _Edit) -> None:
    """Pass 3: wherever a tensor's new type differs from what a consumer needs, one Cast per
    (tensor, type), shared by all its consumers, in the graph that defines the tensor.

        h = MatMul16(x); s = Softmax32(h)     becomes   h = MatMul16(x); h_fp32 = Cast(h); s = Softmax32(h_fp32)
        graph output y produced in fp16       becomes   y_fp16 = Op(...); y = Cast(y_fp16, to=FLOAT)"""
    index, plan, new_type = edit.index, edit.plan, edit.new_type
    keep_io = plan.keep_io_types
    low_io, target = frozenset(plan.low_precision_io), plan.target.elem_type
    roles_in, node_type = plan.roles_in, edit.node_type
    for scope in index.scopes:
        for value in scope.values.values():
            dt = value.dtype
            if dt not in MIXABLE:
                continue
            have = new_type.get(value, dt)
            # type -> the consumers that need the tensor in a type other than `have`
            wanted: dict = {}
            for consumer, port in value.consumers:
                need = required_type(roles_in[consumer.id][port], node_type[consumer.id], dt)
                if need is not None and need != have:
                    users = wanted.get(need)
                    if users is None:
                        wanted[need] = [(consumer, port)]
                    else:
                        users.append((consumer, port))
            out_need = None
            if value.graph_outputs and low_io and value.scope is index.main and value.name in low_io:
                out_need = target if have != target else None  # a low-precision model output
            elif value.graph_outputs and have != value.dtype and (keep_io or value.scope is not index.main):
                out_need = value.dtype
            if not wanted and out_need is None:
                continue
            if value.kind == "initializer":
                sparse = value.scope.sparse.get(value.name)
                if sparse is None:
                    planned = _plan_initializer(value, wanted, out_need, edit.names, edit.new_inits, plan, edit.jobs)
                else:
                    planned = _plan_initializer(
                        value, wanted, out_need, edit.names, edit.new_sparse, plan, edit.sparse_jobs, sparse
                    )
                if planned:
                    new_type[value] = next(iter(wanted))
                continue
            src_name = value.name
            if out_need is not None:
                src_name = _keep_graph_output(edit, value, have, out_need)
                wanted.pop(out_need, None)  # consumers wanting the original type read the graph output itself
            for need, users in wanted.items():
                exact = _exact_source(value, need)
                if exact is not None:
                    # value = Cast(exact) widened exact to fp32: the consumers read exact itself
                    # rather than a cast back (which would round-trip for nothing - and ONNX
                    # Runtime's removal of such pairs breaks when a subgraph reads them)
                    for consumer, port in users:
                        consumer.proto.input[port] = exact.name
                    continue
                cast_out = edit.names.fresh(f"{value.name}_{dtype_name(need)}")
                source = src_name
                if need != FLOAT and id(value) in edit.saturate:
                    source = _clip(edit, value, src_name, need, edit.saturate[id(value)])
                edit.add_cast(value, source, cast_out, need)
                for consumer, port in users:
                    consumer.proto.input[port] = cast_out


def _saturated(index: GraphIndex, plan: PrecisionPlan) -> dict:
    """The fp32 tensors whose cast into a low-precision node gets a Clip to the target's finite
    range first, with the Clip's lower bound (None: the range's own): those through which a
    constant the plan clamps (clamp_initializers) or retargets (mask_sentinels: its sentinel is the
    bound, so the mask keeps masking and a sum with the scores stays finite) reaches the node
    (plan.paint.forced_low_reach: the same walk that warned of it)."""
    if not plan.clamp_initializers and not plan.mask_sentinels:
        return {}
    out: dict = {}
    for reach in forced_low_reach(index, plan, direct=False):
        name = reach.constant.name
        if reach.boundary is None:
            continue
        if name in plan.mask_sentinels:
            out[id(reach.boundary)] = plan.mask_sentinels[name]
        elif name in plan.clamp_initializers:
            out.setdefault(id(reach.boundary), None)
    return out


def clamp_of(plan: PrecisionPlan, name: str) -> bool | float:
    """How a constant's values beyond the target's range are converted: a float, the mask
    sentinel they all take (mask_sentinels); True, clamped to the finite range (clamp_initializers);
    False, as they are (to inf)."""
    if name in plan.mask_sentinels:
        return plan.mask_sentinels[name]
    return name in plan.clamp_initializers


def _clip(edit: _Edit, value, src_name: str, to: int, lowest: float | None = None) -> str:
    """A Clip of `src_name` (the fp32 tensor `value`) to the finite range of type `to` (from
    `lowest` up, where given: a mask sentinel), placed where its cast goes (right after the
    producer of `value`); returns the clipped tensor. The cast after it then gives ±65504 (fp16)
    where it would give ±inf. Clip takes its bounds as inputs from opset 11, as attributes before."""
    largest = float(LIMITS[to][0])
    bottom = -largest if lowest is None else float(lowest)
    out = edit.names.fresh(f"{value.name}_clipped")
    name = edit.names.fresh_node(out)
    opset = edit.index.opset("") or 0
    if opset >= 11:
        low, high = edit.names.fresh(f"{out}_min"), edit.names.fresh(f"{out}_max")
        edit.new_inits.setdefault(value.scope.id, []).extend(
            [
                numpy_helper.from_array(np.array(bottom, np.float32), low),
                numpy_helper.from_array(np.array(largest, np.float32), high),
            ]
        )
        proto = helper.make_node("Clip", [src_name, low, high], [out], name=name)
    else:
        proto = helper.make_node("Clip", [src_name], [out], name=name, min=bottom, max=largest)
    if value.producer is not None:
        edit.after.setdefault(value.producer.id, []).append(proto)
    else:
        edit.head.setdefault(value.scope.id, []).append(proto)
    return out


def _keep_graph_output(edit: _Edit, value, have: int, out_need: int) -> str:
    """The graph output keeps its name and type: the producer writes a renamed tensor and a Cast
    restores the original name. Returns the renamed tensor."""
    internal = edit.names.fresh(f"{value.name}_{dtype_name(have)}")
    value.producer.proto.output[value.out_port] = internal
    # declare the renamed tensor: an op whose output type no input binds (MultiHeadAttention's
    # qk) cannot be typed by ONNX Runtime without it
    for scope, k in value.graph_outputs:
        if scope is value.scope and scope.graph.output[k].type.HasField("tensor_type"):
            declared = scope.graph.value_info.add()
            declared.CopyFrom(scope.graph.output[k])
            declared.name = internal
            declared.type.tensor_type.elem_type = have
            break
    for consumer, port in value.consumers:
        need = edit.need(consumer, port, value)
        if need is None or need == have:
            consumer.proto.input[port] = internal
    edit.add_cast(value, internal, value.name, out_need)
    edit.stats.outputs_renamed.append(value.name)
    return internal


def _retarget_attributes(edit: _Edit) -> None:
    """Pass 5: nodes whose output type is an attribute are told their planned type.

    Cast(to=FLOAT) planned fp16 -> Cast(to=FLOAT16);  ConstantOfShape(value=0.0f) -> value=0.0h"""
    stats, new_type, roles_out = edit.stats, edit.new_type, edit.plan.roles_out
    plan = edit.plan
    for node in edit.index.nodes:
        t = edit.node_type[node.id]
        if t is None or node.domain != "":
            continue
        op = node.op
        if op == "Cast":
            if roles_out[node.id][:1] == _FOLLOW:
                _set_int_attr(node.proto, "to", t, stats)
        elif op in ("EyeLike", "RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform", "Bernoulli"):
            if roles_out[node.id][:1] == _FOLLOW:
                _set_int_attr(node.proto, "dtype", t, stats)
        elif op == "ConstantOfShape":
            if node.outputs[0] in new_type:
                _retype_constant_of_shape(node.proto, t, stats)
        elif op == "Constant":
            if node.outputs[0] in new_type:
                _retype_constant(node.proto, t, clamp_of(plan, node.outputs[0].name), stats)


def _declare_types(edit: _Edit) -> None:
    """Pass 6: declared types follow: value_info entries, and the model's own inputs and outputs
    when keep_io_types is off or low_precision_io names them."""
    index = edit.index
    low_io = frozenset(edit.plan.low_precision_io)
    by_scope: dict[int, dict] = {}
    if any(len(scope.graph.value_info) for scope in index.scopes):  # else there is nothing to retype
        for value, t in edit.new_type.items():
            by_scope.setdefault(value.scope.id, {})[value.name] = t
    for scope in index.scopes:
        changed = by_scope.get(scope.id)
        if changed:
            for vi in scope.graph.value_info:
                t = changed.get(vi.name)
                if t is not None and vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.elem_type = t
        if scope is index.main and (low_io or not edit.plan.keep_io_types):
            keep = edit.plan.keep_io_types
            target = edit.plan.target.elem_type
            for vi in scope.graph.input:
                v = scope.values.get(vi.name)
                if v in edit.new_type and (not keep or vi.name in low_io):
                    vi.type.tensor_type.elem_type = edit.new_type[v]
            for vi in scope.graph.value_info:  # a low-precision output restored by a cast
                if vi.name in low_io and vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.elem_type = target
            for vi, v in zip(scope.graph.output, scope.outputs):
                if not vi.type.HasField("tensor_type"):
                    continue
                if vi.name in low_io:
                    vi.type.tensor_type.elem_type = target
                elif not keep and v in edit.new_type:
                    vi.type.tensor_type.elem_type = edit.new_type[v]


def _exact_source(value, need):
    """The tensor `value` was widened from by a Cast, when that tensor already has type `need`
    (fp16/bf16 -> fp32 is exact, so casting back would give it again)."""
    producer = value.producer
    if producer is None or producer.op != "Cast" or producer.domain != "":
        return None
    source = producer.inputs[0] if producer.inputs else None
    if source is None or source.dtype != need or need not in (FLOAT16, BFLOAT16) or value.dtype != FLOAT:
        return None
    return source


def _set_int_attr(proto, name, value, stats):
    for attr in proto.attribute:
        if attr.name == name:
            if attr.i != value:
                attr.i = value
                stats.attributes_retargeted += 1
            return
    proto.attribute.append(helper.make_attribute(name, value))
    stats.attributes_retargeted += 1


def convert_array(data: np.ndarray, src: int, dst: int, clamp: bool | float = False):
    """Convert array `data` stored as `src` into a TensorProto payload of type `dst`:
    returns (raw bytes, clamped count). `clamp` True clamps finite values beyond the range to its
    largest magnitude; a float (a mask sentinel, plan/masks.py) is the value that every finite
    value below it takes instead (the edge of the range itself included: -65504 has no headroom
    for a sum either)."""
    if src == BFLOAT16:
        data = bf16_bits_to_float(data.view(np.uint16) if data.dtype != np.uint16 else data)
    values = np.asarray(data, dtype=np.float32)
    clamped = 0
    if dst == FLOAT:
        return values.astype("<f4").tobytes(), 0
    if clamp:
        limit = 65504.0 if dst == FLOAT16 else 3.3895313892515355e38
        finite = np.isfinite(values)
        over = finite & ((np.abs(values) > limit) if clamp is True else (values < clamp))
        clamped = int(over.sum())
        fill = np.sign(values) * limit if clamp is True else np.float32(clamp)
        values = np.where(over, fill, values).astype(np.float32)
    if dst == FLOAT16:
        with np.errstate(over="ignore"):
            return values.astype("<f2").tobytes(), clamped
    if dst == BFLOAT16:
        return float_to_bf16_bits(values).astype("<u2").tobytes(), clamped
    raise InternalCheckError(f"cannot convert to {dst}")


def _count_clamped(stats: ApplyStats, clamp: bool | float, count: int) -> None:
    if clamp is True:
        stats.clamped_values += count
    else:
        stats.sentinel_values += count


def _converted_tensor(tensor: TensorProto, name: str, dst: int, clamp: bool | float, stats) -> TensorProto:
    raw, clamped = convert_array(tensor_array(tensor, None), tensor.data_type, dst, clamp)
    _count_clamped(stats, clamp, clamped)
    out = TensorProto()
    out.name = name
    out.dims.extend(tensor.dims)
    out.data_type = dst
    out.raw_data = raw
    return out


def _plan_initializer(value, wanted, out_need, names, new_inits, plan, jobs, sparse=None) -> bool:
    """One converted copy per needed type; in place when nobody needs the original (returns
    True then: the initializer itself changes type). For a sparse initializer (`sparse`, whose
    values tensor is value.initializer) the values are converted, and a copy is a sparse
    initializer with the same indices and dims."""
    tensor = value.initializer
    clamp = clamp_of(plan, value.name)
    served = sum(len(users) for users in wanted.values())
    # A graph output that is an initializer keeps its exact values: consumers get copies.
    needs_original = bool(value.graph_outputs) or out_need is not None or served < len(value.consumers)
    if not needs_original and len(wanted) == 1:
        jobs.append((tensor, None, next(iter(wanted)), clamp, value.scope.base_dir))
        return True
    for need, users in wanted.items():
        held, copy = _new_copy(sparse)
        copy.name = names.fresh(f"{value.name}_{dtype_name(need)}")
        copy.dims.extend(tensor.dims)
        new_inits.setdefault(value.scope.id, []).append(held)
        jobs.append((tensor, copy, need, clamp, value.scope.base_dir))
        for consumer, port in users:
            consumer.proto.input[port] = copy.name
    return False


def _new_copy(sparse: SparseTensorProto | None) -> tuple:
    """(what the graph will hold, the tensor the converted payload goes to) for one copy of an
    initializer: the same TensorProto twice, or a SparseTensorProto sharing `sparse`'s indices
    and dims, and its values tensor. The graph takes the holder once the payload is in."""
    if sparse is None:
        copy = TensorProto()
        return copy, copy
    holder = SparseTensorProto()
    holder.indices.CopyFrom(sparse.indices)
    holder.dims.extend(sparse.dims)
    return holder, holder.values


def _run_conversions(jobs, stats, sink: PayloadSink | None = None, converted: dict | None = None) -> None:
    """Convert initializers. The common case (fp32 to fp16, no clamping) takes the payload the
    data rules already converted, or runs vectorised over chunks of tensors; the rest one by one.
    Sources stored as external data are read a chunk at a time, so only the converted payloads
    accumulate in memory."""
    fast, rest = [], []
    for j in jobs:
        source = j[0]
        if source.data_type != FLOAT or j[2] != FLOAT16 or j[3]:
            rest.append(j)
            continue
        done = converted.pop(id(source), None) if converted else None
        if done is not None:
            _store(source, j[1], FLOAT16, done, stats, 2 * len(done), sink)
        elif source.HasField("raw_data") or is_external(source):
            fast.append(j)
        else:
            rest.append(j)
    if fast:
        sizes = [tensor_nbytes(j[0]) for j in fast]
        for group in chunked(sizes):
            raws = [tensor_bytes(fast[k][0], fast[k][4]) for k in group]
            half = to_half(np.frombuffer(b"".join(raws), dtype="<f4"))
            del raws
            view = half.view(np.uint8).data
            offset = 0
            for k in group:
                n = sizes[k] // 2
                source, copy, dst, _, _ = fast[k]
                _store(source, copy, dst, view[offset : offset + n], stats, sizes[k], sink)
                offset += n
    for source, copy, dst, clamp, base_dir in rest:
        array = tensor_array(source, base_dir)
        raw, clamped = convert_array(array, source.data_type, dst, clamp)
        _count_clamped(stats, clamp, clamped)
        _store(source, copy, dst, raw, stats, array.nbytes, sink)


def _store(source, copy, dst, payload, stats, source_bytes, sink: PayloadSink | None = None) -> None:
    """Give the converted `payload` (bytes or a memoryview of the chunk) to its tensor (`copy`,
    a new tensor, when the source stays as it is): to the sink if it takes it, else as raw_data."""
    if copy is None:
        stats.initializer_bytes_delta += len(payload) - source_bytes
        for fld in ("float_data", "int32_data", "double_data"):
            source.ClearField(fld)
        if is_external(source):
            del source.external_data[:]
            source.ClearField("data_location")
        source.data_type = dst
        if sink is None or not sink.put(source, payload):
            source.raw_data = bytes(payload)
        stats.initializers_converted += 1
    else:
        copy.data_type = dst
        if sink is None or not sink.put_new(copy, payload):
            copy.raw_data = bytes(payload)
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
