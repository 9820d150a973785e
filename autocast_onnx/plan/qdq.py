"""Q/DQ units: classification's last pass for quantized graphs.

A DequantizeLinear, the op it feeds, and the QuantizeLinear that quantizes that op's output form
one unit: runtimes (ONNX Runtime's QDQ fusions, TensorRT's explicit quantization) fuse
`DequantizeLinear -> Conv -> QuantizeLinear` into one int8 kernel only when the Q/DQ nodes sit
directly on the op, so a Cast on any of those edges silently turns an int8 model into a float
one. The pass joins every DequantizeLinear with its consumers and every QuantizeLinear with the
producer of its input (union-find: the joined nodes are one unit) and seeds the whole unit with
one precision, so painting never puts a cast inside it:

  - below opset 19 DequantizeLinear outputs and QuantizeLinear inputs are fp32 by schema (fp16
    and bf16 scales come with opset 19), so the unit keeps its fp32 interface: its ops are seeded
    fp32 without starting an fp32 taint (Seed.SCHEMA), and the float remainder between units runs
    low under the usual rules, with its casts on the unit's boundary;
  - from opset 19 the unit runs in the target type (Seed.ALLOW): the rewrite converts the scale
    initializers (zero points are integers and keep their types), so the DequantizeLinear outputs
    and the QuantizeLinear inputs are fp16 or bf16 and the op between them computes in that type;
    a unit with a member that must stay fp32 (a keep_fp32 op, a rule or data rule, a schema
    without the type) keeps the fp32 interface whole instead.

Only reads the index; writes seeds and reasons into the classification.
"""

from __future__ import annotations

import logging
from typing import Any

from ..graph import GraphIndex
from ..graph.shapes import MAC_OPS
from .model import Reason
from .vocab import Category, PortRole, Seed

log = logging.getLogger(__name__)

QDQ_DOMAINS = frozenset({"", "com.microsoft"})
DQ, Q = "DequantizeLinear", "QuantizeLinear"
_QDQ_OPS = frozenset({DQ, Q})
QDQ_OPSET = 19  # DequantizeLinear/QuantizeLinear take fp16/bf16 scales from this opset of the default domain
QDQ_UNIT = "qdq-unit"  # the reason code of a node whose precision its Q/DQ unit decides
QDQ_OPSET_WARNING = "qdq-opset"  # the warning code: a later opset would let the units run low
_FLOAT_PORT = PortRole.FOLLOW.value + PortRole.FP32.value  # roles of a float tensor the plan types
_FP32_SEEDS = (Seed.DENY, Seed.SCHEMA)
_FP32_ROLE = PortRole.FP32.value


def is_dq(node) -> bool:
    """Whether `node` is a DequantizeLinear (default or com.microsoft domain)."""
    return node.op == DQ and node.domain in QDQ_DOMAINS


def is_q(node) -> bool:
    """Whether `node` is a QuantizeLinear (default or com.microsoft domain)."""
    return node.op == Q and node.domain in QDQ_DOMAINS


def qdq_nodes(index: GraphIndex) -> list:
    """The DequantizeLinear and QuantizeLinear nodes of every scope (one pass over the nodes)."""
    return [node for node in index.nodes if node.op in _QDQ_OPS and node.domain in QDQ_DOMAINS]


def unit_edges(nodes: list):
    """(producer, consumer, port) for every float edge inside a Q/DQ unit of the Q/DQ `nodes`
    (qdq_nodes): a DequantizeLinear's output into any node that reads it, and any node's output
    into a QuantizeLinear's input x. The converter puts no node on these edges, and lint reports
    one that another tool put there."""
    for node in nodes:
        if is_dq(node) and node.outputs and node.outputs[0] is not None:
            for consumer, port in node.outputs[0].consumers:
                yield node, consumer, port
        elif is_q(node) and node.inputs and node.inputs[0] is not None and node.inputs[0].producer is not None:
            yield node.inputs[0].producer, node, 0


def _units(index: GraphIndex, roles_in, roles_out) -> tuple[dict[int, list], set[int]]:
    """The Q/DQ units, root node id -> member nodes, joining the two ends of each unit edge whose
    ports both follow their nodes (a DequantizeLinear read by a Cast, a Shape or a control-flow node
    is left to the usual rules), and the ids of the Q/DQ nodes that must stay fp32 because the other
    end of one of their edges is pinned fp32 (BatchNormalization's scale and bias, a rule-file pin):
    that end is not joined, so the node it belongs to keeps its own precision."""
    parent: dict[int, int] = {}
    nodes: dict[int, Any] = {}
    pinned: set[int] = set()

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def add(node) -> None:
        if node.id not in parent:
            parent[node.id] = node.id
            nodes[node.id] = node

    quantizers = qdq_nodes(index)
    for node in quantizers:  # every Q/DQ node is a unit, alone until an edge joins it to others
        add(node)
        out = node.outputs[0] if node.outputs else None
        if is_dq(node) and out is not None and out.graph_outputs:
            pinned.add(node.id)  # a model output keeps its type: a low DequantizeLinear would need a cast there
    for producer, consumer, port in unit_edges(quantizers):
        role_in = roles_in[consumer.id][port]
        role_out = roles_out[producer.id][consumer.inputs[port].out_port]
        if role_in not in _FLOAT_PORT or role_out not in _FLOAT_PORT:
            continue
        quant, own, other = (producer, role_out, role_in) if is_dq(producer) else (consumer, role_in, role_out)
        add(quant)
        if other == _FP32_ROLE and own != _FP32_ROLE:
            pinned.add(quant.id)  # the other end is fp32 whatever its node computes in
            continue
        add(producer if quant is consumer else consumer)
        a, b = find(producer.id), find(consumer.id)
        if a != b:
            parent[b] = a
    units: dict[int, list] = {}
    for i, node in nodes.items():
        units.setdefault(find(i), []).append(node)
    return units, pinned


# Ops whose Q/DQ unit keeps fp32 scales whatever the opset, because ONNX Runtime's CPU optimizer
# fuses the unit into an int8 kernel without checking its scales' type, and that kernel takes fp32
# scales only: with fp16 ones the model does not load at all (ONNX Runtime 1.32: a Q/DQ Concat
# becomes QLinearConcat, "Type 'tensor(float16)' of input parameter (cat_scale) ... is invalid",
# on a quantized vit_tiny at opset 19). Other QDQ fusions check the type and leave the unit unfused.
FP32_SCALE_OPS = frozenset({"Concat"})


def mark_qdq_units(index: GraphIndex, planned: list, result) -> None:
    """Classification's last pass (module docstring): seed each Q/DQ unit with one precision.
    `planned`: the nodes painting decides; `result`: the Classification, whose seeds and reasons
    it completes and whose warnings get one line when units keep fp32 for want of opset 19."""
    units, pinned = _units(index, result.roles_in, result.roles_out)
    if not units:
        return
    decided = {node.id for node in planned}
    kept_for_opset: list = []
    for members in units.values():
        ops = [n for n in members if not (is_dq(n) or is_q(n))]
        qdq = [n for n in members if is_dq(n) or is_q(n)]
        fp32_interface = any(_fp32_interface(n, result) for n in qdq)
        if not ops:  # Q into DQ only, or a DQ into a pinned port: nothing to hold together but its own type
            if fp32_interface or any(n.id in pinned for n in qdq):
                _seed_unit(members, decided, result, Seed.SCHEMA, _fp32_why(index, qdq[0], qdq, None, pinned))
            continue
        blocker = None if fp32_interface else _fp32_member(members, decided, result, pinned)
        runtime = None if fp32_interface or blocker else next((n for n in ops if n.op in FP32_SCALE_OPS), None)
        if runtime is not None:
            _seed_unit(members, decided, result, Seed.SCHEMA, _runtime_why(runtime))
        elif fp32_interface or blocker is not None:
            why = _fp32_why(index, qdq[0], ops, blocker, pinned)
            _seed_unit(members, decided, result, Seed.SCHEMA, why)
            if fp32_interface:
                kept_for_opset.append(ops)
        else:
            why = Reason(
                QDQ_UNIT,
                f"one Q/DQ unit with {_names(ops)}: the DequantizeLinear outputs, the op and the QuantizeLinear "
                "inputs run in the target type with converted scales, so no cast splits the int8 unit",
            )
            _seed_unit(members, decided, result, Seed.ALLOW, why)
    if kept_for_opset:
        result.warnings.append(_opset_warning(index, kept_for_opset))
    log.debug("classify pass 6 (Q/DQ units): %d units, %d keep their fp32 interface", len(units), len(kept_for_opset))


def _runtime_why(op_node) -> Reason:
    """The reason of a unit that keeps fp32 scales for the runtime's sake (FP32_SCALE_OPS)."""
    return Reason(
        QDQ_UNIT,
        f"one Q/DQ unit with {op_node.op} {op_node.label}: ONNX Runtime's CPU optimizer fuses it into "
        f"QLinear{op_node.op}, which takes fp32 scales only (a model with fp16 ones does not load), so the "
        "unit keeps its fp32 interface and no cast splits it",
    )


def _fp32_interface(node, result) -> bool:
    """Whether a Q/DQ node's float side is fp32 only: its schema (below opset 19, or the
    com.microsoft ops) admits no low-precision scale, so its float port is pinned fp32."""
    port = result.roles_out[node.id][:1] if is_dq(node) else result.roles_in[node.id][:1]
    return port == PortRole.FP32.value


def _fp32_member(members: list, decided: set, result, pinned: set):
    """The first member of a unit that must compute in fp32 (a keep_fp32 op, a node kept fp32 by
    a rule, data rule, calibration or schema, a frozen node, one painting does not decide, a Q/DQ
    node read or fed at a pinned fp32 port), else None."""
    for node in members:
        i = node.id
        if i in pinned:
            return node
        if (is_dq(node) or is_q(node)) and i in decided and result.seeds[i] is None:
            continue  # takes the unit's type
        if (
            i not in decided
            or result.frozen[i]
            or result.seeds[i] in _FP32_SEEDS
            or result.categories[i] == Category.KEEP_FP32.value
        ):
            return node
    return None


def _fp32_why(index: GraphIndex, first_qdq, ops: list, blocker, pinned: set) -> Reason:
    """The reason of a unit that keeps its fp32 interface: the opset, a pinned port, or the member
    that is fp32."""
    if blocker is None and first_qdq.id in pinned:
        return Reason(
            QDQ_UNIT,
            f"{first_qdq.op} {first_qdq.label} meets a port pinned fp32 (a parameter the schema or the rules keep "
            "fp32): it keeps fp32, so no cast comes between it and that port",
        )
    if blocker is None:
        return Reason(
            QDQ_UNIT,
            f"one Q/DQ unit with {_names(ops)}: {first_qdq.op} at opset {index.opset(first_qdq.domain)}"
            f"{' of ' + first_qdq.domain if first_qdq.domain else ''} takes fp32 scales only, so the unit keeps its "
            f"fp32 interface and no cast splits it; opset {QDQ_OPSET} (--opset {QDQ_OPSET}) would let it run in the "
            "target type",
        )
    return Reason(
        QDQ_UNIT,
        f"one Q/DQ unit with {_names(ops)}: {blocker.label} ({blocker.op}) "
        f"{'meets a port pinned fp32' if blocker.id in pinned else 'computes in fp32'}, so the whole unit keeps "
        "its fp32 interface and no cast splits it",
    )


def _seed_unit(members: list, decided: set, result, seed: Seed, why: Reason) -> None:
    """Seed every member painting decides with `seed` and the unit's reason. A node already kept
    fp32 keeps its own seed (it is why the unit is fp32); a node forced low in an fp32 unit is
    overridden, with a warning: a cast inside the unit would undo the quantization."""
    for node in members:
        i = node.id
        if i not in decided:
            if seed == Seed.SCHEMA and (is_dq(node) or is_q(node)):
                result.reasons[i].append(why)  # its schema keeps it fp32; the unit says what that costs
            continue
        if seed == Seed.ALLOW and result.seeds[i] is None:
            result.seeds[i] = seed
        elif seed == Seed.SCHEMA and result.seeds[i] not in _FP32_SEEDS:
            if result.seeds[i] == Seed.ALLOW:
                result.warnings.append(
                    (
                        QDQ_UNIT,
                        f"node {node.label} ({node.op}) was forced low but stays fp32: {why.message}",
                        node.label,
                    )
                )
            result.seeds[i] = seed
        result.reasons[i].append(why)


def _names(ops: list) -> str:
    """A few words naming a unit's ops."""
    first = ops[0]
    more = f" and {len(ops) - 1} more op(s)" if len(ops) > 1 else ""
    return f"{first.label} ({first.op}){more}"


def _opset_warning(index: GraphIndex, kept: list) -> tuple:
    """The classification warning of units that keep their fp32 interface for their Q/DQ schemas."""
    ops = [n for group in kept for n in group]
    macs = sum(1 for n in ops if n.op in MAC_OPS)
    opset = index.opset("")
    gain = (
        f"--opset {QDQ_OPSET} (an explicit upgrade before conversion) would let their DequantizeLinear outputs, "
        f"{len(ops)} op(s) ({macs} MatMul/Gemm/Conv) and QuantizeLinear inputs run in the target type with fp16/bf16 "
        "scales"
    )
    if opset is not None and opset >= QDQ_OPSET:
        gain = "their DequantizeLinear/QuantizeLinear nodes are in a domain whose schema takes fp32 scales only"
    message = (
        f"{len(kept)} Q/DQ unit(s) keep their fp32 interface (DequantizeLinear/QuantizeLinear take fp16/bf16 scales "
        f"from opset {QDQ_OPSET}, the model has {opset}): no cast splits them, the float remainder between them "
        f"runs in the target type; {gain}"
    )
    return (QDQ_OPSET_WARNING, message, ops[0].label)
