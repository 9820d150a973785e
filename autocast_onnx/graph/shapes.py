"""Shapes and work of a model's main graph, without running it: one ONNX shape inference on a
weightless copy of the model (every symbolic dimension set to 1, so figures are per unit of batch,
sequence, ...) and the multiply-accumulates of each MatMul/Gemm/Conv from those shapes. What has
no known shape is None, never guessed. The conversion infers once and shares the result between
the output-head rule (classify) and the cost report (report/cost.py). A model of 10,000 nodes
takes about 0.07 s; over LIMIT_NODES nodes nothing is inferred."""

from __future__ import annotations

import math
from collections.abc import Mapping

import onnx

from ..io import all_graphs

LIMIT_NODES = 20_000  # above this, shape inference would cost as much as the conversion
MAC_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


SMALL_INITIALIZER = 1024  # bytes: shape vectors and scalars keep their values for inference


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model for shape inference whose large initializers are typed graph inputs
    without data, so the weights are neither copied nor serialised again."""
    graph = model.graph
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = graph.name
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.node.extend(graph.node)
    g.value_info.extend(graph.value_info)
    for t in graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and t.ByteSize() <= SMALL_INITIALIZER:
            g.initializer.append(t)
        else:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


class TensorShapes(Mapping):
    """name -> (elem_type, shape tuple or None), read from the inferred graph on first use of
    each name (a model has many more tensors than the cost line and the head rule look at)."""

    def __init__(self, probe: onnx.ModelProto, named: set):
        self._named = named
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

    def _read(self, item) -> tuple:
        if isinstance(item, onnx.TensorProto):
            return item.data_type, tuple(item.dims)
        if not item.type.HasField("tensor_type"):
            return None, None
        tt = item.type.tensor_type
        dims = list(tt.shape.dim) if tt.HasField("shape") else []
        known = tt.HasField("shape") and all(d.HasField("dim_value") or d.dim_param in self._named for d in dims)
        return tt.elem_type, (tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims) if known else None)

    def __iter__(self):
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)


def tensor_shapes(model: onnx.ModelProto) -> TensorShapes | None:
    """name -> (elem_type, shape tuple or None) for the tensors of the main graph, from ONNX shape
    inference on a weightless copy (with data propagation when shapes are computed: Shape or Size
    ops); the model's own dimension names count as 1. None for a graph over LIMIT_NODES nodes.

        x: float[batch, 8] -> MatMul(x, W[8, 4]) -> y   gives   {"x": (1, (1, 8)), "y": (1, (1, 4)), ...}"""
    if len(model.graph.node) > LIMIT_NODES:
        return None
    probe = _without_weights(model)
    computed = any(n.op_type in ("Shape", "Size") for g in all_graphs(model.graph) for n in g.node)
    try:
        probe = onnx.shape_inference.infer_shapes(probe, data_prop=computed)
    except Exception:  # inference is best effort: unknown shapes are reported as unknown
        pass
    # the model's own dimension names (batch, sequence) count as 1; names inference makes up for
    # dimensions it could not work out (unk__0, ...) leave the shape unknown
    named = {d.dim_param for vi in list(model.graph.input) + list(model.graph.output)
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}  # fmt: skip
    return TensorShapes(probe, named)


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
