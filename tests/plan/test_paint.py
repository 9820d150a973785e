"""Painting (autocast_onnx/plan/paint.py): the passes that turn per-node categories into the
precision plan. fp32 taint flows forward through follow and clear nodes, follow nodes between
low-precision ops go low, clear nodes take low precision only when all their consumers are low,
and type-setting nodes (author Casts, ops with a `dtype` attribute) keep or change their target
type to fit their neighbours. Each test converts through the public API and checks the plan and
the types the converted graph computes in (run on the CPU EP where it has the kernels)."""

from __future__ import annotations

import case_helpers as C
import helpers as H
import numpy as np
import pytest
from helpers import F16, F32, attention_block, convert, convert_and_check, parse, planned, randn, rng
from onnx import TensorProto


# =========================================================================================
# 1. Taint, low propagation and clear nodes
# =========================================================================================
def test_attention_pattern():
    # runtime="any": the painting passes alone (pass 6, which lowers this Softmax for CUDA's
    # fp32-computing kernel, is tested in test_kernel_io.py).
    m = attention_block()
    r = convert(m, runtime="any")
    assert planned(r, "scores") == "fp16"
    assert planned(r, "scale_div") == "fp16"
    assert planned(r, "mask_add") == "fp16"  # mask in range: follows the low-precision scores
    assert planned(r, "softmax") == "fp32"
    assert planned(r, "context") == "fp16"
    H.check(r.model)
    g = rng(5)
    feeds = {
        "q": g.standard_normal((2, 4, 8)).astype(np.float32),
        "mask": np.where(g.random((2, 4, 4)) < 0.3, -10000.0, 0.0).astype(np.float32),
    }
    np.testing.assert_allclose(H.run(r.model, feeds)[0], H.run(m, feeds)[0], atol=2e-2)


def test_fp32_taint_flows_forward_through_follow_and_clear():
    m = parse(
        """
        taint (float[2,8] x) => (float[2,8] y) <int64[2] shape = {2, 8}> {
            [ln] ln = LayerNormalization(x, g, b)
            [residual] res = Add(ln, x)
            [reshape] r = Reshape(res, shape)
            [proj] y = MatMul(r, w)
        }""",
        g=np.ones(8, np.float32),
        b=np.zeros(8, np.float32),
        w=randn([8, 8], 6, 0.3),
    )
    r = convert(m, precise=True)  # the fast plan would run the LayerNormalization low (test_fast_plan.py)
    assert [planned(r, n) for n in ("ln", "residual", "reshape", "proj")] == ["fp32", "fp32", "fp32", "fp16"]
    taint = [x for x in r.plan.by_name("residual")[0].reasons if x.code == "fp32-taint"]
    assert taint and "ln" in taint[0].message
    H.check(r.model)


def test_follow_between_low_ops_goes_low_with_no_cast():
    m = parse(
        """
        mlp (float[2,8] x) => (float[2,8] y) {
            [fc1] h = MatMul(x, w1)
            [act] a = Relu(h)
            [fc2] y = MatMul(a, w2)
        }""",
        w1=randn([8, 8], 7, 0.3),
        w2=randn([8, 8], 8, 0.3),
    )
    r = convert(m)
    assert planned(r, "act") == "fp16"
    assert r.stats.casts_added == 2  # model input in, model output out
    assert len(H.ops(r.model, "Cast")) == 2


def test_clear_node_before_low_op_takes_low_only_if_all_consumers_are_low():
    w = randn([8, 8], 9, 0.3)
    m = parse(
        """
        reshape_mm (float[16] x) => (float[2,8] y) <int64[2] shape = {2, 8}> {
            [reshape] r = Reshape(x, shape)
            [proj] y = MatMul(r, w)
        }""",
        w=w,
    )
    r = convert(m)
    assert planned(r, "reshape") == "fp16"
    m = parse(
        """
        reshape_mm_softmax (float[16] x) => (float[2,8] y, float[2,8] p) <int64[2] shape = {2, 8}> {
            [reshape] r = Reshape(x, shape)
            [proj] y = MatMul(r, w)
            [softmax] p = Softmax(r)
        }""",
        w=w,
    )
    r = convert(m)
    # A Softmax reads the reshaped tensor too: it stays fp32, the MatMul gets the cast.
    assert planned(r, "reshape") == "fp32"
    assert planned(r, "softmax") == "fp32"
    H.check(r.model)


def test_every_node_has_a_reason():
    r = convert(attention_block())
    assert all(n.reasons for n in r.plan.nodes)


# =========================================================================================
# 2. Casts written by the model's author (type-setting nodes)
# =========================================================================================
def test_author_cast_to_float_between_low_ops_is_retargeted(precision, keep_io):
    m = parse(
        """
        author_cast (float[2,4] x) => (float[2,4] y) {
            [mm1] a = MatMul(x, W1)
            [author_cast] a32 = Cast <to = 1> (a)          # to FLOAT
            [bias_add] b = Add(a32, bias)
            [mm2] y = MatMul(b, W2)
        }""",
        W1=randn([4, 4], 30),
        W2=randn([4, 4], 31),
        bias=randn([4], 32),
    )
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    for name in ("mm1", "author_cast", "bias_add", "mm2"):
        assert C.entry(result, name).precision == precision, name
    cast = H.node_by_name(out, "author_cast")
    assert C.cast_to(cast) == target
    assert cast.input[0] == "a" and H.node_by_name(out, "bias_add").input[0] == "a32"
    assert result.stats.casts_added == (2 if keep_io else 0)
    assert len(C.casts(out)) == 1 + result.stats.casts_added
    C.compare_runs(m, out, {"x": randn([2, 4], 33)}, precision)


def test_author_cast_guarding_softmax_stays_float(precision, keep_io):
    m = parse(
        """
        guarded_softmax (float[2,4] x) => (float[2,4] y) {
            [scores] s = MatMul(x, W)
            [guard_cast] s32 = Cast <to = 1> (s)           # to FLOAT
            [probs] y = Softmax <axis = -1> (s32)
        }""",
        W=randn([4, 4], 34),
    )
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    assert C.entry(result, "scores").precision == precision
    assert C.entry(result, "probs").precision == "fp32"
    guard = H.node_by_name(out, "guard_cast")
    assert C.cast_to(guard) == F32
    assert guard.input[0] == "s"
    assert H.node_by_name(out, "probs").input[0] == "s32"  # no new cast before Softmax
    assert H.types(out)["s"] == target
    assert result.stats.casts_added == (1 if keep_io else 0)  # only x -> low
    assert len(C.casts(out)) == 1 + result.stats.casts_added
    C.compare_runs(m, out, {"x": randn([2, 4], 35)}, precision)


def test_author_int_truncation_is_preserved(precision):
    # x @ diag(1.5) with small integer x gives exact k.5 / k.0 values in fp16 and bf16,
    # so the truncation result is exact in every precision.
    m = parse(
        """
        truncation (float[2,4] x) => (float[2,4] y) {
            [mm] a = MatMul(x, W)
            [to_int] a_int = Cast <to = 6> (a)             # to INT32
            [to_float] a_trunc = Cast <to = 1> (a_int)     # to FLOAT
            [mm2] y = MatMul(a_trunc, I)
        }""",
        W=np.diag([1.5] * 4).astype(np.float32),
        I=np.eye(4, dtype=np.float32),
    )
    _, out = convert_and_check(m, precision=precision)
    to_int = H.node_by_name(out, "to_int")
    assert C.cast_to(to_int) == TensorProto.INT32
    assert H.node_by_name(out, "to_float").input[0] == "a_int"
    assert H.types(out)["a_int"] == TensorProto.INT32
    x = rng(36).integers(-5, 6, size=(2, 4)).astype(np.float32)
    ref, got = C.compare_runs(m, out, {"x": x}, precision)
    np.testing.assert_array_equal(ref[0], np.trunc(x * 1.5))
    if got is not None:
        np.testing.assert_array_equal(got[0], ref[0])


def test_author_lossy_round_trip_is_not_folded(precision):
    """x -> Cast(FLOAT16) -> Cast(FLOAT) -> ReduceSum: the author rounds x to fp16 on purpose.
    A MatMul elsewhere makes the converter do work on the graph."""
    m = parse(
        """
        lossy_round_trip (float[1,4] x) => (float s, float[1,4] y) {
            [author_down] x16 = Cast <to = 10> (x)         # to FLOAT16
            [author_up] x32 = Cast <to = 1> (x16)          # to FLOAT
            [total] s = ReduceSum <keepdims = 0> (x32)
            [mm] y = MatMul(x, W)
        }""",
        W=randn([4, 4], 37),
    )
    _, out = convert_and_check(m, precision=precision)
    down, up = H.node_by_name(out, "author_down"), H.node_by_name(out, "author_up")
    assert C.cast_to(down) == F16 and C.cast_to(up) == F32
    assert down.input[0] == "x" and up.input[0] == "x16" and H.node_by_name(out, "total").input[0] == "x32"
    # 1 + 2^-12 etc. are not fp16 values: the author's rounding must still show in the output.
    x = np.array([[1 + 2**-12, 3 + 2**-10, -2 - 2**-11, 1000.3]], np.float32)
    ref, got = C.compare_runs(m, out, {"x": x}, precision)
    assert ref[0] == np.float32(x.astype(np.float16).astype(np.float32).sum())
    if got is not None:
        assert got[0] == ref[0]


def test_author_fp16_round_trip_after_matmul_keeps_both_casts(precision):
    """MatMul -> Cast(FLOAT16) -> Cast(FLOAT) -> Softmax: the author's explicit fp16 rounding
    stays an fp16 rounding (even when converting to bf16) and the cast back stays FLOAT."""
    m = parse(
        """
        fp16_round_trip (float[2,4] x) => (float[2,4] y) {
            [scores] s = MatMul(x, W)
            [author_down] s16 = Cast <to = 10> (s)         # to FLOAT16
            [author_up] s32 = Cast <to = 1> (s16)          # to FLOAT
            [probs] y = Softmax <axis = -1> (s32)
        }""",
        W=randn([4, 4], 38),
    )
    _, out = convert_and_check(m, precision=precision)
    assert C.cast_to(H.node_by_name(out, "author_down")) == F16
    assert C.cast_to(H.node_by_name(out, "author_up")) == F32
    assert H.node_by_name(out, "probs").input[0] == "s32"
    assert H.types(out)["s16"] == F16
    C.compare_runs(m, out, {"x": randn([2, 4], 39)}, precision)


# =========================================================================================
# 3. Ops whose output type is a dtype attribute
# =========================================================================================
# EyeLike and RandomNormalLike admit bf16 from opset 22 on (test_classify.py covers opset 17,
# where their schema lacks bf16).
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 22)])
def test_eyelike_and_random_normal_like_dtype_attrs(precision, opset, keep_io):
    m = H.eye_noise_model(opset)
    H.check(m)
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    # EyeLike is keep_fp32 in the default rules: ONNX Runtime has no float16 EyeLike kernel
    # (CPU or CUDA), so an fp16 EyeLike would not run. Its fp32 output taints the Add.
    assert C.entry(result, "eye").precision == "fp32"
    assert C.entry(result, "add_eye").precision == "fp32"
    assert C.entry(result, "mm2").precision == precision
    assert C.entry(result, "noise").precision == "fp32"  # random ops stay fp32
    assert C.entry(result, "add_noise").precision == "fp32"  # fed by an fp32 node
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
