"""Stage: report. What a plan costs and buys, without a GPU: the casts the conversion added and
the bytes they move per inference, and the share of MatMul/Gemm/Conv work (multiply-accumulates)
that runs in low precision. Shapes and MACs come from graph/shapes.py (one ONNX shape inference
on a weightless copy of the input, shared with the output-head rule), with the open dimensions of
the model's inputs at the sizes validation generates; what has no known shape is counted apart,
never guessed, and a count that is unknown is said to be unknown, never printed as 0."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..dtypes import BFLOAT16, FLOAT16, ITEMSIZE
from ..graph.shapes import LIMIT_NODES

LOW_PRECISIONS = frozenset({"fp16", "bf16"})
LOW_TYPES = frozenset({FLOAT16, BFLOAT16})


def conversion_cost(shapes: Mapping | None, macs: list | None, nodes, cast_outputs, precisions) -> dict:
    """Casts added and bytes they move, and the low-precision share of MACs, of a conversion's
    main graph: `shapes` (tensor name -> (elem type, shape)) and `macs` ((node id, MACs, the
    element type the node computes in before the conversion) per MatMul/Gemm/Conv) as inferred on
    its input, both None when not computed; `nodes` the converted main graph's NodeProtos,
    `cast_outputs` the outputs of the casts the conversion added, `precisions` the plan's
    precision per node id. A node the plan leaves `unchanged` counts as low precision when it
    already computed in fp16/bf16 (a model whose MatMuls an earlier tool converted). A cast on a
    renamed graph output is looked up by its output."""
    if shapes is None or macs is None:
        return {"computed": False, "why": f"over {LIMIT_NODES:,} nodes: shape inference would double the time"}
    added = set(cast_outputs)
    casts = [n for n in nodes if n.op_type == "Cast" and n.output and n.output[0] in added]
    cast_bytes, unknown_casts = 0, 0
    for node in casts:
        src_type, shape = shapes.get(node.input[0], shapes.get(node.output[0], (None, None)))
        dst_type = next((a.i for a in node.attribute if a.name == "to"), -1)
        size, read = ITEMSIZE.get(dst_type), ITEMSIZE.get(src_type) if node.input[0] in shapes else None
        if shape is None or size not in (2, 4):
            unknown_casts += 1
            continue
        # each value read in its type and written in the other: fp32 <-> fp16/bf16 moves 4 + 2
        # bytes (a cast on a renamed graph output, looked up by its output, is taken as that)
        cast_bytes += math.prod(shape) * (size + (read if read in (2, 4) else 6 - size))
    macs_low = macs_total = unknown_macs = 0
    for node_id, count, elem_type in macs:
        if count is None:
            unknown_macs += 1
            continue
        macs_total += count
        precision = precisions[node_id]  # the compact list: no plan entries built
        if precision in LOW_PRECISIONS or (precision == "unchanged" and elem_type in LOW_TYPES):
            macs_low += count
    return {
        "computed": True,
        "casts": len(casts),
        "cast_bytes": cast_bytes,
        "casts_unknown_size": unknown_casts,
        "mac_nodes": len(macs),
        "macs": macs_total,
        "macs_low_precision": macs_low,
        "mac_nodes_unknown_shape": unknown_macs,
        "open_dims": dict(getattr(shapes, "open_dims", {})),
        "dims_chosen": bool(getattr(shapes, "chosen", False)),  # --dim named them
    }


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _casts_part(cost: dict) -> str:
    """How many casts were added and the bytes they move: 'at least' when some have no known
    size, no byte figure when none has."""
    count, unknown = cost["casts"], cost["casts_unknown_size"]
    if not count:
        return "no casts added"
    if unknown == count:
        return f"{count} casts move an unknown number of bytes (no shape known)"
    if unknown:
        return f"{count} casts move at least {_size(cost['cast_bytes'])} per inference ({unknown} of unknown size)"
    return f"{count} casts move {_size(cost['cast_bytes'])} per inference"


def _work_part(cost: dict) -> str:
    """The low-precision share of the MatMul/Gemm/Conv work, of the nodes whose shapes are known;
    no percentage where no work is known."""
    nodes, unknown, total = cost.get("mac_nodes", 0), cost["mac_nodes_unknown_shape"], cost["macs"]
    head = "low-precision share of MatMul/Gemm/Conv work: "
    if not nodes:
        return "no MatMul/Gemm/Conv work"
    if unknown == nodes:
        return head + f"unknown (no shape known for any of the {nodes} MatMul/Gemm/Conv)"
    if not total:
        return head + "n/a (their tensors are empty)"
    share = f"{cost['macs_low_precision'] / total * 100:.1f}% of {total:,} MACs"
    if unknown:
        share += f" (of the {nodes - unknown} of {nodes} MatMul/Gemm/Conv whose shapes are known)"
    return head + share


def cost_line(cost: dict) -> str:
    """The summary's cost line: casts, bytes, the low-precision share of the work, and the sizes
    the model's open input dimensions took."""
    if not cost.get("computed"):
        return f"cast and compute cost: not computed ({cost.get('why')})"
    line = f"cast traffic: {_casts_part(cost)}; {_work_part(cost)}"
    dims = cost.get("open_dims") or {}
    if dims:
        shown = [f"{name}={size}" for name, size in list(dims.items())[:4]]
        more = f", ... ({len(dims)} in all)" if len(dims) > 4 else ""
        whose = "--dim gives" if cost.get("dims_chosen") else "validate generates"
        line += f" (open input dims at the sizes {whose}: {', '.join(shown)}{more})"
    return line
