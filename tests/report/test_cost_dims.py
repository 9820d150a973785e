"""The summary's cost line on the dimensions exporters write: -1 and 0 for "any size", unnamed
and named symbolic dimensions, sizes only data propagation can work out, initializers listed as
graph inputs (IR 3), and models whose MatMuls already compute in fp16. Open input dimensions take
the sizes validation generates (graph/shapes.py open_dim_size), a count that is unknown is said to
be unknown, and no negative or zero count is ever printed as a figure."""

from __future__ import annotations

import re

import numpy as np
import onnx
from helpers import cost_of, parse, randn

import autocast_onnx
from autocast_onnx.graph.shapes import tensor_shapes
from autocast_onnx.report import conversion_summary
from autocast_onnx.report.cost import conversion_cost, cost_line

CONV_MACS_8x8 = 4 * 8 * 8 * (3 * 3 * 3)  # one image: 4 output channels, 8x8, a 3x3x3 kernel


def conv_bn(dims: str = "1,3,8,8", out: str = "1,4,8,8"):
    return parse(
        f"""
        cb (float[{dims}] x) => (float[{out}] y) {{
            [conv] h = Conv <pads = [1, 1, 1, 1]> (x, w)
            [bn] y = BatchNormalization(h, s, b, m, v)
        }}""",
        w=randn([4, 3, 3, 3]),
        s=np.ones(4, np.float32),
        b=np.zeros(4, np.float32),
        m=np.zeros(4, np.float32),
        v=np.ones(4, np.float32),
    )


def with_dim_values(model, values: dict) -> onnx.ModelProto:
    """Set dims of the graph's inputs and outputs to raw values, as an exporter writes them:
    {("x", 0): -1} (the text syntax cannot say -1)."""
    for vi in list(model.graph.input) + list(model.graph.output):
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if (vi.name, axis) in values:
                dim.Clear()
                dim.dim_value = values[(vi.name, axis)]
    return model


def figures(text: str) -> list[str]:
    """The numbers the cost line prints before a unit (B, KB, MACs ...)."""
    line = next(x for x in text.splitlines() if x.startswith("cast traffic"))
    return re.findall(r"(-?[\d,.]+) (?:B|KB|MB|GB|MACs)\b", line)


def assert_no_bad_figure(text: str) -> None:
    for number in figures(text):
        assert float(number.replace(",", "")) > 0, text


def test_a_minus_one_batch_dim_takes_validations_batch_not_a_negative_count():
    """A CNN exported with a -1 batch dim printed '-6066 B' and '-55,648 MACs': every product
    with the -1 in it was negative."""
    m = with_dim_values(conv_bn(), {("x", 0): -1, ("y", 0): -1})
    result = autocast_onnx.convert(m)
    cost = cost_of(result)
    assert cost["macs"] == 3 * CONV_MACS_8x8 == cost["macs_low_precision"]  # batch 3, as validate generates
    assert cost["cast_bytes"] == 3 * (192 + 256) * 6
    text = conversion_summary(result)
    assert_no_bad_figure(text)
    assert "100.0% of 20,736 MACs" in text and "x:0=3" in text


def test_minus_one_spatial_dims_are_not_a_positive_product_of_two_negatives():
    """A detector exported as [1, 3, -1, -1] printed '100.0% of 64 MACs': (-1) x (-1) = 1 pixel."""
    m = with_dim_values(conv_bn(), {("x", 2): -1, ("x", 3): -1, ("y", 2): -1, ("y", 3): -1})
    cost = cost_of(autocast_onnx.convert(m))
    assert cost["macs"] == CONV_MACS_8x8  # 8x8 images: the size validate generates off the first axis
    assert cost["open_dims"] == {"x:2": 8, "x:3": 8}


def test_zero_and_unnamed_dims_are_open_too():
    m = with_dim_values(conv_bn("?,3,?,?", "?,4,?,?"), {("x", 0): 0})
    cost = cost_of(autocast_onnx.convert(m))
    assert cost["macs"] == 3 * CONV_MACS_8x8 and cost["mac_nodes_unknown_shape"] == 0


def test_named_dims_take_the_sizes_validation_generates():
    """The generated batch of `validate` and the cost line's sizes are one judgement: a named
    batch 3, a named sequence 16, another name 8, an unnamed dim 3 on the first axis else 8."""
    from autocast_onnx.validate.inputs import _shape, describe_inputs, plan_inputs

    m = parse(
        """
        dims (float[batch, seq_len, 8] a, float[n, ?, width] b) => (float[batch, seq_len, 8] y) {
            y = Identity(a)
        }"""
    )
    m = with_dim_values(m, {("b", 1): -1})
    shapes = tensor_shapes(m)
    plan = plan_inputs(describe_inputs(m))
    for spec in plan.specs:
        assert shapes[spec.name][1] == _shape(spec, plan.dims), spec.name
    assert shapes["a"][1] == (3, 16, 8) and shapes["b"][1] == (3, 8, 8)
    assert shapes.open_dims == {"batch": 3, "seq_len": 16, "n": 3, "b:1": 8, "width": 8}


def test_shapes_computed_from_named_dims_through_shape_ops_are_known():
    """An encoder reshapes by sizes it reads with Shape: with the input's named dims inference
    made up names (unk__0) for the reshaped tensor and the MatMul after it had no known work, so
    the line read 'n/a of 0 MACs'."""
    m = parse(
        """
        heads (float[batch, seq, 16] x) => (float[batch, seq, 4, 8] y) {
            s = Shape(x)
            b = Gather<axis=0>(s, zero)
            t = Gather<axis=0>(s, one)
            target = Concat<axis=0>(b, t, four, minus_one)
            r = Reshape(x, target)
            tr = Transpose<perm=[0, 2, 1, 3]>(r)
            c = Cast<to=1>(tr)
            p = MatMul(c, w)
            y = Transpose<perm=[0, 2, 1, 3]>(p)
        }""",
        w=randn([4, 8]),
        zero=np.array([0], np.int64),
        one=np.array([1], np.int64),
        four=np.array([4], np.int64),
        minus_one=np.array([-1], np.int64),
    )
    result = autocast_onnx.convert(m)
    cost = cost_of(result)
    assert cost["mac_nodes_unknown_shape"] == 0
    assert cost["macs"] == 3 * 4 * 16 * 8 * 4  # [3, 4, 16, 4] x [4, 8]
    assert_no_bad_figure(conversion_summary(result))


def test_initializers_listed_as_graph_inputs_keep_their_shapes():
    """IR 3 lists every initializer among the graph inputs: the weightless copy declares each
    heavy one once, with the initializer's dims (a guard: it has held before)."""
    m = conv_bn()
    m.ir_version = 3
    for t in m.graph.initializer:
        m.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    w = next(t for t in m.graph.initializer if t.name == "w")
    w.CopyFrom(onnx.numpy_helper.from_array(randn([4, 3, 3, 3]), "w"))  # over 1 KiB: a heavy one
    shapes = tensor_shapes(m)
    assert shapes["h"][1] == (1, 4, 8, 8) and shapes["w"][1] == (4, 3, 3, 3)


def test_a_recognition_model_with_a_minus_one_width_counts_all_its_matmuls():
    """A text recognizer takes images of any width ([1, 3, 8, -1]): its Conv, the Reshape and
    Transpose into a sequence and the MatMuls after them had no sensible work (products with the
    -1 in them), so the line read '0.0% of 144,000 MACs' over a model whose MatMuls are fp16."""
    m = parse(
        """
        rec (float[1, 3, 8, ?] x) => (float[1, ?, 10] y) {
            [conv] c = Conv <pads = [1, 1, 1, 1]> (x, w)
            [seq] s = Reshape(c, shape)
            [t] t = Transpose<perm = [0, 2, 1]>(s)
            [fc] h = MatMul(t, w1)
            [act] a = Relu(h)
            [head] y = MatMul(a, w2)
        }""",
        w=randn([4, 3, 3, 3]),
        shape=np.array([1, 32, -1], np.int64),
        w1=randn([32, 32], seed=1),
        w2=randn([32, 10], seed=2),
    )
    m = with_dim_values(m, {("x", 3): -1, ("y", 1): -1})
    result = autocast_onnx.convert(m)
    cost = cost_of(result)
    width = 8  # the size validate generates for an unnamed dimension off the first axis
    assert cost["mac_nodes_unknown_shape"] == 0
    assert cost["macs"] == 4 * 8 * width * 27 + width * 32 * 32 + width * 32 * 10
    assert cost["macs_low_precision"] == cost["macs"]
    assert "100.0% of 17,664 MACs" in conversion_summary(result)


def test_a_node_left_unchanged_in_fp16_counts_as_low_precision_work():
    """The share follows the precision each node computes in: a MatMul the plan leaves
    `unchanged` (it keeps its own types) that computed in fp16 is low-precision work."""
    from autocast_onnx.dtypes import FLOAT, FLOAT16

    macs = [(0, 300, FLOAT16), (1, 100, FLOAT), (2, 50, FLOAT)]
    cost = conversion_cost({}, macs, [], [], ["unchanged", "unchanged", "fp16"])
    assert (cost["macs"], cost["macs_low_precision"]) == (450, 350)


def test_unknown_counts_are_said_to_be_unknown():
    """Shapes inference cannot work out (a reshape by a runtime input) leave the work unknown:
    the line says so rather than printing '0 B' or 'n/a of 0 MACs' as if they were figures."""
    m = parse(
        """
        dyn (float[N,16] x, int64[2] shape) => (float[?,?] y) {
            [r] r = Reshape(x, shape)
            [mm] y = MatMul(r, w)
        }""",
        w=randn([16, 16]),
    )
    text = conversion_summary(autocast_onnx.convert(m))
    assert "unknown (no shape known for any of the 1 MatMul/Gemm/Conv)" in text
    assert_no_bad_figure(text)
    base = {"computed": True, "cast_bytes": 0, "macs": 0, "macs_low_precision": 0}
    line = cost_line(base | {"casts": 3, "casts_unknown_size": 3, "mac_nodes": 2, "mac_nodes_unknown_shape": 2})
    assert "3 casts move an unknown number of bytes" in line and " 0 B" not in line and "0 MACs" not in line
    partial = base | {"casts": 3, "casts_unknown_size": 1, "cast_bytes": 600, "mac_nodes": 4}
    line = cost_line(partial | {"mac_nodes_unknown_shape": 3, "macs": 64, "macs_low_precision": 64})
    assert "at least 600 B per inference (1 of unknown size)" in line
    assert "100.0% of 64 MACs (of the 1 of 4 MatMul/Gemm/Conv whose shapes are known)" in line
    assert cost_line(base | {"casts": 0, "casts_unknown_size": 0, "mac_nodes": 0, "mac_nodes_unknown_shape": 0}) == (
        "cast traffic: no casts added; no MatMul/Gemm/Conv work"
    )
