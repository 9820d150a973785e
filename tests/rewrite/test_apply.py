"""Applying the plan (autocast_onnx/rewrite/apply.py): the rewrite of the graph. Casts are
inserted once per tensor and type, in the graph that defines the tensor (If/Loop bodies read
outer tensors converted in the outer graph); initializers are converted offline, in place or as
a low-precision copy when an fp32 consumer shares them; dtype/value attributes are retargeted;
graph outputs keep their types and names; the names of new casts and copies never collide with
existing ones; converting a converted model again changes nothing (byte-identical). Every
conversion is checked with the full ONNX checker and run against the fp32 original on the CPU EP
(bf16 models where the CPU EP has no kernels are checked by types only, see
case_helpers.run_converted)."""

from __future__ import annotations

import case_helpers as C
import helpers as H
import numpy as np
import pytest
from helpers import F16, F32, convert_and_check, parse, randn

import autocast_onnx


# =========================================================================================
# 1. If / Loop subgraphs
# =========================================================================================
def if_model():
    """If whose branches read outer-scope x and outer initializer W_outer:
    then: MatMul -> Softmax;  else: MatMul -> Add(else-local bias) -> Softmax."""
    m = parse(
        """
        branching (float[2,4] x, bool cond) => (float[2,4] y) {
            [branch] y = If (cond) <
                then_branch = then_body () => (float[2,4] then_out) {
                    [then_scores] then_s = MatMul(x, W_outer)
                    [then_softmax] then_out = Softmax <axis = -1> (then_s)
                },
                else_branch = else_body () => (float[2,4] else_out) {
                    [else_scores] else_s = MatMul(x, W_outer)
                    [else_bias] else_b = Add(else_s, b_else)
                    [else_softmax] else_out = Softmax <axis = -1> (else_b)
                }>
        }""",
        W_outer=randn([4, 4], 1),
    )
    H.add_initializers(C.body(m, "branch", "else_branch"), b_else=randn([4], 5))
    return m


def test_if_branches_planned_and_casts_in_defining_graph(precision, keep_io):
    m = if_model()
    H.check(m)
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)

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


def test_outer_tensor_cast_once_in_defining_graph(precision, keep_io):
    """h is made by a MatMul in main and read inside both branches: by a Softmax (fp32) in
    each, and by a MatMul (low) in the then branch. The fp32 copy of h is made once, in main,
    right after its producer; the low-precision MatMul reads h itself."""
    m = parse(
        """
        outer_read (float[4,4] x, bool cond) => (float[4,4] y) {
            [pre_mm] h = MatMul(x, W)
            [pre_t] h_t = Transpose(h)
            [branch] y = If (cond) <
                then_branch = then_body () => (float[4,4] then_out) {
                    [then_softmax] t_p = Softmax <axis = -1> (h)
                    [then_mm] then_out = MatMul(t_p, h_t)
                },
                else_branch = else_body () => (float[4,4] else_out) {
                    [else_softmax] else_out = Softmax <axis = 0> (h)
                }>
        }""",
        W=randn([4, 4], 6),
    )
    H.check(m)
    # runtime="any": the Softmaxes stay fp32 between their Casts, as this test of where the Cast of
    # an outer tensor goes needs (by default the then branch's Softmax, between fp16 h and an fp16
    # MatMul, runs at fp16 because the CUDA kernel computes it in fp32: plan/kernel_io.py)
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io, runtime="any")
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
    return parse(
        """
        looping (float[1,4] x) => (float[1,4] h_final, float[3,1,4] h_trace) {
            [loop] h_final, h_trace = Loop (trips, keep_going, x) <
                body = loop_body (int64 iter, bool cond_in, float[1,4] h_in)
                              => (bool cond_out, float[1,4] h_out, float[1,4] loop_mm_out) {
                    [loop_mm] loop_mm_out = MatMul(h_in, W_loop)
                    [loop_act] h_out = Tanh(loop_mm_out)
                    [loop_cond] cond_out = Identity(cond_in)
                }>
        }""",
        trips=np.array(3, np.int64),
        keep_going=np.array(True),
        W_loop=randn([4, 4], 3, 0.7),
    )


def test_loop_body_matmul_with_loop_carried_float_state(precision, keep_io):
    m = loop_model()
    H.check(m)
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    e = C.entry(result, "loop_mm")
    assert e.precision == precision and e.graph != "main"
    assert C.entry(result, "loop").precision == "unchanged"
    # The loop-carried value keeps one type: the body's h input and h output stay float, as
    # do the Loop's own input and outputs (the body casts around its MatMul).
    gt = C.graph_types(out)
    body_path = next(p for p in gt if p.endswith("body"))
    assert gt[body_path]["h_in"] == F32
    assert gt[body_path]["h_out"] == F32
    assert gt[body_path]["loop_mm_out"] == F32  # a body output: keeps its declared type
    assert C.initializer(out.graph, "W_loop").data_type == target
    assert C.output_types(out) == {"h_final": F32, "h_trace": F32}
    C.compare_runs(m, out, {"x": randn([1, 4], 4)}, precision)


def duplicate_init_model():
    """Each If branch defines its own initializer named "w" (different values). The then
    branch also reads its w from a fp32 op (ReduceSum) so it needs an fp16 copy, the else
    branch converts its w in place."""
    w_then, w_else = randn([4, 4], 10), randn([4, 4], 11) * 3
    m = parse("""
        two_ws (float[2,4] x, bool cond) => (float[2,4] y) {
            [pick] y = If (cond) <
                then_branch = then_body () => (float[2,4] then_out) {
                    [then_mm] t_mm = MatMul(x, w)
                    [then_wsum] t_sum = ReduceSum <keepdims = 0> (w)
                    [then_add] then_out = Add(t_mm, t_sum)
                },
                else_branch = else_body () => (float[2,4] else_out) {
                    [else_mm] else_out = MatMul(x, w)
                }>
        }""")
    H.add_initializers(C.body(m, "pick", "then_branch"), w=w_then)
    H.add_initializers(C.body(m, "pick", "else_branch"), w=w_else)
    return m, w_then, w_else


def test_duplicate_initializer_names_across_branches(precision):
    m, w_then, w_else = duplicate_init_model()
    H.check(m)
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision)
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
# 2. Initializers: converted in place, or copied when an fp32 consumer shares them
# =========================================================================================
def test_initializer_shared_by_low_and_fp32_consumer_gets_a_copy(precision, keep_io):
    W = randn([4, 4], 20)
    m = parse(
        """
        shared_weight (float[2,4] x) => (float[2,4] y, float s) {
            [proj] y = MatMul(x, W)
            [w_sum] s = ReduceSum <keepdims = 0> (W)
        }""",
        W=W,
    )
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
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
    assert result.stats.casts_added == (2 if keep_io else 0)  # x in, y out
    ref, got = C.compare_runs(m, out, {"x": randn([2, 4], 21)}, precision)
    if got is not None:
        np.testing.assert_array_equal(got[1], ref[1])  # the fp32 path is exact


def test_initializer_shared_by_two_matmuls_converted_once(precision):
    W = randn([4, 4], 22, 0.5)
    m = parse(
        """
        same_weight_twice (float[2,4] x) => (float[2,4] y) {
            [mm_a] a = MatMul(x, W)
            [act] r = Relu(a)
            [mm_b] y = MatMul(r, W)
        }""",
        W=W,
    )
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision)
    assert [t.name for t in out.graph.initializer] == ["W"]
    assert out.graph.initializer[0].data_type == target
    np.testing.assert_array_equal(C.as_float(out.graph.initializer[0]), C.round_to(W, target))
    assert H.node_by_name(out, "mm_a").input[1] == "W" and H.node_by_name(out, "mm_b").input[1] == "W"
    assert result.stats.initializers_converted == 1 and result.stats.initializer_copies == 0
    assert result.stats.casts_added == 2
    C.compare_runs(m, out, {"x": randn([2, 4], 23)}, precision)


# =========================================================================================
# 3. Attributes retargeted: ConstantOfShape's value
# =========================================================================================
# ConstantOfShape admits bf16 values from opset 21 on; at opset 17 a bf16 conversion must keep
# the fill fp32 and cast it (one Cast), an fp16 conversion retargets the value attribute.
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 17), ("bf16", 21)])
def test_constant_of_shape_value_retargeted(precision, opset, keep_io):
    m = parse(
        """
        fill (float[2,4] x) => (float[2,4] y) {
            [mm] a = MatMul(x, W)
            [fill] f = ConstantOfShape <value = float[1] {0.5}> (shape)
            [fill_add] b = Add(a, f)
            [mm2] y = MatMul(b, W2)
        }""",
        opset=opset,
        W=randn([4, 4], 40),
        W2=randn([4, 4], 41),
        shape=np.array([2, 4], np.int64),
    )
    H.check(m)
    target = C.TARGET[precision]
    retarget = not (precision == "bf16" and opset < 21)
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
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


# =========================================================================================
# 4. Graph outputs
# =========================================================================================
def test_graph_output_also_consumed_internally(precision, keep_io):
    """h = MatMul(x) is a graph output, feeds another MatMul and a Softmax (fp32)."""
    m = parse(
        """
        output_and_input (float[2,4] x) => (float[2,4] h, float[2,4] y, float[2,4] p) {
            [mm1] h = MatMul(x, W1)
            [mm2] y = MatMul(h, W2)
            [h_softmax] p = Softmax <axis = -1> (h)
        }""",
        W1=randn([4, 4], 60),
        W2=randn([4, 4], 61),
    )
    target = C.TARGET[precision]
    # runtime="any": the Softmax stays fp32 (by default, with low-precision outputs, it reads and
    # writes the low type because its kernel computes in fp32: plan/kernel_io.py); this test is
    # about the Casts around a graph output that is also read inside the graph
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io, runtime="any")
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
        assert result.stats.casts_added == 3  # x in, h out, y out
    else:
        assert C.output_types(out) == {"h": target, "y": target, "p": F32}
        assert mm2.input[0] == "h"
        assert result.stats.casts_added == 1  # h -> fp32 for the Softmax
    C.compare_runs(m, out, {"x": randn([2, 4], 62)}, precision)


def test_graph_output_from_initializer(precision, keep_io):
    W = randn([4, 4], 70) + np.float32(2**-13)  # values that are not exact in fp16/bf16
    m = parse(
        """
        weight_output (float[2,4] x) => (float[2,4] y, float[4,4] W) {
            [proj] y = MatMul(x, W)
        }""",
        W=W,
    )
    H.check(m)
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    assert C.entry(result, "proj").precision == precision
    assert [o.name for o in out.graph.output] == ["y", "W"]
    # The weight output keeps its type and its exact values; the MatMul gets a low copy.
    assert C.output_types(out)["W"] == F32
    assert C.initializer(out.graph, "W").data_type == F32
    np.testing.assert_array_equal(C.as_float(C.initializer(out.graph, "W")), W)
    _ref, got = C.compare_runs(m, out, {"x": randn([2, 4], 71)}, precision)
    if got is not None:
        np.testing.assert_array_equal(got[1], W)


# =========================================================================================
# 5. Already-converted models and idempotence
# =========================================================================================
def fp16_model():
    return parse(
        """
        half (float16[2,4] x) => (float16[2,4] y) {
            [mm] s = MatMul(x, W)
            [sm] y = Softmax <axis = -1> (s)
        }""",
        W=randn([4, 4], 90).astype(np.float16),
    )


def test_already_fp16_model_softmax_goes_fp32_and_is_idempotent():
    m = fp16_model()
    H.check(m)
    r1, out = convert_and_check(m, precision="fp16")
    assert C.entry(r1, "mm").precision == "fp16"
    assert C.entry(r1, "sm").precision == "fp32"
    types = H.types(out)
    sm = H.node_by_name(out, "sm")
    assert types[sm.input[0]] == F32 and types[sm.output[0]] == F32
    assert C.input_types(out) == {"x": F16} and C.output_types(out) == {"y": F16}
    assert C.initializer(out.graph, "W").data_type == F16
    assert r1.stats.casts_added == 2  # s -> fp32 for Softmax, Softmax result -> fp16 output
    x = randn([2, 4], 91).astype(np.float16)
    ref = H.run(m, {"x": x})[0]
    got = H.run(out, {"x": x})[0]
    assert got.dtype == np.float16
    C.assert_close(got, ref, "fp16")
    r2 = autocast_onnx.convert(out, precision="fp16")
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == out.SerializeToString()


def mixed_model():
    return parse(
        """
        mixed (float[2,4] x) => (float[2,4] y) {
            [q_proj] q = MatMul(x, Wq)
            [attn_scores] s = MatMul(q, Wk)
            [mask_add] sm_in = Add(s, mask)
            [attn_softmax] p = Softmax <axis = -1> (sm_in)
            [attn_out] o = MatMul(p, Wv)
            [mean] mean = ReduceMean <axes = [-1]> (o)
            [center] y = Sub(o, mean)
        }""",
        Wq=randn([4, 4], 92),
        Wk=randn([4, 4], 93),
        Wv=randn([4, 4], 94),
        mask=np.array([0, 0, -1e9, 0], np.float32),
    )


def test_convert_twice_is_byte_identical(precision, keep_io):
    m = mixed_model()
    r1, _ = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    assert r1.stats.casts_added > 0
    r2 = autocast_onnx.convert(r1.model, precision=precision, keep_io_types=keep_io)
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == r1.model.SerializeToString()


IDEMPOTENCE_MODELS = {
    "if": if_model,
    "loop": loop_model,
    "dup_init": lambda: duplicate_init_model()[0],
    "eye_noise": H.eye_noise_model,
    "unknown_op": lambda: H.unknown_op_model(True),
}


@pytest.mark.parametrize("case", sorted(IDEMPOTENCE_MODELS))
def test_convert_twice_is_byte_identical_other_graphs(case, keep_io):
    """Idempotence on the subgraph, dtype-attribute and custom-op graphs (fp16)."""
    m = IDEMPOTENCE_MODELS[case]()
    r1 = autocast_onnx.convert(m, precision="fp16", keep_io_types=keep_io)
    r2 = autocast_onnx.convert(r1.model, precision="fp16", keep_io_types=keep_io)
    assert r2.stats.casts_added == 0
    assert r2.model.SerializeToString() == r1.model.SerializeToString()


# =========================================================================================
# 6. Names of the casts and copies the converter creates
# =========================================================================================
def test_unnamed_nodes(precision, keep_io):
    m = parse(
        """
        unnamed (float[2,4] x) => (float[2,4] y) {
            a = MatMul(x, W1)
            p = Softmax <axis = -1> (a)
            b = MatMul(p, W2)
            y = Relu(b)
        }""",
        W1=randn([4, 4], 100),
        W2=randn([4, 4], 101),
    )
    assert not any(n.name for n in m.graph.node)
    target = C.TARGET[precision]
    # runtime="any": the Softmax stays fp32, so that there are Casts to name (by default it runs at
    # the low type between the MatMuls: plan/kernel_io.py)
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io, runtime="any")
    assert [n.precision for n in result.plan.nodes] == [precision, "fp32", precision, precision]
    dup_t, dup_n = C.unique_names_ok(out)
    assert dup_t == [] and dup_n == []
    types = H.types(out)
    assert types["a"] == target and types["p"] == F32 and types["b"] == target
    # a -> fp32 for Softmax, p -> low for the MatMul, plus x in / y out with keep_io
    assert result.stats.casts_added == (4 if keep_io else 2)
    C.compare_runs(m, out, {"x": randn([2, 4], 102)}, precision)


def test_tensor_with_two_low_consumers_gets_one_cast(precision):
    m = parse(
        """
        fan_out (float[2,4] x) => (float[2,4] y) {
            [pre_act] r = Relu(x)
            [pre_softmax] p = Softmax <axis = -1> (r)
            [mm_a] a = MatMul(p, W1)
            [mm_b] b = MatMul(p, W2)
            [sum] y = Add(a, b)
        }""",
        W1=randn([4, 4], 103),
        W2=randn([4, 4], 104),
    )
    target = C.TARGET[precision]
    # precise: the fast plan would run the Softmax (fed by the fp32 input's Relu) at fp16 too
    result, out = convert_and_check(m, precision=precision, precise=True)
    p_casts = [n for n in C.casts(out) if n.input[0] == "p"]
    assert len(p_casts) == 1 and C.cast_to(p_casts[0]) == target
    cast_out = p_casts[0].output[0]
    assert H.node_by_name(out, "mm_a").input[0] == cast_out == H.node_by_name(out, "mm_b").input[0]
    assert result.stats.casts_added == 2  # p -> low, y -> fp32 output
    C.compare_runs(m, out, {"x": randn([2, 4], 105)}, precision)


def test_existing_names_like_generated_casts(precision, keep_io):
    """Tensors and nodes already named x_fp16, x_bf16, W_fp16, W_bf16, y_fp16, y_bf16..."""
    taken = [f"{base}_{p}" for base in ("x", "W", "y", "a") for p in ("fp16", "bf16", "fp32")]
    m = parse(
        """
        taken_names (float[2,4] x, float[2,4] a_fp16) => (float[2,4] y, float w_sum, float[2,4] y_fp32) {
            [x_fp16] a = MatMul(x, W)                  # node names like cast names
            [W_fp16] x_fp16 = Relu(a)                  # tensor named x_fp16
            [x_bf16] x_bf16 = Relu(x_fp16)
            [W_bf16] W_fp16 = Relu(x_bf16)             # tensor named W_fp16
            [y_fp16] W_bf16 = Relu(W_fp16)
            [y_bf16] y_fp16 = Add(W_bf16, a_fp16)      # a_fp16: an input
            [a_fp16] y_bf16 = Softmax <axis = -1> (y_fp16)
            [a_bf16] y = MatMul(y_bf16, W)
            [W_fp32] w_sum = ReduceSum <keepdims = 0> (W)   # W also needed in fp32
            [a_fp32] y_fp32 = Identity(y_bf16)         # a graph output named y_fp32
        }""",
        W=randn([4, 4], 106),
    )
    H.check(m)
    _, out = convert_and_check(m, precision=precision, keep_io_types=keep_io, precise=True)  # Casts on both sides
    dup_t, dup_n = C.unique_names_ok(out)
    assert dup_t == [] and dup_n == []
    assert [o.name for o in out.graph.output] == ["y", "w_sum", "y_fp32"]
    new = {n.name for n in C.casts(out)}
    assert not new & set(taken)
    feeds = {"x": randn([2, 4], 107), "a_fp16": randn([2, 4], 108)}
    C.compare_runs(m, out, feeds, precision)
