"""Shared helpers for tests: build small graphs, run them in ONNX Runtime, read back types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


def tensor(name, elem_type=F32, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=(), value_info=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=list(value_info))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def convert(m, **kw):
    return autocast_onnx.convert(m, **kw)


def run(m, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def types(m):
    """Element type of every tensor of the (main) graph after ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    out = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            out[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        out[t.name] = t.data_type
    return out


def node_by_name(m, name, graph=None):
    g = graph or m.graph
    for n in g.node:
        if n.name == name:
            return n
    raise KeyError(name)


def compute_type(m, name):
    """The element type a named node computes in: the type of its first output."""
    n = node_by_name(m, name)
    return types(m)[n.output[0]]


def ops(m, op_type, graph=None):
    g = graph or m.graph
    return [n for n in g.node if n.op_type == op_type]


def precision(result, name):
    found = [n for n in result.plan.nodes if n.name == name]
    assert len(found) == 1, f"{name}: {len(found)} plan entries"
    return found[0].precision


def check(m):
    onnx.checker.check_model(m, full_check=True)
