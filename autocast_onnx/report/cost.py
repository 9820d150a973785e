"""Stage: report. What a plan costs and buys, without a GPU: the casts the conversion added and
the bytes they move per inference, and the share of MatMul/Gemm/Conv work (multiply-accumulates)
that runs in low precision. Shapes come from ONNX shape inference on the converted model, with
every symbolic dimension set to 1 (so figures are per unit of batch, sequence, ...); what has no
known shape is counted apart, never guessed. Inference on the model as it is (a model of 20,000
nodes takes well under a second)."""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

from ..dtypes import ITEMSIZE

LIMIT_NODES = 20_000  # above this, shape inference would cost as much as the conversion
MAC_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def _shapes(model: onnx.ModelProto, wanted: set) -> dict:
    """name -> (elem_type, shape tuple or None) for the `wanted` tensors of the main graph; the
    model's own dimension names count as 1."""
    try:
        probe = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is best effort: unknown shapes are reported as unknown
        probe = model
    out: dict[str, tuple] = {}
    # the model's own dimension names (batch, sequence) count as 1; names inference makes up for
    # dimensions it could not work out (unk__0, ...) leave the shape unknown
    named = {d.dim_param for vi in list(model.graph.input) + list(model.graph.output)
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}  # fmt: skip
    for t in probe.graph.initializer:
        if t.name in wanted:
            out[t.name] = (t.data_type, tuple(t.dims))
    for infos in (probe.graph.input, probe.graph.value_info, probe.graph.output):
        for vi in infos:
            if vi.name not in wanted:
                continue
            tt = vi.type.tensor_type
            dims = list(tt.shape.dim) if tt.HasField("shape") else []
            known = tt.HasField("shape") and all(d.HasField("dim_value") or d.dim_param in named for d in dims)
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims) if known else None
            out[vi.name] = (tt.elem_type, shape)
    return out


def _macs(node, shapes) -> int | None:
    def shape(i):
        if i >= len(node.input) or not node.input[i]:
            return None
        return shapes.get(node.input[i], (None, None))[1]

    a, b = shape(0), shape(1)
    out = shapes.get(node.output[0], (None, None))[1] if node.output else None
    if a is None or b is None:
        return None
    if node.op_type == "MatMul" and len(a) >= 1 and len(b) >= 1 and out is not None:
        k = a[-1]
        return math.prod(out) * k
    if node.op_type == "Gemm" and len(a) == 2 and len(b) == 2:
        trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
        trans_b = next((x.i for x in node.attribute if x.name == "transB"), 0)
        m, k = (a[1], a[0]) if trans_a else a
        n = b[0] if trans_b else b[1]
        return m * k * n
    if node.op_type == "Conv" and out is not None and len(b) >= 2:
        return math.prod(out) * math.prod(b[1:])
    if node.op_type == "ConvTranspose" and len(a) >= 2 and len(b) >= 2:
        return math.prod(a) * math.prod(b[1:])
    return None


def conversion_cost(result) -> dict:
    """Casts added and bytes they move, and the low-precision share of MACs, for a
    ConversionResult (main graph)."""
    model = result.model
    if len(model.graph.node) > LIMIT_NODES:
        return {"computed": False, "why": f"over {LIMIT_NODES:,} nodes: shape inference would double the time"}
    added = set(result.stats.cast_outputs)
    casts = [n for n in model.graph.node if n.op_type == "Cast" and n.output and n.output[0] in added]
    macs_nodes = [n for n in model.graph.node if n.op_type in MAC_OPS]
    wanted = {n.input[0] for n in casts} | {t for n in macs_nodes for t in list(n.input[:2]) + list(n.output[:1])}
    shapes = _shapes(model, wanted)
    cast_bytes, unknown_casts = 0, 0
    for node in casts:
        src = shapes.get(node.input[0], (None, None))
        dst_type = next((a.i for a in node.attribute if a.name == "to"), None)
        if src[1] is None or src[0] not in ITEMSIZE or dst_type not in ITEMSIZE:
            unknown_casts += 1
            continue
        cast_bytes += math.prod(src[1]) * (ITEMSIZE[src[0]] + ITEMSIZE[dst_type])
    macs_low = macs_total = 0
    unknown_macs = 0
    for node in macs_nodes:
        macs = _macs(node, shapes)
        if macs is None:
            unknown_macs += 1
            continue
        macs_total += macs
        if shapes.get(node.output[0], (None, None))[0] in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            macs_low += macs
    return {
        "computed": True,
        "casts": len(casts),
        "cast_bytes": cast_bytes,
        "casts_unknown_size": unknown_casts,
        "macs": macs_total,
        "macs_low_precision": macs_low,
        "mac_nodes_unknown_shape": unknown_macs,
        "symbolic_dims": 1,
    }


def cost_line(cost: dict) -> str:
    if not cost.get("computed"):
        return f"cast and compute cost: not computed ({cost.get('why')})"

    def size(n: int) -> str:
        for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
            if n >= scale:
                return f"{n / scale:.2f} {unit}"
        return f"{n} B"

    share = f"{cost['macs_low_precision'] / cost['macs'] * 100:.1f}%" if cost["macs"] else "n/a"
    unknown = []
    if cost["casts_unknown_size"]:
        unknown.append(f"{cost['casts_unknown_size']} casts")
    if cost["mac_nodes_unknown_shape"]:
        unknown.append(f"{cost['mac_nodes_unknown_shape']} MatMul/Gemm/Conv")
    tail = f"; shapes unknown for {', '.join(unknown)}" if unknown else ""
    return (
        f"cast traffic: {cost['casts']} casts move {size(cost['cast_bytes'])} per inference; "
        f"low-precision share of MatMul/Gemm/Conv work: {share} of {cost['macs']:,} MACs "
        f"(symbolic dims = 1{tail})"
    )
