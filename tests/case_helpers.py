"""Helpers for the conversion tests (test_classify.py, test_paint.py, test_apply.py,
test_pipeline.py, test_plan_model.py): walking subgraphs, reading initializers and plan entries
back, typed feeds, running with the bf16 caveat, and tolerance checks. Builds on
tests/helpers.py (model building, `parse`, `convert_and_check`)."""

from __future__ import annotations

import helpers as H
import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

F32, F16, BF16 = H.F32, H.F16, H.BF16
TARGET = {"fp16": F16, "bf16": BF16}
NP_OF = {
    F32: np.float32,
    F16: np.float16,
    TensorProto.BOOL: np.bool_,
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
}


# ---- graph walking -----------------------------------------------------------------------
def subgraphs(node):
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for k, g in enumerate(attr.graphs):
                yield f"{attr.name}[{k}]", g


def iter_graphs(m_or_graph, path="main"):
    """(path, GraphProto) for the main graph and every nested body, outermost first."""
    graph = m_or_graph.graph if isinstance(m_or_graph, onnx.ModelProto) else m_or_graph
    yield path, graph
    for node in graph.node:
        for attr_name, sub in subgraphs(node):
            yield from iter_graphs(sub, f"{path}/{node.name or node.op_type}.{attr_name}")


def body(m, node_name, attr_name, graph=None):
    """The subgraph `attr_name` of node `node_name`."""
    node = H.node_by_name(m, node_name, graph)
    for attr in node.attribute:
        if attr.name == attr_name:
            return attr.g
    raise KeyError(f"{node_name}.{attr_name}")


def all_nodes(m):
    return [n for _, g in iter_graphs(m) for n in g.node]


def casts(m_or_graph, recursive=True):
    """Cast nodes of a model (all graphs) or of one graph only."""
    if isinstance(m_or_graph, onnx.ModelProto):
        graphs = [g for _, g in iter_graphs(m_or_graph)] if recursive else [m_or_graph.graph]
    else:
        graphs = [g for _, g in iter_graphs(m_or_graph)] if recursive else [m_or_graph]
    return [n for g in graphs for n in g.node if n.op_type == "Cast"]


def cast_to(node) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return a
    return None


def producer(graph, tensor_name):
    found = [n for n in graph.node if tensor_name in n.output]
    assert len(found) <= 1, f"tensor {tensor_name} produced {len(found)} times"
    return found[0] if found else None


def consumers(graph, tensor_name):
    return [n for n in graph.node if tensor_name in n.input]


def initializer(graph, name):
    found = [t for t in graph.initializer if t.name == name]
    assert len(found) == 1, f"initializer {name}: {len(found)} found"
    return found[0]


def as_float(tensor: TensorProto) -> np.ndarray:
    """Initializer or attribute tensor values as float32 (bf16 included)."""
    if tensor.data_type == BF16:
        if tensor.HasField("raw_data"):
            bits = np.frombuffer(tensor.raw_data, dtype="<u2")
        else:
            bits = np.asarray(tensor.int32_data, dtype=np.uint16)
        out = (bits.astype(np.uint32) << 16).view(np.float32)
        return out.reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor).astype(np.float32)


def round_to(values, elem_type) -> np.ndarray:
    """fp32 values as they read back after a round trip through elem_type (RNE)."""
    values = np.asarray(values, dtype=np.float32)
    if elem_type == F16:
        return values.astype(np.float16).astype(np.float32)
    if elem_type == BF16:
        bits = values.view(np.uint32)
        rounded = ((bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint32) << 16
        return rounded.view(np.float32)
    return values


# ---- types -------------------------------------------------------------------------------
def graph_types(m):
    """{graph path: {tensor name: elem type}} after strict ONNX shape inference, all graphs."""
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    out = {}
    for path, g in iter_graphs(inferred):
        t = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type"):
                t[vi.name] = vi.type.tensor_type.elem_type
        for init in g.initializer:
            t[init.name] = init.data_type
        out[path] = t
    return out


def resolve_type(gtypes, path, name):
    """Type of `name` as seen from graph `path` (outer scopes searched lexically)."""
    while True:
        if name in gtypes.get(path, {}):
            return gtypes[path][name]
        if "/" not in path:
            raise KeyError(f"{name} not typed in {path}")
        path = path.rsplit("/", 1)[0]


def output_types(m):
    return {vi.name: vi.type.tensor_type.elem_type for vi in m.graph.output}


def input_types(m):
    return {vi.name: vi.type.tensor_type.elem_type for vi in m.graph.input}


# ---- plan --------------------------------------------------------------------------------
def entry(result, name):
    found = [n for n in result.plan.nodes if n.name == name]
    assert len(found) == 1, f"{name}: {len(found)} plan entries"
    return found[0]


def reason_codes(result, name):
    return [r.code for r in entry(result, name).reasons]


def warning_codes(result):
    return [w.code for w in result.plan.warnings]


# ---- running -----------------------------------------------------------------------------
def typed_feeds(m, feeds):
    """The same feed values, converted to the element types `m` declares for its inputs
    (keep_io_types=False can turn a float input into float16)."""
    declared = input_types(m)
    out = {}
    for name, value in feeds.items():
        t = declared.get(name)
        if t in NP_OF:
            out[name] = np.asarray(value).astype(NP_OF[t])
        else:
            out[name] = value
    return out


def run_converted(m, feeds, precision):
    """Run a converted model on the CPU EP. Returns its outputs, or None for a bf16 model that
    ONNX Runtime's CPU EP cannot run: it has no bf16 kernels for MatMul/Add/Softmax/Conv...
    ("NOT_IMPLEMENTED: Could not find an implementation"), so bf16 models are checked by the
    checker and by types only. fp16 models must always run."""
    try:
        return H.run(m, typed_feeds(m, feeds))
    except Exception as exc:  # onnxruntime raises its own exception classes
        if precision == "bf16" and "NOT_IMPLEMENTED" in str(exc):
            return None
        raise


def tolerance(precision):
    return {"fp16": 1e-2, "bf16": 4e-2}[precision]


def assert_close(actual, expected, precision, scale=None):
    """|actual - expected| <= tol * max(1, max|expected|) elementwise (error scaled to the
    output's magnitude: low-precision rounding is relative to the largest values feeding it)."""
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), "non-finite values in the converted model's output"
    mag = scale if scale is not None else max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
    tol = tolerance(precision)
    err = float(np.abs(actual - expected).max()) if expected.size else 0.0
    assert err <= tol * mag, f"max abs error {err:.3g} > {tol * mag:.3g}"


def compare_runs(original, converted, feeds, precision):
    """Run both models with the same feeds; assert close; return (ref, got) (got None for bf16
    models the CPU EP cannot run)."""
    ref = H.run(original, feeds)
    got = run_converted(converted, feeds, precision)
    if got is not None:
        assert len(got) == len(ref)
        for a, e in zip(got, ref):
            assert_close(a, e, precision)
    return ref, got


def unique_names_ok(m):
    """Every tensor is defined once in the whole model and node names are unique (non-empty)."""
    defined = []
    node_names = []
    for _, g in iter_graphs(m):
        defined += [vi.name for vi in g.input] + [
            t.name for t in g.initializer if t.name not in {vi.name for vi in g.input}
        ]
        for n in g.node:
            defined += [o for o in n.output if o]
            if n.name:
                node_names.append(n.name)
    dup_t = sorted({x for x in defined if defined.count(x) > 1})
    dup_n = sorted({x for x in node_names if node_names.count(x) > 1})
    return dup_t, dup_n
