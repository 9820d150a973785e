"""Stage: report. What a plan costs and buys, without a GPU: the casts the conversion added and
the bytes they move per inference, and the share of MatMul/Gemm/Conv work (multiply-accumulates)
that runs in low precision. Shapes and MACs come from graph/shapes.py (one ONNX shape inference
on a weightless copy of the input, shared with the output-head rule; every symbolic dimension
set to 1); what has no known shape is counted apart, never guessed."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..dtypes import ITEMSIZE
from ..graph.shapes import LIMIT_NODES


def conversion_cost(shapes: Mapping | None, macs: list | None, nodes, cast_outputs, precisions) -> dict:
    """Casts added and bytes they move, and the low-precision share of MACs, of a conversion's
    main graph: `shapes` (tensor name -> (elem type, shape)) and `macs` ((node id, MACs) per
    MatMul/Gemm/Conv) as inferred on its input, both None when not computed; `nodes` the
    converted main graph's NodeProtos, `cast_outputs` the outputs of the casts the conversion
    added, `precisions` the plan's precision per node id. A cast on a renamed graph output is
    looked up by its output."""
    if shapes is None or macs is None:
        return {"computed": False, "why": f"over {LIMIT_NODES:,} nodes: shape inference would double the time"}
    added = set(cast_outputs)
    casts = [n for n in nodes if n.op_type == "Cast" and n.output and n.output[0] in added]
    cast_bytes, unknown_casts = 0, 0
    for node in casts:
        shape = shapes.get(node.input[0], shapes.get(node.output[0], (None, None)))[1]
        dst_type = next((a.i for a in node.attribute if a.name == "to"), -1)
        size = ITEMSIZE.get(dst_type)
        if shape is None or size not in (2, 4):
            unknown_casts += 1
            continue
        cast_bytes += math.prod(shape) * 6  # the casts added move fp32 <-> fp16/bf16: 4 + 2 bytes
    low = {"fp16", "bf16"}
    macs_low = macs_total = unknown_macs = 0
    for node_id, count in macs:
        if count is None:
            unknown_macs += 1
            continue
        macs_total += count
        if precisions[node_id] in low:  # the compact list: no plan entries built
            macs_low += count
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
