"""Stage: paint, pass 6. No Cast that changes no number: a node the categories keep fp32 whose
runtime kernel computes in fp32 anyway runs at low-precision inputs and outputs.

A keep_fp32 op (Softmax, LayerNormalization, ReduceSum, Exp, ...) kept fp32 between two
low-precision neighbours gets a Cast up on each input and a Cast down on each output. Where the
runtime's kernel for the op at the low type converts its inputs to float, computes in float and
rounds each output once (catalog/compute.py, from the runtime's sources), the node at low
precision computes exactly what the fp32 node between its Casts computes:

    MatMul(fp16) -> Cast(fp32) -> Softmax(fp32) -> Cast(fp16) -> MatMul(fp16)
    MatMul(fp16) -> Softmax(fp16: float math, one rounding)   -> MatMul(fp16)

its inputs were already low precision, and its outputs are rounded to the low type at the Cast
back. So such a node is planned low, with its own reason (`kernel-fp32`), when

  - it is kept fp32 by its category alone (no rule, selection, data rule, calibration, search,
    schema limit, missing kernel or Q/DQ unit seeded it: those keep it fp32 for a reason of
    their own);
  - every float input it reads (a port that follows its precision) is low precision already in
    the plan: made by a node planned low, a model input of the low type, or a constant whose
    values the low type holds exactly (so converting it changes no number either);
  - every reader of its float outputs reads them at low precision (a node planned low at a port
    that follows it), and none is a graph output that keeps its type;
  - the runtime planned for (None: the design's, ONNX Runtime's CUDA provider) registers a kernel
    for it at the low type and the model's opset, and computes it in float with one rounding.

A clear op (Reshape, Transpose, ...) between the node and its readers is fp32 only because the
node's fp32 flows through it; it moves values without arithmetic, so the readers beyond it are the
ones judged, and it runs low with the node. A region of several fp32 nodes that compute is judged
node by node, so it stays fp32 (Softmax -> Softmax: lowering the first would round the tensor
between them); a region qualifies as a whole only where the runtime fuses it into one kernel that
computes in float, which the fact table records as the fused op's own row. The passes run again
after each round, until a round lowers nothing: lowering a node only removes fp32 seeds, so no
qualified node is ever disqualified."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from ..catalog.compute import ComputeFact, computes_in_fp32
from ..dtypes import BFLOAT16, FLOAT, FLOAT16, ITEMSIZE, dtype_name
from ..graph import GraphIndex
from .classify import _missing_kernel
from .model import Reason
from .ranges import Bounds, float_constant, judge
from .vocab import Category, Paint, PortRole

_LOW, _FP32 = Paint.LOW.value, Paint.FP32.value
_FOLLOW = PortRole.FOLLOW.value
_READS = PortRole.FOLLOW + PortRole.ANY
EXACT_CHECK_LIMIT = 1 << 20  # elements: a larger constant is not converted to see whether it is exact
CODE = "kernel-fp32"

Facts = Callable[[str | None, str, str, int], ComputeFact | None]


def lowerable(
    index: GraphIndex,
    paint: list,
    cause: list,
    classification,
    low_type: int,
    graph_keeps: Callable,
    runtime: str | None,
    shapes: Mapping | None = None,
    facts: Facts = computes_in_fp32,
) -> dict[int, Reason]:
    """The fp32 nodes of the painted plan (`paint`: Paint codes per node id; `cause`: the painter's
    cause per node) that qualify (see the module's text), each with its reason.
    `graph_keeps(value)`: whether a graph output that `value` fills keeps its type
    (keep_io_types, --low-precision-io)."""
    if runtime == "any":
        return {}
    c = classification
    found: dict[int, Reason] = {}
    kernels: dict = {}
    for node in index.nodes:
        i = node.id
        if not _kept_by_category(i, paint, c):
            continue
        fact = facts(runtime, node.domain, node.op, low_type)
        if fact is None or not fact.fp32_once or _other_path(node, shapes, any_rows=True):
            continue
        if not _inputs_low(node, paint, c.roles_in[i], low_type):
            continue
        if not _readers_low(node, paint, cause, c, graph_keeps, low_type):
            continue
        if _has_low_kernel(kernels, index, node, c, runtime or "cuda", low_type):
            found[i] = _reason(node, fact, c.roles_in[i], c.roles_out[i], low_type, shapes)
    return found


def _kept_by_category(i: int, paint: list, c) -> bool:
    """Whether node i is fp32 for its keep_fp32 category alone (no seed: range, rule, head; not frozen)."""
    return paint[i] == _FP32 and c.categories[i] == Category.KEEP_FP32 and c.seeds[i] is None and not c.frozen[i]


def _has_low_kernel(kernels: dict, index: GraphIndex, node, c, runtime: str, low_type: int) -> bool:
    """Whether `runtime` has a kernel for the node with its float ports low, once per op and roles
    (`kernels`: the answers so far)."""
    key = (node.domain, node.op, c.roles_in[node.id], c.roles_out[node.id])
    if key not in kernels:
        kernels[key] = _missing_kernel(index, node, runtime, low_type, key[2:])
    return kernels[key] is None


SOFTMAX_ROWS = (1024, 2048, 8192)  # ONNX Runtime's softmax rounds intermediates at 1024 < D <= 2048 and N >= 8192


def _other_path(node, shapes, any_rows: bool = False) -> bool:
    """Whether the kernel would take a path other than its general one at the sizes known (the
    shapes inferred at validation's sizes): ONNX Runtime's CUDA Softmax and LogSoftmax round
    intermediates on rows of 1025 to 2048 elements in batches of 8192 rows or more
    (data/compute_cuda.json, `conditions`). Unknown sizes take the general path. With `any_rows`,
    rows of that width count whatever their number: validate's emulation takes the rounding path
    for every such row (validate/emulate_steps.py), so pass 6's bit-identity holds only without them."""
    if node.op not in ("Softmax", "LogSoftmax") or shapes is None or not node.inputs or node.inputs[0] is None:
        return False
    shape = shapes.get(node.inputs[0].name, (None, None))[1]
    if not shape:
        return False
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), -1)
    width = shape[axis % len(shape)]
    low, high, rows = SOFTMAX_ROWS
    if any_rows:
        return isinstance(width, int) and low < width <= high
    return low < width <= high and math.prod(shape) // max(width, 1) >= rows


def _inputs_low(node, paint: list, roles: str, low_type: int, exact: bool = True) -> bool:
    """Whether every float input that follows the node's precision is low precision already (a
    constant: one the low type holds exactly; with `exact` False, any constant, which the rewrite
    converts and the data rules have checked for range)."""
    seen = False
    for port, value in enumerate(node.inputs):
        if value is None or roles[port] != _FOLLOW:
            continue
        seen = True
        producer = value.producer
        if producer is not None and producer.op != "Constant":
            if paint[producer.id] != _LOW:
                return False
        elif value.kind == "input":  # the caller's values (an initializer only their default)
            if value.dtype != low_type:
                return False
        elif exact and not _exact_constant(value, low_type):
            return False
    return seen


def _exact_constant(value, low_type: int) -> bool:
    """Whether `value` is a constant whose every value the low type holds exactly (its conversion
    changes no number): a LayerNormalization's scale of ones and bias of zeros, say."""
    if value.dtype == low_type:
        return True
    array = float_constant(value, EXACT_CHECK_LIMIT)
    if array is None:
        return False
    return bool(np.array_equal(_rounded(array, low_type), array))


def _rounded(array: np.ndarray, low_type: int) -> np.ndarray:
    """`array` rounded to the low type (nearest, ties to even) and back to float32."""
    if low_type == FLOAT16:
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    if low_type == BFLOAT16:
        bits = array.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return rounded.astype(np.uint32).view(np.float32)
    return array


def _readers_low(node, paint: list, cause: list, c, graph_keeps: Callable, low_type: int, depth: int = 0) -> bool:
    """Whether every reader of the node's float outputs reads them at low precision, and at least
    one does, looking through the clear ops that are fp32 only by the node's own taint; a graph
    output that keeps its type disqualifies. A Cast to the low type reads at low precision too
    (what a first conversion leaves after such a node: a second one judges it alike)."""
    roles_out = c.roles_out[node.id]
    seen = False
    for k, value in enumerate(node.outputs):
        if value is None or roles_out[k] != _FOLLOW:
            continue
        if value.graph_outputs:
            if graph_keeps(value):
                return False
            seen = True  # a model output of the low type (--no-keep-io-types, --low-precision-io)
        for consumer, port in value.consumers:
            j = consumer.id
            if _casts_to(consumer, low_type):
                seen = True
                continue
            if c.roles_in[j][port] not in _READS:
                return False
            if paint[j] != _LOW:
                if depth >= LOOK_THROUGH or not _tainted_clear(j, paint, cause, c):
                    return False
                if not _readers_low(consumer, paint, cause, c, graph_keeps, low_type, depth + 1):
                    return False
            seen = True
    return seen


LOOK_THROUGH = 8  # clear ops followed from a node to its readers


def _casts_to(node, low_type: int) -> bool:
    """Whether `node` is an ONNX Cast to the low type."""
    if node.op != "Cast" or node.domain != "":
        return False
    return any(a.name == "to" and a.i == low_type for a in node.proto.attribute)


def _tainted_clear(j: int, paint: list, cause: list, c) -> bool:
    """Whether node `j` is a clear op that is fp32 only because fp32 flowed into it."""
    why = cause[j]
    return (
        paint[j] == _FP32
        and c.categories[j] == Category.CLEAR
        and c.seeds[j] is None
        and not c.frozen[j]
        and why.__class__ is tuple
        and why[0] == "fp32-taint"
    )


def _reason(node, fact: ComputeFact, roles_in: str, roles_out: str, low_type: int, shapes) -> Reason:
    """The plan's reason: what the kernel does, where that is read, and the Cast bytes saved."""
    _, said = _saving(node, roles_in, roles_out, low_type, shapes)
    low = dtype_name(low_type)
    return Reason(
        CODE,
        f"{fact.label}'s {node.op} kernel computes in fp32 and rounds its outputs once ({fact.source}); its inputs "
        f"are {low} already and its readers read {low}: kept fp32 it would compute the same numbers between Casts, "
        f"so it runs at {low} inputs and outputs, saving {said}",
    )


def _saving(node, roles_in: str, roles_out: str, low_type: int, shapes) -> tuple[int | None, str]:
    """The Cast bytes a node at low-precision I/O saves (None where a shape is unknown), and how a
    reason says it."""
    ports = [v for v, r in zip(node.inputs, roles_in) if v is not None and r == _FOLLOW]
    ports += [v for v, r in zip(node.outputs, roles_out) if v is not None and r == _FOLLOW]
    saved = _cast_bytes(ports, low_type, shapes)
    return saved, f"{saved:,} bytes of Casts per inference" if saved is not None else f"{len(ports)} Cast(s)"


def _cast_bytes(values, low_type: int, shapes) -> int | None:
    """Bytes the Casts on `values` would move (each element read in one type, written in the other);
    None where a shape is not known."""
    if shapes is None:
        return None
    total = 0
    per = ITEMSIZE[FLOAT] + ITEMSIZE[low_type]
    for value in values:
        if value.initializer is not None:
            continue  # a constant is converted once, in the file: no Cast at run time
        shape = shapes.get(value.name, (None, None))[1]
        if shape is None:
            return None
        total += math.prod(shape) * per
    return total


# ---- the fast plan ------------------------------------------------------------------------------
# Ops whose kernel computes in fp32 and whose outputs stay within the range of their inputs (or a
# fixed range): run low together with their neighbours, the stream they sit on goes low too, which
# changes numbers (the residual stream of a transformer, the activations of a GELU) by the low
# type's rounding, as every all-fp16 conversion does, but overflows nothing that was in range. Ops
# whose outputs grow (Exp, Pow, sums: ReduceSum, ReduceL2, ReduceProd) are left to the conservative
# rounds, which lower them only where no number changes. Sin and Cos are left out too: their inputs
# are angles (rotary embeddings), which fp16 cannot hold at large positions.
FAST_OPS = frozenset(
    {("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"), ("", "RMSNormalization"),
     ("com.microsoft", "SimplifiedLayerNormalization"), ("com.microsoft", "GroupNorm"),
     ("", "Softmax"), ("", "LogSoftmax"), ("com.microsoft", "BiasSoftmax"), ("", "Erf"), ("", "Tanh"),
     ("", "Sigmoid"), ("", "Gelu"), ("com.microsoft", "Gelu"), ("", "ReduceMax"), ("", "ReduceMin"),
     ("", "Sqrt")}
)  # fmt: skip
FAST_CODE = "fast-plan"
FAST_RUNTIMES = ("cuda",)  # TensorRT: NVIDIA advises fp32 normalizations; DirectML: no fusion to keep
# fp16 only: bf16 keeps 8 bits of mantissa, so a bf16 residual stream rounds 8 times as coarsely
# (bert_tiny's emulated error rose from 2.2e-4 to 9.5e-3 with it, against 2.2e-5 to 1.4e-3 at fp16)


def fast_candidates(
    index: GraphIndex,
    paint: list,
    classification,
    low_type: int,
    graph_keeps: Callable,
    runtime: str,
    shapes: Mapping | None = None,
    facts: Facts = computes_in_fp32,
) -> dict[int, Reason]:
    """The keep_fp32 nodes the fast plan tries low at once (FAST_OPS whose `runtime` kernel
    computes in fp32 and rounds once, unseeded, writing no graph output that keeps its type),
    each with its reason; the caller keeps those that still qualify once all are painted low
    (`still_low`)."""
    if runtime not in FAST_RUNTIMES or low_type != FLOAT16:
        return {}
    c = classification
    found: dict[int, Reason] = {}
    kernels: dict = {}
    bounds = Bounds(index, shapes)
    for node in index.nodes:
        i = node.id
        if not _kept_by_category(i, paint, c):
            continue
        taken, verdict = _fast_op(node, bounds, low_type)
        if not taken:
            continue
        fact = facts(runtime, node.domain, node.op, low_type)
        if fact is None or not fact.fp32_once:
            continue
        efficient = _other_path(node, shapes, any_rows=True)
        if efficient and not (node.op == "Softmax" and node.domain == "" and (index.opset("") or 0) >= 13):
            continue
        if any(v is not None and v.graph_outputs and graph_keeps(v) for v in node.outputs):
            continue
        if any(_guarded(v) for v in node.inputs):
            continue  # the author's Cast to float guards it: the model asks for this input in fp32
        if _has_low_kernel(kernels, index, node, c, runtime, low_type):
            why = _fast_reason(node, fact, c.roles_in[i], c.roles_out[i], low_type, shapes, efficient)
            if verdict is not None:
                why.message += f"; its outputs stay within {dtype_name(low_type)}: {_bound_text(node, verdict)}"
            found[i] = why
    return found


def _fast_op(node, bounds: Bounds, low_type: int):
    """(whether the node's op may join the fast plan, the range verdict that let it where one did):
    FAST_OPS always, the ops of plan/ranges.py where the graph bounds their outputs
    (or a Pow whose overflow a saturating op absorbs)."""
    verdict = judge(node, bounds, low_type)
    if verdict is None:
        key = (node.domain, node.op)
        return key in FAST_OPS, None
    return verdict.fits or _saturating_pow(node), verdict


def _fused_into(node, low_type: int) -> str:
    """For a LayerNormalization that reads an Add: the words saying that ONNX Runtime's CUDA optimizer fuses the
    two into SkipLayerNormalization, whose default kernel computes in the low type at the compute table's commit."""
    producer = node.inputs[0].producer if node.inputs and node.inputs[0] is not None else None
    if node.op != "LayerNormalization" or node.domain != "" or producer is None or producer.op != "Add":
        return ""
    low = dtype_name(low_type)
    return (
        f" - but ONNX Runtime fuses it with {producer.label} (Add) into SkipLayerNormalization, whose default CUDA "
        f"kernel at the table's commit sums, normalises and rounds in {low} (float with "
        "enable_skip_layer_norm_strict_mode, and by default after onnxruntime PR #28682); validate's emulation "
        "takes LayerNormalization's float kernel here (docs/validate.md)"
    )


def _bound_text(node, verdict) -> str:
    if not verdict.fits:  # a Pow inside a saturating op (GELU's tanh form)
        return f"{verdict.text}, but it feeds a Tanh, Erf or Sigmoid, which turns an inf into what a finite one gives"
    return f"{verdict.text} (bounded from the graph, plan/ranges.py)"


SATURATING = frozenset({"Tanh", "Erf", "Sigmoid"})
AFFINE = frozenset({"Mul", "Add", "Sub", "Div"})
SATURATING_DEPTH = 4  # affine steps from the Pow to the saturating op


def _saturating_pow(node) -> bool:
    """Whether `node` is a Pow whose one output reaches, through a chain of Mul/Add/Sub/Div (one
    reader each), a Tanh, Erf or Sigmoid: GELU's tanh form, x + 0.044715 * x**3 inside a tanh.
    Overflow there is harmless: a power beyond the low type's range becomes +-inf, and the
    saturating op turns it into the +-1 (or 0/1) that the finite value gives."""
    if node.op != "Pow" or node.domain != "" or len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    value = node.outputs[0]
    for _ in range(SATURATING_DEPTH + 1):
        if value.graph_outputs or len(value.consumers) != 1:
            return False
        consumer = value.consumers[0][0]
        if consumer.domain != "":
            return False
        if consumer.op in SATURATING:
            return True
        if consumer.op not in AFFINE or len(consumer.outputs) != 1 or consumer.outputs[0] is None:
            return False
        value = consumer.outputs[0]
    return False


def _guarded(value) -> bool:
    """Whether `value` is written by a Cast to float (an author's guard before an fp32 op)."""
    producer = value.producer if value is not None else None
    if producer is None or producer.op != "Cast" or producer.domain != "":
        return False
    return any(a.name == "to" and a.i == FLOAT for a in producer.proto.attribute)


def still_low(
    index: GraphIndex, ids, paint: list, cause: list, classification, low_type: int, graph_keeps, cone=frozenset()
) -> set:
    """The nodes of `ids` (painted low) whose readers all read low and whose float inputs may be
    cast to low precision (_inputs_castable), in the painting given. A node of an upstream cone
    (`upstream`; their ids in `cone`) holds while every reader of it reads low."""
    c = classification
    out = set()
    for i in ids:
        node = index.nodes[i]
        if i in cone:
            if _readers_low(node, paint, cause, c, graph_keeps, low_type):
                out.add(i)
        elif _inputs_castable(node, paint, c, low_type) and _readers_low(node, paint, cause, c, graph_keeps, low_type):
            out.add(i)
    return out


CONE_LIMIT = 64  # nodes of one upstream cone


def upstream(index: GraphIndex, chosen: Mapping, paint: list, c, low_type: int) -> dict[int, Reason]:
    """The fp32 nodes upstream of the fast plan's nodes, or of nodes already low, that are fp32
    only because nothing low fed them (unseeded follow and clear nodes: an embedding sum of
    Gathers from fp32 tables, an attention mask's Where between constants), when every float
    input of the region is a constant that fits the low type (an attention-mask sentinel counts:
    it is stored as its sentinel) or is low already, and every reader of it is a fast-plan node or
    low: the region runs low too, its constants stored low, so no Cast sits between it and the node
    it feeds (the Add of a SkipLayerNormalization fusion, the mask Add of an Attention fusion)."""
    found: dict[int, Reason] = {}
    members = set(chosen)  # the fast plan's nodes and the regions found so far, one set for all
    refused: set = set()  # region tops already tried and refused (each is tried once: linear)
    starts = list(chosen) + [i for i, p in enumerate(paint) if p == _LOW]
    for i in starts:
        node = index.nodes[i]
        for port, value in enumerate(node.inputs):
            if value is None or c.roles_in[i][port] != _FOLLOW or value.producer is None:
                continue
            top = value.producer.id
            if top in found or top in refused:
                continue
            cone = _cone(value.producer, paint, c, low_type, members)
            if cone is None:
                refused.add(top)
                continue
            members |= cone
            for j in cone:
                found[j] = _cone_reason(index.nodes[j], node, low_type)
    return found


def _cone(start, paint: list, c, low_type: int, low_ids: set) -> set | None:
    """The region above `start` (ids), or None when it does not qualify (see `upstream`)."""
    if not _open_fp32(start.id, start, paint, c):
        return None
    cone, todo, nodes = set(), [start], []
    while todo:
        node = todo.pop()
        if node.id in cone:
            continue
        cone.add(node.id)
        nodes.append(node)
        if len(cone) > CONE_LIMIT:
            return None
        for port, value in enumerate(node.inputs):
            if value is None or c.roles_in[node.id][port] != _FOLLOW:
                continue
            producer = value.producer
            if producer is None or producer.op == "Constant":
                if value.kind == "input" and value.dtype != low_type:
                    return None
                if value.kind != "input" and value.name not in c.sentinels and not _constant_fits(value, low_type):
                    return None
            elif paint[producer.id] != _LOW:
                if not _open_fp32(producer.id, producer, paint, c):
                    return None
                todo.append(producer)
    if not all(_read_within(node, c, paint, cone, low_ids) for node in nodes):
        return None
    return cone


def _open_fp32(j: int, node, paint: list, c) -> bool:
    """Whether node j is fp32 only because nothing low fed it."""
    return (
        paint[j] in (_FP32, Paint.UNDECIDED.value)
        and c.seeds[j] is None
        and not c.frozen[j]
        and c.categories[j] in (Category.FOLLOW, Category.CLEAR)
        and node.domain == ""
    )


def _read_within(node, c, paint: list, cone: set, members: set) -> bool:
    """Whether every reader of the node's float outputs is a member of the region or low (a reader
    of its shape only, any), and none of them is a graph output."""
    for k, value in enumerate(node.outputs):
        if value is None or c.roles_out[node.id][k] != _FOLLOW:
            continue
        if value.graph_outputs:
            return False
        for consumer, port in value.consumers:
            if consumer.id in cone or consumer.id in members or paint[consumer.id] == _LOW:
                continue
            if c.roles_in[consumer.id][port] in (_FOLLOW, PortRole.FP32.value):
                return False
    return True


def _cone_reason(node, fed, low_type: int) -> Reason:
    low = dtype_name(low_type)
    return Reason(
        FAST_CODE,
        f"fp32 only because nothing {low} fed it, it feeds {fed.op} {fed.label}, which runs {low} (the fast plan): it "
        f"runs {low} with it, its constants stored in {low} (each fits, or is an attention mask's sentinel), so no "
        "Cast sits between them and the runtime's fusion of the two stays whole; --precise keeps it fp32",
        value=0.0,  # no Cast of its own: the one it saves is counted at the node it feeds
    )


def _inputs_castable(node, paint: list, c, low_type: int) -> bool:
    """Whether every float input that follows the node is low already, a constant (converted as
    every reader of it is; a model input only when it is of the low type), or fp32 only because
    nothing low fed it (a follow or
    clear node, unseeded: an embedding sum, say): a Cast into the node then rounds what an
    all-low conversion rounds. An input kept fp32 for a reason (its range, a rule, the output
    head) is not cast: the node stays fp32."""
    for port, value in enumerate(node.inputs):
        if value is None or c.roles_in[node.id][port] != _FOLLOW:
            continue
        producer = value.producer
        if producer is None:
            if value.kind == "input" and value.dtype != low_type:
                return False  # the caller's values, of a range nothing has checked: not cast down here
            if value.kind != "input" and not _constant_fits(value, low_type):
                return False
            continue
        if producer.op == "Constant":
            if not _constant_fits(value, low_type):
                return False
            continue
        if paint[producer.id] == _LOW:
            continue
        j = producer.id
        if c.seeds[j] is not None or c.frozen[j] or c.categories[j] not in (Category.FOLLOW, Category.CLEAR):
            return False
    return True


def _constant_fits(value, low_type: int) -> bool:
    """Whether a constant's finite values all stay finite in the low type (a LayerNormalization
    scale of 1e5 would become inf in fp16): one that does not, or cannot be read here, keeps the
    node fp32."""
    if value.dtype == low_type:
        return True
    array = float_constant(value, FIT_CHECK_LIMIT)
    if array is None:
        return False
    finite = array[np.isfinite(array)]
    return finite.size == 0 or bool(np.all(np.isfinite(_rounded(np.array([finite.min(), finite.max()]), low_type))))


FIT_CHECK_LIMIT = 1 << 26  # elements: a larger constant (256 MB of fp32) is not read to see whether it fits


def _fast_reason(
    node, fact: ComputeFact, roles_in: str, roles_out: str, low_type: int, shapes, efficient: bool = False
) -> Reason:
    saved, said = _saving(node, roles_in, roles_out, low_type, shapes)
    low = dtype_name(low_type)
    how = (
        f"computes in fp32 but, on rows of 1025 to 2048 like these, keeps the row in {low} (x - max and exp rounded, "
        "the output rounded again: three roundings of values in [0, 1], which validate's emulation takes step by step)"
        if efficient
        else "computes in fp32 and rounds its outputs once"
    )
    how += _fused_into(node, low_type)
    return Reason(
        FAST_CODE,
        f"{fact.label}'s {node.op} kernel {how} ({fact.source}), and its "
        f"neighbours run {low} with it (the fast plan): the tensors it reads and writes are stored in {low}, as an "
        f"all-{low} conversion stores them, saving {said} and keeping the runtime's fusions whole; --precise keeps it "
        "fp32 with the tensors around it",
        value=float(saved) if saved is not None else None,
    )
