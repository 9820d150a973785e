"""Stage: validate / quantized models. What of a Q/DQ model (QuantizeLinear/DequantizeLinear
pairs around the ops they quantize) stays int8, read two ways:

  * from the graph (`qdq_units`): the ops that read every float input straight from a
    DequantizeLinear (the units a runtime can fuse into one int8 kernel), and the nodes that
    sit between a Q/DQ node and its op (a Cast there breaks the unit: no runtime fuses it);
  * from ONNX Runtime (`fused_int8_ops`): the int8 operators (QLinearConv, QLinearMatMul,
    QGemm, ...) in the graph that its CPU optimizer writes (`SessionOptions.
    optimized_model_filepath`), which is where the CPU provider's QDQ fusions show.

Validation compares both between the reference and the converted model (`quantized_report`),
so a conversion that turned an int8 model into a float one says so. ONNX Runtime's CPU QDQ
fusions match fp32 scales only: a model whose Q/DQ scales are fp16 (opset 19 and later) runs
its units unfused on the CPU provider, and the report says that too (docs/quantized.md).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..dtypes import MIXABLE, dtype_name
from ..graph import build_index
from ..graph.domains import normalize_domain

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_QDQ_DOMAINS = frozenset({"", "com.microsoft"})  # after normalize_domain
# Integer operators ONNX Runtime fuses Q/DQ units into (besides every QLinear* op).
_FUSED_NAMED = frozenset(
    {
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "ConvInteger",
        "MatMulInteger",
        "MatMulNBits",
    }
)
LEVEL = "extended"  # ORT_ENABLE_EXTENDED: every QDQ fusion, none of the layout rewrites of ENABLE_ALL


def is_fused_int8(op_type: str, domain: str = "") -> bool:
    """Whether a node of ONNX Runtime's optimized graph is an integer kernel that a Q/DQ unit
    was fused into (QLinearConv, QLinearMatMul, QGemm, ... and MatMulNBits for 4-bit weights)."""
    return normalize_domain(domain) in _QDQ_DOMAINS and (op_type.startswith("QLinear") or op_type in _FUSED_NAMED)


def _graphs(graph: onnx.GraphProto):
    """`graph` and every body below it (If, Loop, Scan)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether any graph of the model holds a QuantizeLinear or DequantizeLinear node."""
    return any(node.op_type in QDQ_OPS for g in _graphs(model.graph) for node in g.node)


@dataclass(frozen=True)
class Fusion:
    """The fused int8 operators in ONNX Runtime's CPU-optimized graph of one model: op type ->
    count (None when it could not be measured, with `note` saying why)."""

    ops: dict | None
    note: str | None = None

    @property
    def total(self) -> int | None:
        return None if self.ops is None else sum(self.ops.values())


def fused_int8_ops(model: onnx.ModelProto | str | Path | bytes, level: str = LEVEL) -> Fusion:
    """Count the fused int8 operators in the graph ONNX Runtime's CPU provider runs for `model`
    (a ModelProto, serialized bytes or a path): the session writes its optimized graph to a
    temporary file (initializers beside it, so that a large model fits), which is read back
    without its weights. `level` is "basic", "extended" (every QDQ fusion) or "all"."""
    from . import runner

    rt = runner.ort()
    levels = {
        "basic": rt.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": rt.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": rt.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    with tempfile.TemporaryDirectory(prefix="autocast-fusion-") as tmp:
        out = Path(tmp) / "optimized.onnx"
        options = rt.SessionOptions()
        options.log_severity_level = runner.QUIET_SEVERITY
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = str(out)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            rt.InferenceSession(source if isinstance(source, bytes) else str(source), options, ["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types
            if not out.exists():
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return Fusion(None, f"ONNX Runtime's CPU provider did not optimize it: {first[:200]}")
        optimized = onnx.load(str(out), load_external_data=False)
    counts = Counter(n.op_type for g in _graphs(optimized.graph) for n in g.node if is_fused_int8(n.op_type, n.domain))
    return Fusion(dict(sorted(counts.items())))


def qdq_units(model: onnx.ModelProto, where: str = "<model>") -> dict:
    """The Q/DQ structure of a model, every graph included:

    `units`: op type -> count of the nodes (other than Q, DQ and Cast) with a float output that
    read every float input straight from a DequantizeLinear (`unit_nodes` names them);
    `weight_only`: op type -> count of the nodes that read only their weights so (every
    DequantizeLinear they read dequantizes a constant: weight-only quantization, which ONNX
    Runtime fuses into MatMulNBits);
    `quantized_outputs`: how many of those write every float output only into QuantizeLinear;
    `between`: the Casts between a Q/DQ node and its op (reading a DequantizeLinear's output,
    or feeding a QuantizeLinear), each {"node", "next_to"}: such a unit fuses nowhere;
    `scale_types`: the element types of the Q/DQ nodes' scales -> count of nodes."""
    index = build_index(model, where)
    units: Counter = Counter()
    weight_only: Counter = Counter()
    names, quantized_out, between = [], 0, []
    scales: Counter = Counter()
    for node in index.nodes:
        if node.op in QDQ_OPS:
            scale = node.inputs[1] if len(node.inputs) > 1 else None
            scales[dtype_name(scale.dtype if scale is not None else None)] += 1
            continue
        floats_in = [v for v in node.inputs if v is not None and v.dtype in MIXABLE]
        floats_out = [v for v in node.outputs if v is not None and v.dtype in MIXABLE]
        if node.op == "Cast":
            between.extend(_cast_between(node, floats_in, floats_out))
            continue
        if not floats_in or not floats_out or not all(_from_dq(v) for v in floats_in):
            dequantized = [v for v in floats_in if _from_dq(v)]
            if floats_out and dequantized and all(_constant(v.producer.inputs[0]) for v in dequantized):
                weight_only[node.op] += 1
            continue
        units[node.op] += 1
        names.append(node.name)
        if all(v.consumers and all(c.op == "QuantizeLinear" for c, _ in v.consumers) for v in floats_out):
            quantized_out += 1
    return {
        "dequantize": sum(1 for n in index.nodes if n.op == "DequantizeLinear"),
        "quantize": sum(1 for n in index.nodes if n.op == "QuantizeLinear"),
        "units": dict(sorted(units.items())),
        "unit_nodes": names,
        "weight_only": dict(sorted(weight_only.items())),
        "quantized_outputs": quantized_out,
        "between": between,
        "scale_types": dict(sorted(scales.items())),
    }


def _from_dq(value) -> bool:
    return value.producer is not None and value.producer.op == "DequantizeLinear"


def _constant(value) -> bool:
    """Whether a value is an initializer or a Constant's output (a quantized weight)."""
    return value is not None and (
        value.initializer is not None or (value.producer is not None and value.producer.op == "Constant")
    )


def _cast_between(node, floats_in: list, floats_out: list) -> list[dict]:
    """A Cast between a DequantizeLinear and a node it feeds, or between a node and the
    QuantizeLinear it feeds, as {"node": its name, "next_to": the Q/DQ node's name}; nothing for
    any other Cast. A Cast between a model input or output and its Q/DQ node (a converter's
    input and output casts) separates no op from its Q/DQ, so it is not one."""
    feeds_a_node = any(v.consumers for v in floats_out)
    fed_by_a_node = any(v.producer is not None for v in floats_in)
    found = [{"node": node.name, "next_to": v.producer.name} for v in floats_in if _from_dq(v) and feeds_a_node]
    found += [
        {"node": node.name, "next_to": c.name}
        for v in floats_out
        for c, _ in v.consumers
        if c.op == "QuantizeLinear" and fed_by_a_node
    ]
    return found[:1]


def quantized_report(ref_model, ref_source, conv_model, conv_source, conv_where: str = "<converted>") -> dict:
    """The `quantized` section of a validation report, for a reference with Q/DQ nodes: both
    models' units (`qdq_units`), both models' fused int8 operators on ONNX Runtime's CPU
    provider (`fused_int8_ops`; `*_source` is what the session loads: a path, or the model), and
    `notes`, one plain line per thing a reader must know: units broken, fusions lost, and why."""
    ref_units = qdq_units(ref_model, "<reference>")
    conv_units = qdq_units(conv_model, conv_where)
    ref_fused, conv_fused = fused_int8_ops(ref_source), fused_int8_ops(conv_source)
    return {
        "reference": ref_units,
        "converted": conv_units,
        "fusion": {
            "provider": "CPUExecutionProvider",
            "level": LEVEL,
            "reference": ref_fused.ops,
            "converted": conv_fused.ops,
            "note": conv_fused.note or ref_fused.note,
        },
        "notes": _notes(ref_units, conv_units, ref_fused, conv_fused),
    }


def _notes(ref_units: dict, conv_units: dict, ref_fused: Fusion, conv_fused: Fusion) -> list[str]:
    """What changed for the int8 paths, one line each (nothing when nothing did)."""
    notes = []
    ref_n, conv_n = sum(ref_units["units"].values()), sum(conv_units["units"].values())
    if conv_n < ref_n:
        notes.append(
            f"{ref_n - conv_n} of the reference's {ref_n} int8 units no longer read DequantizeLinear directly "
            "in the converted model: they compute in float"
        )
    had = {b["node"] for b in ref_units["between"]}
    between = [b for b in conv_units["between"] if b["node"] not in had]
    if between:
        shown = ", ".join(f"{b['node']} (next to {b['next_to']})" for b in between[:3])
        notes.append(
            f"{len(between)} Cast(s) the reference does not have sit between a Q/DQ node and its op in the converted "
            f"model, which no runtime fuses into an int8 kernel: {shown}{', ...' if len(between) > 3 else ''}"
        )
    if ref_fused.total is not None and conv_fused.total is not None and conv_fused.total < ref_fused.total:
        low_scales = [t for t in conv_units["scale_types"] if t in ("fp16", "bf16")]
        why = (
            f": its QDQ fusions take fp32 scales only, and the converted model's Q/DQ scales are "
            f"{'/'.join(low_scales)}, so the CPU provider runs those units unfused, in float (a runtime that "
            "takes low-precision scales still fuses them; docs/quantized.md)"
            if low_scales
            else ""
        )
        notes.append(
            f"ONNX Runtime's CPU optimizer fuses {conv_fused.total} int8 operator(s) in the converted model, "
            f"{ref_fused.total} in the reference{why}"
        )
    return notes


def output_step_notes(model: onnx.ModelProto, outputs: list[dict]) -> list[str]:
    """For each compared output that the reference produces with a DequantizeLinear of one
    constant scale: its max abs error in quantization steps of that scale. An output given in
    steps cannot differ by less than one, so a one-step flip is the smallest change a
    conversion can make there (and it fails a relative tolerance below step / max |reference|)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    scales = {t.name: t for t in model.graph.initializer}
    notes = []
    for o in outputs:
        node = producers.get(o["name"])
        if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 2:
            continue
        scale = scales.get(node.input[1])
        if scale is None or len(scale.dims) != 0 or not o.get("elements"):
            continue
        step = float(onnx.numpy_helper.to_array(scale))
        if step > 0 and o["max_abs_error"]:
            notes.append(
                f"output {o['name']} is dequantized in steps of {step:.3g}: its max abs error is "
                f"{o['max_abs_error'] / step:.3g} step(s); a one-step change there is relative error "
                f"{step / max(o['max_abs_reference'], step):.3g} (--rtol {o['name']}=X sets its own limit)"
            )
    return notes
