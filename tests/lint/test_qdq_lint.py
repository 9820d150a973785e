"""AC304 cast-inside-qdq-unit: a Cast between a DequantizeLinear and the op it feeds, or between an
op and the QuantizeLinear of its output, splits the int8 unit that runtimes fuse. Found in models
made by any tool (a hand-built graph, a conversion that ignored the units), never in one that
`convert` made (the agreement test in test_agreement.py holds that on quantized models too)."""

from __future__ import annotations

import helpers as H
import lint_helpers as L
import numpy as np
import onnx
import qdq_helpers as Q
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx.lint.engine import LintOptions, lint


def split_unit(cast_before_conv: bool = True, cast_before_q: bool = True) -> onnx.ModelProto:
    """DequantizeLinear -> [Cast to fp16] -> Conv (fp16) -> [Cast to fp32] -> QuantizeLinear, the
    wiring a converter that casts at every boundary writes at opset 17."""
    f16 = TensorProto.FLOAT16
    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["x"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "s", "zp"], ["w"], name="dq_w"),
    ]
    x, w = "x", "w"
    if cast_before_conv:
        nodes += [
            helper.make_node("Cast", ["x"], ["x16"], name="cast_x", to=f16),
            helper.make_node("Cast", ["w"], ["w16"], name="cast_w", to=f16),
        ]
        x, w = "x16", "w16"
    nodes.append(helper.make_node("Conv", [x, w], ["h"], name="conv"))
    h = "h"
    if cast_before_q:
        to = TensorProto.FLOAT if cast_before_conv else f16
        nodes.append(helper.make_node("Cast", ["h"], ["h32"], name="cast_h", to=to))
        h = "h32"
    elif cast_before_conv:
        nodes.append(helper.make_node("Cast", ["h"], ["h32"], name="cast_h_out", to=TensorProto.FLOAT))
        h = "h32"
    nodes.append(helper.make_node("QuantizeLinear", [h, "s", "zp"], ["y"], name="q_y"))
    inits = [
        H.init("wq", np.ones((2, 2, 1, 1), np.int8)),
        H.init("s", np.array(0.1, np.float32)),
        H.init("zp", np.array(0, np.int8)),
    ]
    return H.model(
        nodes,
        [H.tensor("xq", TensorProto.INT8, [1, 2, 4, 4])],
        [H.tensor("y", TensorProto.INT8, [1, 2, 4, 4])],
        inits,
    )


def findings(m) -> list:
    return [d for d in lint(m, LintOptions()).diagnostics if d.code == "AC304"]


def test_casts_inside_a_unit_are_reported_on_each_edge():
    found = {d.node: d for d in findings(split_unit())}
    assert set(found) == {"cast_x", "cast_w", "cast_h"}
    L.assert_diag(found["cast_x"], "AC304", node="cast_x", op_type="Cast", words=("dq_x", "conv (Conv)", "int8"))
    L.assert_diag(found["cast_h"], "AC304", node="cast_h", op_type="Cast", words=("conv (Conv)", "QuantizeLinear q_y"))


def test_a_whole_unit_is_not_reported():
    assert findings(split_unit(cast_before_conv=False, cast_before_q=False)) == []


def test_the_unfixed_conversion_of_a_quantized_resnet_is_what_lint_reports():
    """A Cast between every DequantizeLinear and its Conv is what a unit-blind conversion wrote;
    the converter's own output of the same model has none."""
    source = Q.quantized(str(Q.ROOT / "examples" / "models" / "resnet_tiny.onnx"))
    converted = autocast_onnx.convert(onnx.load(source)).model
    assert findings(converted) == []
    # the same model with each unit split the way a cast-everywhere converter splits it
    blind = onnx.load(source)
    graph = blind.graph
    conv = next(n for n in graph.node if n.op_type == "Conv")
    cast = helper.make_node(
        "Cast", [conv.input[1]], [conv.input[1] + "_fp16"], name="blind_cast", to=TensorProto.FLOAT16
    )
    back = helper.make_node(
        "Cast", [cast.output[0]], [cast.output[0] + "_fp32"], name="blind_back", to=TensorProto.FLOAT
    )
    conv.input[1] = back.output[0]
    graph.node.extend([cast, back])
    found = [d.node for d in findings(onnx.helper.make_model(graph, opset_imports=blind.opset_import))]
    assert found == ["blind_cast"]
