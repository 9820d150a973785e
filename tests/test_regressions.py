"""Regression tests for autocast-onnx: small graphs for the cases that have broken mixed-precision
converters before (subgraphs, shared initializers, author casts, dtype attributes, pinned ports,
graph outputs, contrib/unknown ops, already-converted models, name collisions, out-of-range
constants, bad input on the command line).

Every conversion is checked with onnx.checker (full_check), run on the ONNX Runtime CPU EP with
the original's feeds where the CPU EP has the kernels (it has fp16 kernels for everything used
here, no bf16 kernels for MatMul/Add/Softmax/Conv: bf16 models are checked by checker and types
only, see case_helpers.run_converted) and compared with the fp32 original."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import autocast_onnx
import case_helpers as C
import helpers as H
from helpers import BF16, F16, F32, init, model, tensor

PRECISIONS = ["fp16", "bf16"]
KEEP_IO = [True, False]


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def node(op, inputs, outputs, name, **kw):
    return helper.make_node(op, inputs, outputs, name=name, **kw)


def converted_ok(result):
    """The converted model passes the full checker (convert() checks too; asserted here so a
    regression that disables that check is still caught)."""
    onnx.checker.check_model(result.model, full_check=True)
    return result.model


# =========================================================================================
# 1. If / Loop subgraphs
# =========================================================================================
def if_model():
    """If whose branches read outer-scope x and outer initializer W_outer:
    then: MatMul -> Softmax;  else: MatMul -> Add(else-local bias) -> Softmax."""
    then_g = helper.make_graph(
        [node("MatMul", ["x", "W_outer"], ["then_s"], "then_scores"),
         node("Softmax", ["then_s"], ["then_out"], "then_softmax", axis=-1)],
        "then_body", [], [tensor("then_out", F32, [2, 4])])
    else_g = helper.make_graph(
        [node("MatMul", ["x", "W_outer"], ["else_s"], "else_scores"),
         node("Add", ["else_s", "b_else"], ["else_b"], "else_bias"),
         node("Softmax", ["else_b"], ["else_out"], "else_softmax", axis=-1)],
        "else_body", [], [tensor("else_out", F32, [2, 4])], [init("b_else", randn([4], 5))])
    nodes = [node("If", ["cond"], ["y"], "branch", then_branch=then_g, else_branch=else_g)]
    return model(nodes, [tensor("x", F32, [2, 4]), tensor("cond", TensorProto.BOOL, [])],
                 [tensor("y", F32, [2, 4])], [init("W_outer", randn([4, 4], 1))])


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_if_branches_planned_and_casts_in_defining_graph(precision, keep_io):
    m = if_model()
    H.check(m)
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)

    # Both branches are planned node by node; their nodes live in a subgraph, not in main.
    for name in ("then_scores", "else_scores", "else_bias"):
        e = C.entry(result, name)
        assert e.precision == precision, (name, e.precision)
        assert e.graph != "main"
    for name in ("then_softmax", "else_softmax"):
        e = C.entry(result, name)
        assert e.precision == "fp32" and e.graph != "main"
    assert C.entry(result, "branch").precision == "unchanged"

    then_g, else_g = C.body(out, "branch", "then_branch"), C.body(out, "branch", "else_branch")
    # x and W_outer are defined in main: their conversion happens in main, once for both
    # branches; the bodies hold no cast of an outer tensor.
    for g in (then_g, else_g):
        assert not [n for n in C.casts(g) if n.input[0] in ("x", "W_outer")]
    x_casts = [n for n in C.casts(out.graph, recursive=False) if n.input[0] == "x"]
    if keep_io:
        assert len(x_casts) == 1 and C.cast_to(x_casts[0]) == target
        assert C.input_types(out)["x"] == F32
    else:
        assert x_casts == []
        assert C.input_types(out)["x"] == target
    assert C.initializer(out.graph, "W_outer").data_type == target
    assert len(out.graph.initializer) == 1
    assert C.initializer(else_g, "b_else").data_type == target
    # Inside each body exactly one cast: the low-precision scores back to fp32 for Softmax.
    for g in (then_g, else_g):
        body_casts = C.casts(g)
        assert len(body_casts) == 1 and C.cast_to(body_casts[0]) == F32
    assert result.stats.casts_added == (3 if keep_io else 2)

    gt = C.graph_types(out)
    then_path = next(p for p in gt if p.endswith("then_branch"))
    else_path = next(p for p in gt if p.endswith("else_branch"))
    assert gt[then_path]["then_s"] == target and gt[else_path]["else_b"] == target
    assert gt[then_path]["then_out"] == F32 and gt[else_path]["else_out"] == F32
    assert C.output_types(out)["y"] == F32

    for cond in (True, False):
        feeds = {"x": randn([2, 4], 2), "cond": np.array(cond)}
        C.compare_runs(m, out, feeds, precision)


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_outer_tensor_cast_once_in_defining_graph(precision, keep_io):
    """h is made by a MatMul in main and read inside both branches: by a Softmax (fp32) in
    each, and by a MatMul (low) in the then branch. The fp32 copy of h is made once, in main,
    right after its producer; the low-precision MatMul reads h itself."""
    then_g = helper.make_graph(
        [node("Softmax", ["h"], ["t_p"], "then_softmax", axis=-1),
         node("MatMul", ["t_p", "h_t"], ["then_out"], "then_mm")],
        "then_body", [], [tensor("then_out", F32, [4, 4])])
    else_g = helper.make_graph(
        [node("Softmax", ["h"], ["else_out"], "else_softmax", axis=0)],
        "else_body", [], [tensor("else_out", F32, [4, 4])])
    m = model([node("MatMul", ["x", "W"], ["h"], "pre_mm"),
               node("Transpose", ["h"], ["h_t"], "pre_t"),
               node("If", ["cond"], ["y"], "branch", then_branch=then_g, else_branch=else_g)],
              [tensor("x", F32, [4, 4]), tensor("cond", TensorProto.BOOL, [])], [tensor("y", F32, [4, 4])],
              [init("W", randn([4, 4], 6))])
    H.check(m)
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "pre_mm").precision == precision
    assert C.entry(result, "then_mm").precision == precision
    h_casts = [n for n in C.casts(out) if n.input[0] == "h"]
    assert len(h_casts) == 1 and C.cast_to(h_casts[0]) == F32
    assert h_casts[0] in list(out.graph.node)
    main_order = [n.name for n in out.graph.node]
    assert main_order.index("pre_mm") < main_order.index(h_casts[0].name) < main_order.index("branch")
    then_g2, else_g2 = C.body(out, "branch", "then_branch"), C.body(out, "branch", "else_branch")
    assert H.node_by_name(out, "then_softmax", then_g2).input[0] == h_casts[0].output[0]
    assert H.node_by_name(out, "else_softmax", else_g2).input[0] == h_casts[0].output[0]
    for cond in (True, False):
        C.compare_runs(m, out, {"x": randn([4, 4], 7), "cond": np.array(cond)}, precision)


def loop_model():
    """Loop (3 trips) with a MatMul in the body; h is loop-carried float state, and the
    pre-activation is also a scan output."""
    body_g = helper.make_graph(
        [node("MatMul", ["h_in", "W_loop"], ["loop_mm_out"], "loop_mm"),
         node("Tanh", ["loop_mm_out"], ["h_out"], "loop_act"),
         node("Identity", ["cond_in"], ["cond_out"], "loop_cond")],
        "loop_body",
        [tensor("iter", TensorProto.INT64, []), tensor("cond_in", TensorProto.BOOL, []), tensor("h_in", F32, [1, 4])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("h_out", F32, [1, 4]), tensor("loop_mm_out", F32, [1, 4])])
    nodes = [node("Loop", ["trips", "keep_going", "x"], ["h_final", "h_trace"], "loop", body=body_g)]
    return model(nodes, [tensor("x", F32, [1, 4])],
                 [tensor("h_final", F32, [1, 4]), tensor("h_trace", F32, [3, 1, 4])],
                 [init("trips", np.array(3, np.int64)), init("keep_going", np.array(True)),
                  init("W_loop", randn([4, 4], 3, 0.7))])


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_loop_body_matmul_with_loop_carried_float_state(precision, keep_io):
    m = loop_model()
    H.check(m)
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    e = C.entry(result, "loop_mm")
    assert e.precision == precision and e.graph != "main"
    assert C.entry(result, "loop").precision == "unchanged"
    # The loop-carried value keeps one type: the body's h input and h output stay float, as
    # do the Loop's own input and outputs (the body casts around its MatMul).
    gt = C.graph_types(out)
    body_path = next(p for p in gt if p.endswith("body"))
    assert gt[body_path]["h_in"] == F32
    assert gt[body_path]["h_out"] == F32
    assert gt[body_path]["loop_mm_out"] == F32   # a body output: keeps its declared type
    assert C.initializer(out.graph, "W_loop").data_type == target
    assert C.output_types(out) == {"h_final": F32, "h_trace": F32}
    C.compare_runs(m, out, {"x": randn([1, 4], 4)}, precision)


def duplicate_init_model():
    """Each If branch defines its own initializer named "w" (different values). The then
    branch also reads its w from a fp32 op (ReduceSum) so it needs an fp16 copy, the else
    branch converts its w in place."""
    w_then, w_else = randn([4, 4], 10), randn([4, 4], 11) * 3
    then_g = helper.make_graph(
        [node("MatMul", ["x", "w"], ["t_mm"], "then_mm"),
         node("ReduceSum", ["w"], ["t_sum"], "then_wsum", keepdims=0),
         node("Add", ["t_mm", "t_sum"], ["then_out"], "then_add")],
        "then_body", [], [tensor("then_out", F32, [2, 4])], [init("w", w_then)])
    else_g = helper.make_graph(
        [node("MatMul", ["x", "w"], ["else_out"], "else_mm")],
        "else_body", [], [tensor("else_out", F32, [2, 4])], [init("w", w_else)])
    nodes = [node("If", ["cond"], ["y"], "pick", then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [tensor("x", F32, [2, 4]), tensor("cond", TensorProto.BOOL, [])], [tensor("y", F32, [2, 4])])
    return m, w_then, w_else


@pytest.mark.parametrize("precision", PRECISIONS)
def test_duplicate_initializer_names_across_branches(precision):
    m, w_then, w_else = duplicate_init_model()
    H.check(m)
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    assert C.entry(result, "then_mm").precision == precision
    assert C.entry(result, "else_mm").precision == precision
    assert C.entry(result, "then_wsum").precision == "fp32"
    then_g, else_g = C.body(out, "pick", "then_branch"), C.body(out, "pick", "else_branch")
    # then: original fp32 "w" for ReduceSum plus one low-precision copy for the MatMul,
    # both made from the then branch's own values.
    then_inits = {t.name: t for t in then_g.initializer}
    assert then_inits["w"].data_type == F32
    np.testing.assert_array_equal(C.as_float(then_inits["w"]), w_then)
    low = [t for t in then_g.initializer if t.data_type == target]
    assert len(low) == 1
    np.testing.assert_array_equal(C.as_float(low[0]), C.round_to(w_then, target))
    mm = H.node_by_name(out, "then_mm", then_g)
    assert mm.input[1] == low[0].name
    assert H.node_by_name(out, "then_wsum", then_g).input[0] == "w"
    # else: its own "w", converted in place, with the else values.
    else_w = C.initializer(else_g, "w")
    assert else_w.data_type == target
    np.testing.assert_array_equal(C.as_float(else_w), C.round_to(w_else, target))
    assert len(else_g.initializer) == 1
    for cond in (True, False):
        C.compare_runs(m, out, {"x": randn([2, 4], 12), "cond": np.array(cond)}, precision)


# =========================================================================================
# 2. Shared initializers
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_initializer_shared_by_low_and_fp32_consumer_gets_a_copy(precision, keep_io):
    W = randn([4, 4], 20)
    m = model([node("MatMul", ["x", "W"], ["y"], "proj"),
               node("ReduceSum", ["W"], ["s"], "w_sum", keepdims=0)],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4]), tensor("s", F32, [])], [init("W", W)])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "proj").precision == precision
    assert C.entry(result, "w_sum").precision == "fp32"
    inits = {t.name: t for t in out.graph.initializer}
    assert len(inits) == 2
    assert inits["W"].data_type == F32
    np.testing.assert_array_equal(C.as_float(inits["W"]), W)
    (copy_name,) = [n for n, t in inits.items() if t.data_type == target]
    np.testing.assert_array_equal(C.as_float(inits[copy_name]), C.round_to(W, target))
    assert H.node_by_name(out, "proj").input[1] == copy_name
    assert H.node_by_name(out, "w_sum").input[0] == "W"
    # No Cast node reads the weight: initializers are converted offline.
    assert not [n for n in C.casts(out) if n.input[0] == "W"]
    assert result.stats.casts_added == (2 if keep_io else 0)   # x in, y out
    ref, got = C.compare_runs(m, out, {"x": randn([2, 4], 21)}, precision)
    if got is not None:
        np.testing.assert_array_equal(got[1], ref[1])   # the fp32 path is exact


@pytest.mark.parametrize("precision", PRECISIONS)
def test_initializer_shared_by_two_matmuls_converted_once(precision):
    W = randn([4, 4], 22, 0.5)
    m = model([node("MatMul", ["x", "W"], ["a"], "mm_a"),
               node("Relu", ["a"], ["r"], "act"),
               node("MatMul", ["r", "W"], ["y"], "mm_b")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])], [init("W", W)])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    assert [t.name for t in out.graph.initializer] == ["W"]
    assert out.graph.initializer[0].data_type == target
    np.testing.assert_array_equal(C.as_float(out.graph.initializer[0]), C.round_to(W, target))
    assert H.node_by_name(out, "mm_a").input[1] == "W" and H.node_by_name(out, "mm_b").input[1] == "W"
    assert result.stats.initializers_converted == 1 and result.stats.initializer_copies == 0
    assert result.stats.casts_added == 2
    C.compare_runs(m, out, {"x": randn([2, 4], 23)}, precision)


# =========================================================================================
# 3. Casts written by the model's author
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_author_cast_to_float_between_low_ops_is_retargeted(precision, keep_io):
    m = model([node("MatMul", ["x", "W1"], ["a"], "mm1"),
               node("Cast", ["a"], ["a32"], "author_cast", to=F32),
               node("Add", ["a32", "bias"], ["b"], "bias_add"),
               node("MatMul", ["b", "W2"], ["y"], "mm2")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W1", randn([4, 4], 30)), init("W2", randn([4, 4], 31)), init("bias", randn([4], 32))])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    for name in ("mm1", "author_cast", "bias_add", "mm2"):
        assert C.entry(result, name).precision == precision, name
    cast = H.node_by_name(out, "author_cast")
    assert C.cast_to(cast) == target
    assert cast.input[0] == "a" and H.node_by_name(out, "bias_add").input[0] == "a32"
    assert result.stats.casts_added == (2 if keep_io else 0)
    assert len(C.casts(out)) == 1 + result.stats.casts_added
    C.compare_runs(m, out, {"x": randn([2, 4], 33)}, precision)


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_author_cast_guarding_softmax_stays_float(precision, keep_io):
    m = model([node("MatMul", ["x", "W"], ["s"], "scores"),
               node("Cast", ["s"], ["s32"], "guard_cast", to=F32),
               node("Softmax", ["s32"], ["y"], "probs", axis=-1)],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])], [init("W", randn([4, 4], 34))])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "scores").precision == precision
    assert C.entry(result, "probs").precision == "fp32"
    guard = H.node_by_name(out, "guard_cast")
    assert C.cast_to(guard) == F32
    assert guard.input[0] == "s"
    assert H.node_by_name(out, "probs").input[0] == "s32"   # no new cast before Softmax
    assert H.types(out)["s"] == target
    assert result.stats.casts_added == (1 if keep_io else 0)   # only x -> low
    assert len(C.casts(out)) == 1 + result.stats.casts_added
    C.compare_runs(m, out, {"x": randn([2, 4], 35)}, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_author_int_truncation_is_preserved(precision):
    # x @ diag(1.5) with small integer x gives exact k.5 / k.0 values in fp16 and bf16,
    # so the truncation result is exact in every precision.
    m = model([node("MatMul", ["x", "W"], ["a"], "mm"),
               node("Cast", ["a"], ["a_int"], "to_int", to=TensorProto.INT32),
               node("Cast", ["a_int"], ["a_trunc"], "to_float", to=F32),
               node("MatMul", ["a_trunc", "I"], ["y"], "mm2")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W", np.diag([1.5] * 4).astype(np.float32)), init("I", np.eye(4, dtype=np.float32))])
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    to_int = H.node_by_name(out, "to_int")
    assert C.cast_to(to_int) == TensorProto.INT32
    assert H.node_by_name(out, "to_float").input[0] == "a_int"
    assert H.types(out)["a_int"] == TensorProto.INT32
    x = rng(36).integers(-5, 6, size=(2, 4)).astype(np.float32)
    ref, got = C.compare_runs(m, out, {"x": x}, precision)
    np.testing.assert_array_equal(ref[0], np.trunc(x * 1.5))
    if got is not None:
        np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_author_lossy_round_trip_is_not_folded(precision):
    """x -> Cast(FLOAT16) -> Cast(FLOAT) -> ReduceSum: the author rounds x to fp16 on purpose.
    A MatMul elsewhere makes the converter do work on the graph."""
    m = model([node("Cast", ["x"], ["x16"], "author_down", to=F16),
               node("Cast", ["x16"], ["x32"], "author_up", to=F32),
               node("ReduceSum", ["x32"], ["s"], "total", keepdims=0),
               node("MatMul", ["x", "W"], ["y"], "mm")],
              [tensor("x", F32, [1, 4])], [tensor("s", F32, []), tensor("y", F32, [1, 4])],
              [init("W", randn([4, 4], 37))])
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    down, up = H.node_by_name(out, "author_down"), H.node_by_name(out, "author_up")
    assert C.cast_to(down) == F16 and C.cast_to(up) == F32
    assert down.input[0] == "x" and up.input[0] == "x16" and H.node_by_name(out, "total").input[0] == "x32"
    # 1 + 2^-12 etc. are not fp16 values: the author's rounding must still show in the output.
    x = np.array([[1 + 2 ** -12, 3 + 2 ** -10, -2 - 2 ** -11, 1000.3]], np.float32)
    ref, got = C.compare_runs(m, out, {"x": x}, precision)
    assert ref[0] == np.float32(x.astype(np.float16).astype(np.float32).sum())
    if got is not None:
        assert got[0] == ref[0]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_author_fp16_round_trip_after_matmul_keeps_both_casts(precision):
    """MatMul -> Cast(FLOAT16) -> Cast(FLOAT) -> Softmax: the author's explicit fp16 rounding
    stays an fp16 rounding (even when converting to bf16) and the cast back stays FLOAT."""
    m = model([node("MatMul", ["x", "W"], ["s"], "scores"),
               node("Cast", ["s"], ["s16"], "author_down", to=F16),
               node("Cast", ["s16"], ["s32"], "author_up", to=F32),
               node("Softmax", ["s32"], ["y"], "probs", axis=-1)],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])], [init("W", randn([4, 4], 38))])
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    assert C.cast_to(H.node_by_name(out, "author_down")) == F16
    assert C.cast_to(H.node_by_name(out, "author_up")) == F32
    assert H.node_by_name(out, "probs").input[0] == "s32"
    assert H.types(out)["s16"] == F16
    C.compare_runs(m, out, {"x": randn([2, 4], 39)}, precision)


# =========================================================================================
# 4. Nodes whose output type is an attribute
# =========================================================================================
# ConstantOfShape admits bf16 values from opset 21 on; at opset 17 a bf16 conversion must keep
# the fill fp32 and cast it (one Cast), an fp16 conversion retargets the value attribute.
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 17), ("bf16", 21)])
def test_constant_of_shape_value_retargeted(precision, opset, keep_io):
    value = helper.make_tensor("value", F32, [1], [0.5])
    m = model([node("MatMul", ["x", "W"], ["a"], "mm"),
               node("ConstantOfShape", ["shape"], ["f"], "fill", value=value),
               node("Add", ["a", "f"], ["b"], "fill_add"),
               node("MatMul", ["b", "W2"], ["y"], "mm2")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W", randn([4, 4], 40)), init("W2", randn([4, 4], 41)), init("shape", np.array([2, 4], np.int64))],
              opset=opset)
    H.check(m)
    target = C.TARGET[precision]
    retarget = not (precision == "bf16" and opset < 21)
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "fill_add").precision == precision
    fill = H.node_by_name(out, "fill")
    t = C.attr(fill, "value").t
    np.testing.assert_array_equal(C.as_float(t), [0.5])
    types = H.types(out)
    assert types["b"] == target
    io_casts = 2 if keep_io else 0
    if retarget:
        assert C.entry(result, "fill").precision == precision
        assert t.data_type == target and types["f"] == target
        assert [n.op_type for n in C.consumers(out.graph, "f")] == ["Add"]
        assert result.stats.casts_added == io_casts
    else:
        assert C.entry(result, "fill").precision in ("fp32", "unchanged")
        assert t.data_type == F32 and types["f"] == F32
        (cast,) = C.consumers(out.graph, "f")
        assert cast.op_type == "Cast" and C.cast_to(cast) == target
        assert result.stats.casts_added == io_casts + 1
    C.compare_runs(m, out, {"x": randn([2, 4], 42)}, precision)


def eye_noise_model(opset=17):
    return model([node("MatMul", ["x", "W"], ["a"], "mm"),
                  node("EyeLike", ["x"], ["e"], "eye", dtype=F32),
                  node("Add", ["a", "e"], ["b"], "add_eye"),
                  node("MatMul", ["b", "W2"], ["c"], "mm2"),
                  node("RandomNormalLike", ["c"], ["n"], "noise", dtype=F32, seed=7.0, scale=0.1),
                  node("Add", ["c", "n"], ["y"], "add_noise")],
                 [tensor("x", F32, [4, 4])], [tensor("y", F32, [4, 4])],
                 [init("W", randn([4, 4], 43)), init("W2", randn([4, 4], 44))], opset=opset)


# EyeLike and RandomNormalLike admit bf16 from opset 22 on (see the next test for opset 17).
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 22)])
def test_eyelike_and_random_normal_like_dtype_attrs(precision, opset, keep_io):
    m = eye_noise_model(opset)
    H.check(m)
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    # EyeLike is keep_fp32 in the default rules: ONNX Runtime has no float16 EyeLike kernel
    # (CPU or CUDA), so an fp16 EyeLike would not run. Its fp32 output taints the Add.
    assert C.entry(result, "eye").precision == "fp32"
    assert C.entry(result, "add_eye").precision == "fp32"
    assert C.entry(result, "mm2").precision == precision
    assert C.entry(result, "noise").precision == "fp32"          # random ops stay fp32
    assert C.entry(result, "add_noise").precision == "fp32"      # fed by an fp32 node
    types = H.types(out)
    eye, noise = H.node_by_name(out, "eye"), H.node_by_name(out, "noise")
    # dtype attributes agree with the types the graph computes
    assert C.attr(eye, "dtype").i == F32 == types["e"]
    assert C.attr(noise, "dtype").i == F32 == types["n"]
    assert types["b"] == F32 and types["y"] == F32
    # RandomNormalLike only reads its input's shape: it takes the low-precision c as it is.
    assert noise.input[0] == "c"
    # Seeded RNG in fp32 in both models: same noise, outputs comparable. (Not for the opset-22
    # bf16 model: the CPU EP has no bf16 kernels and no RandomNormalLike-22 kernel at all, so
    # not even the fp32 original runs.)
    if precision == "fp16":
        C.compare_runs(m, out, {"x": randn([4, 4], 45)}, precision)


@pytest.mark.parametrize("keep_io", KEEP_IO)
def test_dtype_attr_ops_whose_schema_lacks_bf16(keep_io):
    """Opset 17: EyeLike and RandomNormalLike admit neither a bf16 input (T1) nor a bf16 dtype
    (T2). A bf16 conversion keeps both fp32, must not feed them a bf16 tensor (the model would
    be invalid), and the fp32 random values still make their consumer fp32."""
    m = eye_noise_model(17)
    result = autocast_onnx.convert(m, precision="bf16", keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "mm").precision == "bf16" and C.entry(result, "mm2").precision == "bf16"
    assert C.entry(result, "eye").precision in ("fp32", "unchanged")
    assert C.entry(result, "noise").precision == "fp32"
    assert C.entry(result, "add_noise").precision == "fp32"
    types = H.types(out)
    eye, noise = H.node_by_name(out, "eye"), H.node_by_name(out, "noise")
    assert C.attr(eye, "dtype").i == F32 == types["e"]
    assert C.attr(noise, "dtype").i == F32 == types["n"]
    assert types[eye.input[0]] != BF16 and types[noise.input[0]] != BF16
    assert types["y"] == F32


# =========================================================================================
# 5. Resize: roi and scales are coordinates
# =========================================================================================
# Conv admits bf16 from opset 22 on: the bf16 case uses opset 22 so that the region converts.
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 22)])
def test_resize_scales_and_roi_stay_float(precision, opset, keep_io):
    roi = np.array([0, 0, 0.1, 0.1, 1, 1, 0.9, 0.9], np.float32)
    scales = np.array([1, 1, 2, 2], np.float32)
    m = model([node("Conv", ["x", "Wc1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
               node("Resize", ["c1", "roi", "scales"], ["r"], "upsample", mode="linear",
                    coordinate_transformation_mode="tf_crop_and_resize"),
               node("Conv", ["r", "Wc2"], ["y"], "conv2", pads=[1, 1, 1, 1])],
              [tensor("x", F32, [1, 2, 4, 4])], [tensor("y", F32, [1, 2, 8, 8])],
              [init("Wc1", randn([2, 2, 3, 3], 50, 0.3)), init("roi", roi), init("scales", scales),
               init("Wc2", randn([2, 2, 3, 3], 51, 0.3))], opset=opset)
    H.check(m)
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    for name in ("conv1", "upsample", "conv2"):
        assert C.entry(result, name).precision == precision, name
    resize = H.node_by_name(out, "upsample")
    types = H.types(out)
    assert types[resize.input[0]] == target
    for port, name, values in ((1, "roi", roi), (2, "scales", scales)):
        assert resize.input[port] == name, "roi/scales must be read straight from the fp32 initializer"
        t = C.initializer(out.graph, name)
        assert t.data_type == F32
        np.testing.assert_array_equal(C.as_float(t), values)
    assert not [n for n in C.casts(out) if n.input[0] in ("roi", "scales")]
    assert result.stats.casts_added == (2 if keep_io else 0)
    C.compare_runs(m, out, {"x": randn([1, 2, 4, 4], 52)}, precision)


# =========================================================================================
# 6. Graph output that is also consumed inside the graph
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_graph_output_also_consumed_internally(precision, keep_io):
    """h = MatMul(x) is a graph output, feeds another MatMul and a Softmax (fp32)."""
    m = model([node("MatMul", ["x", "W1"], ["h"], "mm1"),
               node("MatMul", ["h", "W2"], ["y"], "mm2"),
               node("Softmax", ["h"], ["p"], "h_softmax", axis=-1)],
              [tensor("x", F32, [2, 4])],
              [tensor("h", F32, [2, 4]), tensor("y", F32, [2, 4]), tensor("p", F32, [2, 4])],
              [init("W1", randn([4, 4], 60)), init("W2", randn([4, 4], 61))])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert [o.name for o in out.graph.output] == ["h", "y", "p"]
    assert C.entry(result, "mm1").precision == precision and C.entry(result, "mm2").precision == precision
    assert C.entry(result, "h_softmax").precision == "fp32"
    mm2, sm = H.node_by_name(out, "mm2"), H.node_by_name(out, "h_softmax")
    types = H.types(out)
    assert types[mm2.input[0]] == target and types[sm.input[0]] == F32
    if keep_io:
        assert C.output_types(out) == {"h": F32, "y": F32, "p": F32}
        # mm2 reads mm1's low-precision result directly, not the fp32 output cast back down;
        # the Softmax reads the fp32 graph output itself (one cast per tensor and type)
        assert C.producer(out.graph, mm2.input[0]).name == "mm1"
        assert sm.input[0] == "h"
        assert result.stats.casts_added == 3   # x in, h out, y out
    else:
        assert C.output_types(out) == {"h": target, "y": target, "p": F32}
        assert mm2.input[0] == "h"
        assert result.stats.casts_added == 1   # h -> fp32 for the Softmax
    C.compare_runs(m, out, {"x": randn([2, 4], 62)}, precision)


# =========================================================================================
# 7. Graph output that is an initializer
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_graph_output_from_initializer(precision, keep_io):
    W = randn([4, 4], 70) + np.float32(2 ** -13)   # values that are not exact in fp16/bf16
    m = model([node("MatMul", ["x", "W"], ["y"], "proj")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4]), tensor("W", F32, [4, 4])], [init("W", W)])
    H.check(m)
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert C.entry(result, "proj").precision == precision
    assert [o.name for o in out.graph.output] == ["y", "W"]
    # The weight output keeps its type and its exact values; the MatMul gets a low copy.
    assert C.output_types(out)["W"] == F32
    assert C.initializer(out.graph, "W").data_type == F32
    np.testing.assert_array_equal(C.as_float(C.initializer(out.graph, "W")), W)
    ref, got = C.compare_runs(m, out, {"x": randn([2, 4], 71)}, precision)
    if got is not None:
        np.testing.assert_array_equal(got[1], W)


# =========================================================================================
# 8. Contrib ops without type inference, unknown custom ops
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_contrib_ops_without_value_info(precision, keep_io):
    ms = "com.microsoft"
    m = model([node("MatMul", ["x", "W1"], ["a"], "mm1"),
               node("BiasGelu", ["a", "bias"], ["g"], "bias_gelu", domain=ms),
               node("FusedMatMul", ["g", "W2"], ["f"], "fused_mm", domain=ms, alpha=0.5, transB=1),
               node("Gelu", ["f"], ["g2"], "gelu", domain=ms),
               node("MatMul", ["g2", "W3"], ["y"], "mm_out")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W1", randn([4, 4], 80)), init("bias", randn([4], 81)), init("W2", randn([4, 4], 82)),
               init("W3", randn([4, 4], 83))], extra_opsets=[(ms, 1)])
    assert not m.graph.value_info
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    for name in ("mm1", "bias_gelu", "fused_mm", "gelu", "mm_out"):
        assert C.entry(result, name).precision == precision, name
    assert "unknown-type" not in C.warning_codes(result) and "unknown-op" not in C.warning_codes(result)
    for name in ("W1", "bias", "W2", "W3"):
        assert C.initializer(out.graph, name).data_type == target
    assert result.stats.casts_added == (2 if keep_io else 0)
    C.compare_runs(m, out, {"x": randn([2, 4], 84)}, precision)


def unknown_op_model(declare_type):
    vi = [tensor("foo_out", F32, [2, 4])] if declare_type else []
    return model([node("MatMul", ["x", "W1"], ["a"], "mm"),
                  node("Foo", ["a"], ["foo_out"], "foo", domain="my.domain"),
                  node("MatMul", ["foo_out", "W2"], ["y"], "mm2")],
                 [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
                 [init("W1", randn([4, 4], 85)), init("W2", randn([4, 4], 86))],
                 extra_opsets=[("my.domain", 1)], value_info=vi)


@pytest.mark.parametrize("declare_type", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_unknown_custom_op(precision, declare_type):
    m = unknown_op_model(declare_type)
    # The full check passes: the ONNX checker and strict shape inference skip nodes of a domain
    # they have no schema for (nothing to check them against), so full_check=False is not
    # needed. The model cannot be run: ONNX Runtime has no kernel for my.domain:Foo.
    H.check(m)
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    foo = C.entry(result, "foo")
    assert foo.precision in ("fp32", "unchanged")
    assert "unknown-op" in C.reason_codes(result, "foo")
    warnings = [w for w in result.plan.warnings if w.code == "unknown-op"]
    assert len(warnings) == 1 and "my.domain:Foo" in warnings[0].message
    assert C.entry(result, "mm").precision == precision
    # Foo is fed exactly what it was fed before: fp32.
    foo_node = H.node_by_name(out, "foo")
    types = H.types(out)
    assert types[foo_node.input[0]] == F32
    if declare_type:
        # the declared fp32 output lets the MatMul after Foo convert
        assert foo.precision == "fp32"
        assert C.entry(result, "mm2").precision == precision
        assert types["foo_out"] == F32
    else:
        # Foo's output type is unknown: the MatMul after it cannot be typed and is left alone
        assert "unknown-type" in C.warning_codes(result)
        assert C.entry(result, "mm2").precision == "unchanged"
        assert H.node_by_name(out, "mm2").input[0] == "foo_out"
    assert C.output_types(out)["y"] == F32


# =========================================================================================
# 9. Already-converted models and idempotence
# =========================================================================================
def fp16_model():
    return model([node("MatMul", ["x", "W"], ["s"], "mm"),
                  node("Softmax", ["s"], ["y"], "sm", axis=-1)],
                 [tensor("x", F16, [2, 4])], [tensor("y", F16, [2, 4])],
                 [init("W", randn([4, 4], 90).astype(np.float16))])


def test_already_fp16_model_softmax_goes_fp32_and_is_idempotent():
    m = fp16_model()
    H.check(m)
    r1 = autocast_onnx.convert(m, precision="fp16")
    out = converted_ok(r1)
    assert C.entry(r1, "mm").precision == "fp16"
    assert C.entry(r1, "sm").precision == "fp32"
    types = H.types(out)
    sm = H.node_by_name(out, "sm")
    assert types[sm.input[0]] == F32 and types[sm.output[0]] == F32
    assert C.input_types(out) == {"x": F16} and C.output_types(out) == {"y": F16}
    assert C.initializer(out.graph, "W").data_type == F16
    assert r1.stats.casts_added == 2     # s -> fp32 for Softmax, Softmax result -> fp16 output
    x = randn([2, 4], 91).astype(np.float16)
    ref = H.run(m, {"x": x})[0]
    got = H.run(out, {"x": x})[0]
    assert got.dtype == np.float16
    C.assert_close(got, ref, "fp16")
    r2 = autocast_onnx.convert(out, precision="fp16")
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == out.SerializeToString()


def mixed_model():
    return model([node("MatMul", ["x", "Wq"], ["q"], "q_proj"),
                  node("MatMul", ["q", "Wk"], ["s"], "attn_scores"),
                  node("Add", ["s", "mask"], ["sm_in"], "mask_add"),
                  node("Softmax", ["sm_in"], ["p"], "attn_softmax", axis=-1),
                  node("MatMul", ["p", "Wv"], ["o"], "attn_out"),
                  node("ReduceMean", ["o"], ["mean"], "mean", axes=[-1]),
                  node("Sub", ["o", "mean"], ["y"], "center")],
                 [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
                 [init("Wq", randn([4, 4], 92)), init("Wk", randn([4, 4], 93)), init("Wv", randn([4, 4], 94)),
                  init("mask", np.array([0, 0, -1e9, 0], np.float32))])


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_convert_twice_is_byte_identical(precision, keep_io):
    m = mixed_model()
    r1 = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    converted_ok(r1)
    assert r1.stats.casts_added > 0
    r2 = autocast_onnx.convert(r1.model, precision=precision, keep_io_types=keep_io)
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == r1.model.SerializeToString()


IDEMPOTENCE_MODELS = {"if": if_model, "loop": loop_model, "dup_init": lambda: duplicate_init_model()[0],
                      "eye_noise": eye_noise_model, "unknown_op": lambda: unknown_op_model(True)}


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("case", sorted(IDEMPOTENCE_MODELS))
def test_convert_twice_is_byte_identical_other_graphs(case, keep_io):
    """Idempotence on the subgraph, dtype-attribute and custom-op graphs above (fp16)."""
    m = IDEMPOTENCE_MODELS[case]()
    r1 = autocast_onnx.convert(m, precision="fp16", keep_io_types=keep_io)
    r2 = autocast_onnx.convert(r1.model, precision="fp16", keep_io_types=keep_io)
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == r1.model.SerializeToString()


# =========================================================================================
# 10. Names of the casts the converter creates
# =========================================================================================
@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_unnamed_nodes(precision, keep_io):
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"]),
             helper.make_node("Softmax", ["a"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "W2"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    m = model(nodes, [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W1", randn([4, 4], 100)), init("W2", randn([4, 4], 101))])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    assert [n.precision for n in result.plan.nodes] == [precision, "fp32", precision, precision]
    dup_t, dup_n = C.unique_names_ok(out)
    assert dup_t == [] and dup_n == []
    types = H.types(out)
    assert types["a"] == target and types["p"] == F32 and types["b"] == target
    # a -> fp32 for Softmax, p -> low for the MatMul, plus x in / y out with keep_io
    assert result.stats.casts_added == (4 if keep_io else 2)
    C.compare_runs(m, out, {"x": randn([2, 4], 102)}, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tensor_with_two_low_consumers_gets_one_cast(precision):
    m = model([node("Relu", ["x"], ["r"], "pre_act"),
               node("Softmax", ["r"], ["p"], "pre_softmax", axis=-1),
               node("MatMul", ["p", "W1"], ["a"], "mm_a"),
               node("MatMul", ["p", "W2"], ["b"], "mm_b"),
               node("Add", ["a", "b"], ["y"], "sum")],
              [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
              [init("W1", randn([4, 4], 103)), init("W2", randn([4, 4], 104))])
    target = C.TARGET[precision]
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    p_casts = [n for n in C.casts(out) if n.input[0] == "p"]
    assert len(p_casts) == 1 and C.cast_to(p_casts[0]) == target
    cast_out = p_casts[0].output[0]
    assert H.node_by_name(out, "mm_a").input[0] == cast_out == H.node_by_name(out, "mm_b").input[0]
    assert result.stats.casts_added == 2   # p -> low, y -> fp32 output
    C.compare_runs(m, out, {"x": randn([2, 4], 105)}, precision)


@pytest.mark.parametrize("keep_io", KEEP_IO)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_existing_names_like_generated_casts(precision, keep_io):
    """Tensors and nodes already named x_fp16, x_bf16, W_fp16, W_bf16, y_fp16, y_bf16..."""
    taken = [f"{base}_{p}" for base in ("x", "W", "y", "a") for p in ("fp16", "bf16", "fp32")]
    nodes = [node("MatMul", ["x", "W"], ["a"], "x_fp16"),              # node names like cast names
             node("Relu", ["a"], ["x_fp16"], "W_fp16"),                # tensor named x_fp16
             node("Relu", ["x_fp16"], ["x_bf16"], "x_bf16"),
             node("Relu", ["x_bf16"], ["W_fp16"], "W_bf16"),           # tensor named W_fp16
             node("Relu", ["W_fp16"], ["W_bf16"], "y_fp16"),
             node("Add", ["W_bf16", "a_fp16"], ["y_fp16"], "y_bf16"),  # a_fp16: an input
             node("Softmax", ["y_fp16"], ["y_bf16"], "a_fp16", axis=-1),
             node("MatMul", ["y_bf16", "W"], ["y"], "a_bf16"),
             node("ReduceSum", ["W"], ["w_sum"], "W_fp32", keepdims=0)]  # W also needed in fp32
    m = model(nodes, [tensor("x", F32, [2, 4]), tensor("a_fp16", F32, [2, 4])],
              [tensor("y", F32, [2, 4]), tensor("w_sum", F32, []), tensor("y_fp32", F32, [2, 4])],
              [init("W", randn([4, 4], 106))])
    # y_fp32 as a graph output name taken too (an Identity of the softmax result)
    m.graph.node.append(node("Identity", ["y_bf16"], ["y_fp32"], "a_fp32"))
    H.check(m)
    result = autocast_onnx.convert(m, precision=precision, keep_io_types=keep_io)
    out = converted_ok(result)
    dup_t, dup_n = C.unique_names_ok(out)
    assert dup_t == [] and dup_n == []
    assert [o.name for o in out.graph.output] == ["y", "w_sum", "y_fp32"]
    new = {n.name for n in C.casts(out)}
    assert not new & set(taken)
    feeds = {"x": randn([2, 4], 107), "a_fp16": randn([2, 4], 108)}
    C.compare_runs(m, out, feeds, precision)


# =========================================================================================
# 11. Constants out of the low-precision range
# =========================================================================================
def attention_mask_model():
    mask = np.zeros([2, 4], np.float32)
    mask[:, 3] = -1e9
    return model([node("MatMul", ["x", "Wk"], ["s"], "attn_scores"),
                  node("Add", ["s", "mask"], ["masked"], "mask_add"),
                  node("Softmax", ["masked"], ["p"], "attn_softmax", axis=-1),
                  node("MatMul", ["p", "Wv"], ["y"], "attn_out")],
                 [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
                 [init("Wk", randn([4, 4], 110)), init("mask", mask), init("Wv", randn([4, 4], 111))])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_attention_mask_out_of_range_stays_fp32(precision):
    m = attention_mask_model()
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    assert C.entry(result, "attn_scores").precision == precision
    assert C.entry(result, "attn_softmax").precision == "fp32"
    assert C.entry(result, "attn_out").precision == precision
    mask = C.initializer(out.graph, "mask")
    if precision == "fp16":
        # -1e9 is beyond fp16 (65504): the Add stays fp32, with the measured value as reason.
        assert C.entry(result, "mask_add").precision == "fp32"
        reasons = [r for r in C.entry(result, "mask_add").reasons if r.code == "data-range"]
        assert len(reasons) == 1 and reasons[0].value == pytest.approx(1e9)
        assert mask.data_type == F32
        np.testing.assert_array_equal(C.as_float(mask)[:, 3], -1e9)
    else:
        # -1e9 is well inside bf16's range: nothing to keep fp32 for
        assert "data-range" not in C.reason_codes(result, "mask_add")
    C.compare_runs(m, out, {"x": randn([2, 4], 112)}, precision)


def epsilon_model():
    return model([node("MatMul", ["x", "W1"], ["a"], "mm1"),
                  node("Add", ["a", "eps"], ["b"], "eps_add"),
                  node("MatMul", ["b", "W2"], ["y"], "mm2")],
                 [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])],
                 [init("W1", randn([4, 4], 113)), init("eps", np.array([1e-12], np.float32)),
                  init("W2", randn([4, 4], 114))])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_tiny_epsilon_keeps_add_fp32(precision):
    m = epsilon_model()
    result = autocast_onnx.convert(m, precision=precision)
    out = converted_ok(result)
    assert C.entry(result, "mm1").precision == precision and C.entry(result, "mm2").precision == precision
    if precision == "fp16":
        assert C.entry(result, "eps_add").precision == "fp32"
        assert "data-flush" in C.reason_codes(result, "eps_add")
        eps = C.initializer(out.graph, "eps")
        assert eps.data_type == F32 and C.as_float(eps)[0] == np.float32(1e-12)
        assert H.types(out)["b"] == F32
    else:
        # 1e-12 is a normal bf16 number
        assert C.entry(result, "eps_add").precision == "bf16"
        assert "data-flush" not in C.reason_codes(result, "eps_add")
    C.compare_runs(m, out, {"x": randn([2, 4], 115)}, precision)


def test_forced_low_mask_add_warns_and_clamps():
    m = attention_mask_model()
    result = autocast_onnx.convert(m, precision="fp16", include_nodes=["^mask_add$"])
    out = converted_ok(result)
    assert C.entry(result, "mask_add").precision == "fp16"
    codes = C.reason_codes(result, "mask_add")
    assert "cli-include" in codes and "data-range" in codes
    warns = [w for w in result.plan.warnings if w.code == "data-range"]
    assert len(warns) == 1 and warns[0].node == "mask_add"
    mask = C.as_float(C.initializer(out.graph, "mask"))
    assert C.initializer(out.graph, "mask").data_type == F16
    assert np.all(np.isfinite(mask))
    np.testing.assert_array_equal(mask[:, 3], -65504.0)
    assert result.stats.clamped_values == 2
    assert C.entry(result, "attn_softmax").precision == "fp32"
    x = randn([2, 4], 116)
    ref = H.run(m, {"x": x})[0]
    got = H.run(out, {"x": x})[0]
    C.assert_close(got, ref, "fp16")


def test_forced_low_epsilon_warns():
    m = epsilon_model()
    result = autocast_onnx.convert(m, precision="fp16", include_nodes=["eps_add"])
    out = converted_ok(result)
    assert C.entry(result, "eps_add").precision == "fp16"
    assert [w.node for w in result.plan.warnings if w.code == "data-flush"] == ["eps_add"]
    assert C.initializer(out.graph, "eps").data_type == F16
    x = randn([2, 4], 117)
    C.assert_close(H.run(out, {"x": x})[0], H.run(m, {"x": x})[0], "fp16")


# =========================================================================================
# 12. Bad input on the command line
# =========================================================================================
def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def good_model_file(path):
    W = randn([64, 64], 120)
    m = model([node("MatMul", ["x", "W"], ["y"], "mm")], [tensor("x", F32, [2, 64])], [tensor("y", F32, [2, 64])],
              [init("W", W)])
    path.write_bytes(m.SerializeToString())
    return path


def cli_run(args):
    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli

    result = CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=True)
    return result.exit_code, result.stdout, result.stderr, result.exception


def assert_one_line_error(code, stderr, exception=None):
    assert code == 2, (code, stderr, exception)
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("autocast-onnx: error:")


def bad_model_cases(tmp_path):
    cases = {}
    p = tmp_path / "text.onnx"
    p.write_text("this is not an onnx model\n" * 10)
    cases["not_onnx"] = p
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    cases["empty"] = p
    good = good_model_file(tmp_path / "good.onnx")
    data = good.read_bytes()
    p = tmp_path / "truncated.onnx"
    p.write_bytes(data[: len(data) // 2])
    cases["truncated"] = p
    d = tmp_path / "adir.onnx"
    d.mkdir()
    cases["directory"] = d
    cases["missing"] = tmp_path / "missing.onnx"
    return cases


BAD_RULES = {
    "unknown_key": "[settings]\nunknown_op = \"keep_fp32\"\nfavourite_colour = \"blue\"\n",
    "unknown_table": "[oops]\nMatMul = \"x\"\n",
    "two_categories": "[ops.keep_fp32]\nMatMul = \"keep\"\n\n[ops.follow]\nMatMul = \"follow\"\n",
    "bad_regex": "[[nodes]]\nmatch = \"attn_(\"\nprecision = \"fp32\"\n",
}
# what the one error line must mention (rule file and line come first)
RULE_ERRORS = {"unknown_key": ("rules.toml:3", "favourite_colour"), "unknown_table": ("rules.toml:1", "oops"),
               "two_categories": ("rules.toml:5", "two categories"), "bad_regex": ("rules.toml:1", "regex")}


MODEL_ERRORS = {"not_onnx": "not an ONNX model", "empty": "empty", "truncated": "not an ONNX model",
                "directory": "directory", "missing": "not found"}


@pytest.mark.parametrize("case", sorted(MODEL_ERRORS))
def test_cli_bad_model_input(tmp_path, case):
    path = bad_model_cases(tmp_path)[case]
    out = tmp_path / "out.onnx"
    before = sha(path)
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, _, stderr, exc = cli_run([path, "-o", out])
    assert_one_line_error(code, stderr, exc)
    assert MODEL_ERRORS[case] in stderr and path.name in stderr
    assert not out.exists()
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing   # no temp files left behind


@pytest.mark.parametrize("case", sorted(BAD_RULES))
def test_cli_bad_rule_file(tmp_path, case):
    model_path = good_model_file(tmp_path / "good.onnx")
    rules = tmp_path / "rules.toml"
    rules.write_text(BAD_RULES[case])
    out = tmp_path / "out.onnx"
    before, rules_before = sha(model_path), sha(rules)
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, _, stderr, exc = cli_run([model_path, "--rules", rules, "-o", out])
    assert_one_line_error(code, stderr, exc)
    for part in RULE_ERRORS[case]:
        assert part in stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == listing
    assert sha(model_path) == before and sha(rules) == rules_before


def test_cli_output_is_input(tmp_path):
    model_path = good_model_file(tmp_path / "good.onnx")
    before = sha(model_path)
    code, _, stderr, exc = cli_run([model_path, "-o", model_path])
    assert_one_line_error(code, stderr, exc)
    assert "output path is the input" in stderr
    assert sha(model_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.onnx"]


def test_cli_bad_input_in_a_real_process(tmp_path):
    """The same contract end to end through `python -m autocast_onnx` (real stderr, real exit)."""
    path = bad_model_cases(tmp_path)["truncated"]
    before = sha(path)
    out = tmp_path / "out.onnx"
    proc = subprocess.run([sys.executable, "-m", "autocast_onnx", "convert", str(path), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert_one_line_error(proc.returncode, proc.stderr)
    assert not out.exists() and sha(path) == before


def test_cli_good_model_still_converts(tmp_path):
    """Control for the bad-input tests: the same invocation on a good model succeeds."""
    model_path = good_model_file(tmp_path / "good.onnx")
    out = tmp_path / "out.onnx"
    code, _, stderr, exc = cli_run([model_path, "-o", out, "-q"])
    assert code == 0, (stderr, exc)
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    assert C.initializer(converted.graph, "W").data_type == F16
