"""Shapes and work of a model's main graph, without running it: one ONNX shape inference on a
weightless copy of the model, and the multiply-accumulates of each MatMul/Gemm/Conv from those
shapes. The copy's inputs take the sizes validation generates for the dimensions the model leaves
open (a named batch 3, a named sequence 16, any other name 8; an unnamed, -1 or 0 dimension 3 on
the first axis and 8 elsewhere: validate/inputs.py), so the figures describe the batch
`validate` runs and no -1 or 0 of an exporter's ever enters a product. What has no known shape
is None, never guessed. The conversion infers once and shares the result between the output-head
rule (classify) and the cost report (report/cost.py). A model of 10,000 nodes takes about 0.07 s;
over LIMIT_NODES nodes nothing is inferred."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import onnx

from ..io import all_graphs

LIMIT_NODES = 20_000  # above this, shape inference would cost as much as the conversion
MAC_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")

# The sizes validation generates for a dimension a model input leaves open (validate/inputs.py,
# tests/report/test_cost_dims.py holds the two to each other): by the dimension's name, else by axis.
BATCH_HINT = re.compile(r"batch|^n$|^b$", re.I)
SEQ_HINT = re.compile(r"seq|len|token|position|time|step", re.I)
DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_OTHER = 3, 16, 8

SMALL_INITIALIZER = 1024  # bytes: shape vectors and scalars keep their values for inference


def open_dim_size(name: str, axis: int) -> int:
    """The size validation generates for an open dimension of a model input: by its name
    (batch 3, sequence 16, other 8) or, unnamed, by its axis (3 on the first, 8 elsewhere)."""
    if name:
        return DEFAULT_BATCH if BATCH_HINT.search(name) else DEFAULT_SEQ if SEQ_HINT.search(name) else DEFAULT_OTHER
    return DEFAULT_BATCH if axis == 0 else DEFAULT_OTHER


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model for shape inference whose large initializers are typed graph inputs
    without data, so the weights are neither copied nor serialised again. An initializer that the
    model also lists as a graph input (IR 3) is declared once, with the initializer's dims."""
    graph = model.graph
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = graph.name
    heavy = {
        t.name for t in graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL or t.ByteSize() > SMALL_INITIALIZER
    }  # fmt: skip
    g.input.extend(vi for vi in graph.input if vi.name not in heavy)
    g.output.extend(graph.output)
    g.node.extend(graph.node)
    g.value_info.extend(graph.value_info)
    for t in graph.initializer:
        if t.name in heavy:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light


def _open(dim) -> bool:
    """A dimension that names no size: symbolic, absent, or the -1 or 0 some exporters write."""
    return not dim.HasField("dim_value") or dim.dim_value <= 0


def _fix_open_dims(probe: onnx.ModelProto, inputs: set, chosen: Mapping[str, int] | None = None) -> dict[str, int]:
    """Give each open dimension of the probe's model inputs (`inputs`: their names) the size
    validation generates, and each symbolic dimension of that name elsewhere in the graph's
    declared types the same size; returns what was set: {"batch": 3, "images:2": 8, ...}
    (a name, or INPUT:AXIS for an unnamed dimension). Declared dims that stay open elsewhere are
    cleared, so that a -1 in a declared type never meets an inferred size."""
    sizes: dict[str, int] = {}
    g = probe.graph
    for vi in g.input:
        if vi.name not in inputs or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if _open(dim):
                name = dim.dim_param
                key = name or f"{vi.name}:{axis}"
                size = sizes.setdefault(key, (chosen or {}).get(key, open_dim_size(name, axis)))
                dim.Clear()
                dim.dim_value = size
    for vi in list(g.value_info) + list(g.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            if _open(dim):
                same = sizes.get(dim.dim_param) if dim.dim_param else None
                dim.Clear()
                if same is not None:
                    dim.dim_value = same
    return sizes


class TensorShapes(Mapping):
    """name -> (elem_type, shape tuple or None), read from the inferred graph on first use of
    each name (a model has many more tensors than the cost line and the head rule look at).
    `open_dims` says which sizes the model's open input dimensions took ({"batch": 3, ...})."""

    def __init__(self, probe: onnx.ModelProto, open_dims: dict[str, int], chosen: bool = False):
        self.open_dims = open_dims
        self.chosen = chosen  # whether the caller named sizes (--dim) rather than validation's defaults
        self._infos: dict = {}
        for infos in (probe.graph.input, probe.graph.value_info, probe.graph.output):
            for vi in infos:
                self._infos[vi.name] = vi
        for t in probe.graph.initializer:
            self._infos[t.name] = t
        self._cache: dict[str, tuple] = {}

    def __getitem__(self, name: str) -> tuple:
        got = self._cache.get(name)
        if got is None:
            got = self._cache[name] = self._read(self._infos[name])
        return got

    @staticmethod
    def _read(item) -> tuple:
        if isinstance(item, onnx.TensorProto):
            return item.data_type, tuple(item.dims)
        if not item.type.HasField("tensor_type"):
            return None, None
        tt = item.type.tensor_type
        if not tt.HasField("shape"):
            return tt.elem_type, None
        dims = tt.shape.dim
        # a size that inference could not work out (a name it made up, unk__0, or none) is unknown
        known = all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims)
        return tt.elem_type, (tuple(d.dim_value for d in dims) if known else None)

    def __iter__(self):
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


def tensor_shapes(model: onnx.ModelProto, dims: Mapping[str, int] | None = None) -> TensorShapes | None:
    """name -> (elem_type, shape tuple or None) for the tensors of the main graph, from ONNX shape
    inference on a weightless copy (with data propagation when shapes are computed: Shape or Size
    ops) whose open input dimensions take the sizes validation generates (open_dim_size). None for
    a graph over LIMIT_NODES nodes. `dims` (NAME=SIZE, or INPUT:AXIS=SIZE for an unnamed one, as
    validate's --dims) sizes open dimensions in place of those defaults.

        x: float[batch, 8] -> MatMul(x, W[8, 4]) -> y   gives   {"x": (1, (3, 8)), "y": (1, (3, 4)), ...}"""
    if len(model.graph.node) > LIMIT_NODES:
        return None
    probe = _without_weights(model)
    initializers = {t.name for t in model.graph.initializer}
    open_dims = _fix_open_dims(probe, {vi.name for vi in model.graph.input if vi.name not in initializers}, dims)
    computed = any(n.op_type in ("Shape", "Size") for g in all_graphs(model.graph) for n in g.node)
    try:
        probe = onnx.shape_inference.infer_shapes(probe, data_prop=computed)
    except Exception:  # inference is best effort: unknown shapes are reported as unknown
        pass
    return TensorShapes(probe, open_dims, chosen=bool(dims))


def macs_of(node: onnx.NodeProto, shapes: Mapping[str, tuple]) -> int | None:
    """Multiply-accumulates of one MatMul/Gemm/Conv/ConvTranspose node, None where a shape is unknown."""

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


def node_macs(model: onnx.ModelProto, shapes: Mapping[str, tuple]) -> list[int | None]:
    """Multiply-accumulates of each MatMul/Gemm/Conv/ConvTranspose of the main graph, in graph
    order (None where a shape is unknown).

        MatMul [1, 8, 64] x [64, 32] -> 16384"""
    return [macs_of(n, shapes) for n in model.graph.node if n.op_type in MAC_OPS and n.output]
