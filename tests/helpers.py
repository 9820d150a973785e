"""Shared helpers for tests: build small graphs (from ONNX text syntax with `parse`, or node by
node with `model`), convert and check them, run them in ONNX Runtime, read back types."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnx.parser
from onnx import AttributeProto, TensorProto, helper, numpy_helper

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


def add_initializers(graph, **arrays):
    """Append numpy arrays as initializers of `graph` (a main graph or a subgraph body)."""
    graph.initializer.extend(init(name, value) for name, value in arrays.items())
    return graph


def parse(text, *, opset=17, domains=None, **initializers):
    """A model from ONNX text syntax, with numpy arrays attached as main-graph initializers:

        parse('''
            mlp (float[2,4] x) => (float[2,4] y) {
                [fc] h = MatMul(x, w)
                [act] y = Relu(h)
            }''', w=randn([4, 4]))

    `[name]` before a node names it (quote names that are not identifiers: ["enc/fc1"]). Without
    a `<ir_version: ..., opset_import: [...]>` header one is added: IR 8, the default domain at
    `opset`, plus `domains` ({"com.microsoft": 1}). Small constant initializers can also be
    declared in the graph signature: `<int64[2] shape = {2, 4}>`."""
    text = textwrap.dedent(text).strip()
    if not text.startswith("<"):
        imports = ", ".join(f'"{d}" : {v}' for d, v in {"": opset, **(domains or {})}.items())
        text = f"<ir_version: 8, opset_import: [{imports}]>\n{text}"
    m = onnx.parser.parse_model(text)
    add_initializers(m.graph, **initializers)
    return m


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, seed=0, scale=1.0):
    """Standard-normal float32 values, reproducible by seed."""
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def convert(m, **kw):
    return autocast_onnx.convert(m, **kw)


def convert_and_check(m, **kw):
    """convert() and the full ONNX checker on its result (convert() checks too; asserted here so
    a regression that disables that check is still caught). Returns (result, converted model)."""
    result = autocast_onnx.convert(m, **kw)
    onnx.checker.check_model(result.model, full_check=True)
    return result, result.model


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


def planned(result, name):
    """The precision the plan gives the node called `name` (exactly one such node)."""
    found = [n for n in result.plan.nodes if n.name == name]
    assert len(found) == 1, f"{name}: {len(found)} plan entries"
    return found[0].precision


precision = planned  # the older name, still used by other test files


def check(m):
    onnx.checker.check_model(m, full_check=True)


# ---- models shared by several test files ---------------------------------------------------
def attention_block():
    """Scaled dot-product attention: MatMul, Div, Add(mask), Softmax, MatMul."""
    return parse(
        """
        attention (float[2,4,8] q, float[2,4,4] mask) => (float[2,4,8] ctx) <float scale = {2.0}> {
            [scores] scores = MatMul(q, kt)
            [scale_div] scaled = Div(scores, scale)
            [mask_add] masked = Add(scaled, mask)
            [softmax] probs = Softmax <axis = -1> (masked)
            [context] ctx = MatMul(probs, v)
        }""",
        kt=randn([8, 4], 1, 0.3),
        v=randn([4, 8], 2, 0.3),
    )


def mlp():
    """Two MatMuls around a Relu, in an "enc/" and a "head/" name scope."""
    return parse(
        """
        mlp (float[2,8] x) => (float[2,8] y) {
            ["enc/fc1"] h = MatMul(x, w1)
            ["enc/act"] a = Relu(h)
            ["head/fc2"] y = MatMul(a, w2)
        }""",
        w1=randn([8, 8], 3, 0.3),
        w2=randn([8, 8], 4, 0.3),
    )


def eye_noise_model(opset=17):
    """Ops whose output type is a `dtype` attribute: EyeLike and a seeded RandomNormalLike, each
    added to the result of a MatMul."""
    return parse(
        """
        eye_noise (float[4,4] x) => (float[4,4] y) {
            [mm] a = MatMul(x, W)
            [eye] e = EyeLike <dtype = 1> (x)                                  # dtype FLOAT
            [add_eye] b = Add(a, e)
            [mm2] c = MatMul(b, W2)
            [noise] n = RandomNormalLike <dtype = 1, seed = 7.0, scale = 0.1> (c)   # dtype FLOAT
            [add_noise] y = Add(c, n)
        }""",
        opset=opset,
        W=randn([4, 4], 43),
        W2=randn([4, 4], 44),
    )


def unknown_op_model(declare_type):
    """A custom op my.domain:Foo (no schema, no rule) between two MatMuls; with `declare_type`
    its output has a value_info saying it is float [2, 4]."""
    m = parse(
        """
        custom (float[2,4] x) => (float[2,4] y) {
            [mm] a = MatMul(x, W1)
            [foo] foo_out = my.domain.Foo(a)
            [mm2] y = MatMul(foo_out, W2)
        }""",
        domains={"my.domain": 1},
        W1=randn([4, 4], 85),
        W2=randn([4, 4], 86),
    )
    if declare_type:
        m.graph.value_info.append(tensor("foo_out", F32, [2, 4]))
    return m


def cli_process(*args, cwd):
    """`python -m autocast_onnx ARGS` as a real process from `cwd` (stderr as a user sees it,
    ONNX Runtime's own logging included), without the debug environment variable."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AUTOCAST_ONNX_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "autocast_onnx", *[str(a) for a in args]],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )


def worker_for_small_files(monkeypatch):
    """Body of a fixture that lets the worker (forked for files of 16 MiB or more:
    worker.MIN_BYTES) and the weight screen run for small test models, whatever this process's
    size. Use: `pytest.fixture(name="worker_for_small_files")(helpers.worker_for_small_files)`."""
    from autocast_onnx.fast import screen, worker

    for module in (worker, screen):
        monkeypatch.setattr(module, "MIN_BYTES", 0)
        monkeypatch.setattr(module, "MAX_PARENT_BYTES", 2**40)
    yield


def cost_of(result) -> dict:
    """The summary's cast and MAC cost of a ConversionResult (report.cost.conversion_cost on its data)."""
    from autocast_onnx.report.cost import conversion_cost

    return conversion_cost(result.shapes, result.macs, result.nodes, result.stats.cast_outputs, result.plan.precisions)


def reshaped_to_fixed_rows(seed: int = 2):
    """x [?, 8] (an unnamed dynamic axis) reshaped to the fixed [2, 8], then MatMul and Relu: it
    converts fine, but ONNX Runtime runs it only on 2 rows, which generated inputs (3 rows on an
    unnamed first axis) do not have. `seed` draws the weight."""
    m = parse(
        """
        g (float[b,8] x) => (float[2,8] y) {
            s = Constant<value = int64[2] {2, 8}>()
            r = Reshape(x, s)
            h = MatMul(r, w)
            y = Relu(h)
        }""",
        w=randn([8, 8], seed),
    )
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    return m


def _level(graph: onnx.GraphProto, d: int, depth: int, named: bool) -> str:
    """Level d: MatMul(x, w) and Add(., x), then (below `depth`) an If whose then_branch is level
    d + 1 and whose else_branch passes the Add on. Bodies read x, w and c from the main graph.
    Built in place: protobuf copies a nested message by encoding it and reading it back, which
    fails beyond its 100 message levels."""
    graph.name = f"level{d}"
    graph.node.add().CopyFrom(helper.make_node("MatMul", ["x", "w"], [f"m{d}"], name=f"mm{d}" if named else ""))
    graph.node.add().CopyFrom(helper.make_node("Add", [f"m{d}", "x"], [f"a{d}"], name=f"add{d}" if named else ""))
    out = f"a{d}"
    if d < depth:
        node = graph.node.add()
        node.op_type, node.name = "If", f"if{d}" if named else ""
        node.input.append("c")
        node.output.append(f"y{d}")
        then = node.attribute.add()
        then.name, then.type = "then_branch", AttributeProto.GRAPH
        _level(then.g, d + 1, depth, named)
        other = node.attribute.add()
        other.name, other.type = "else_branch", AttributeProto.GRAPH
        other.g.name = f"else{d}"
        other.g.node.add().CopyFrom(helper.make_node("Identity", [f"a{d}"], [f"e{d}"]))
        other.g.output.add().CopyFrom(helper.make_tensor_value_info(f"e{d}", F32, [2, 2]))
        out = f"y{d}"
    if d > 0:
        graph.output.add().CopyFrom(helper.make_tensor_value_info(out, F32, [2, 2]))
    return out


def nested_ifs(depth: int, named: bool = False) -> onnx.ModelProto:
    """If nested `depth` levels deep (the main graph is level 0), a MatMul and an Add per level."""
    m = onnx.ModelProto()
    m.ir_version = 8
    m.opset_import.add().version = 17
    out = _level(m.graph, 0, depth, named)
    m.graph.input.add().CopyFrom(helper.make_tensor_value_info("x", F32, [2, 2]))
    m.graph.input.add().CopyFrom(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    m.graph.output.add().CopyFrom(helper.make_tensor_value_info(out, F32, [2, 2]))
    m.graph.initializer.add().CopyFrom(numpy_helper.from_array(np.eye(2, dtype=np.float32), "w"))
    return m


def sarif_location_path(run: dict, artifact: dict):
    """The file a SARIF artifactLocation names: its relative URI under the run's
    originalUriBaseIds entry for its uriBaseId, or its absolute file URI."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    uri = artifact["uri"]
    if "uriBaseId" in artifact:
        uri = run["originalUriBaseIds"][artifact["uriBaseId"]]["uri"] + uri
    parsed = urlparse(uri)
    assert parsed.scheme == "file", uri
    return Path(unquote(parsed.path))
