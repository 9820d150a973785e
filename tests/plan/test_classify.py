"""Classification (autocast_onnx/plan/classify.py): what each node is allowed to do before
painting. Op categories from the rule files (contrib ops, unknown custom ops, user rules that
move an op), the schema limits of the target type, port roles and pins (Resize's roi and scales
stay float), data rules on constants (out-of-range values, values that flush to zero) and the
precedence of the sources: command line over [[nodes]] rules over op categories, an exclude over
an include. Each test converts through the public API and checks the plan entries, their reasons
and warnings, and what the converted graph does with the tensors involved."""

from __future__ import annotations

import case_helpers as C
import helpers as H
import numpy as np
import pytest
from helpers import BF16, F16, F32, convert, convert_and_check, mlp, parse, planned, randn


# =========================================================================================
# 1. Rule precedence: command line, [[nodes]] rules, op categories
# =========================================================================================
def test_exclude_op_and_exclude_node():
    r = convert(mlp(), exclude_ops=["MatMul"])
    assert planned(r, "enc/fc1") == "fp32" and planned(r, "head/fc2") == "fp32"
    assert any(x.code == "cli-exclude" for x in r.plan.by_name("enc/fc1")[0].reasons)
    r = convert(mlp(), exclude_nodes=["^head/"])
    assert planned(r, "enc/fc1") == "fp16" and planned(r, "head/fc2") == "fp32"


def test_include_node_forces_keep_op_low():
    m = parse(
        """
        softmax_between (float[2,8] x) => (float[2,8] y) {
            [fc1] h = MatMul(x, w1)
            [softmax] p = Softmax(h)
            [fc2] y = MatMul(p, w2)
        }""",
        w1=randn([8, 8], 10, 0.3),
        w2=randn([8, 8], 11, 0.3),
    )
    r = convert(m, include_nodes=["^softmax$"])
    assert planned(r, "softmax") == "fp16"
    assert r.stats.casts_added == 2
    H.check(r.model)


def test_precedence_cli_over_node_rules_over_categories(tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text(
        '[ops.keep_fp32]\nRelu = "testing"\n'
        '[[nodes]]\nmatch = "^enc/"\nprecision = "fp32"\nwhy = "encoder stays fp32"\n'
        '[[nodes]]\nname = "enc/act"\nprecision = "low"\n'
    )
    r = convert(mlp(), rules=[rules])
    # op rule says keep_fp32, the later node rule for enc/act forces low; enc/fc1 forced fp32.
    assert planned(r, "enc/act") == "fp16"
    assert planned(r, "enc/fc1") == "fp32"
    reason = next(x for x in r.plan.by_name("enc/fc1")[0].reasons if x.code == "node-rule")
    assert reason.source == f"{rules}:3"
    # command line beats rule files; an exclude beats an include
    r = convert(mlp(), rules=[rules], include_nodes=["fc1"])
    assert planned(r, "enc/fc1") == "fp16"
    r = convert(mlp(), rules=[rules], include_nodes=["fc1"], exclude_nodes=["fc1"])
    assert planned(r, "enc/fc1") == "fp32"


def test_node_rule_limited_to_op_types(tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text('[[nodes]]\nmatch = "enc"\nprecision = "fp32"\nop_types = ["Relu"]\n')
    r = convert(mlp(), rules=[rules])
    assert planned(r, "enc/act") == "fp32" and planned(r, "enc/fc1") == "fp16"


# =========================================================================================
# 2. Op categories: unknown ops, contrib ops, schema limits of the target type
# =========================================================================================
def test_unknown_op_category_can_be_changed_by_user(tmp_path):
    m = parse(
        """
        custom (float[2,8] x) => (float[2,8] y) {
            [fc] h = MatMul(x, w)
            [custom] y = my.ops.Foo(h)
        }""",
        domains={"my.ops": 1},
        w=randn([8, 8], 12, 0.3),
    )
    r = convert(m, check="none")
    assert planned(r, "custom") == "fp32"
    assert any(x.code == "unknown-op" for x in r.plan.warnings)
    rules = tmp_path / "r.toml"
    rules.write_text('["ops".follow]\n"my.ops:Foo" = "elementwise"\n')
    r = convert(m, rules=[rules], check="none")
    assert planned(r, "custom") == "fp16"


@pytest.mark.parametrize("declare_type", [False, True])
def test_unknown_custom_op(precision, declare_type):
    m = H.unknown_op_model(declare_type)
    # The full check passes: the ONNX checker and strict shape inference skip nodes of a domain
    # they have no schema for (nothing to check them against), so full_check=False is not
    # needed. The model cannot be run: ONNX Runtime has no kernel for my.domain:Foo.
    H.check(m)
    result, out = convert_and_check(m, precision=precision)
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


def test_contrib_ops_without_value_info(precision, keep_io):
    """com.microsoft ops have no ONNX type inference; their types come from the shipped ONNX
    Runtime signatures and their categories from the default rules."""
    m = parse(
        """
        contrib (float[2,4] x) => (float[2,4] y) {
            [mm1] a = MatMul(x, W1)
            [bias_gelu] g = com.microsoft.BiasGelu(a, bias)
            [fused_mm] f = com.microsoft.FusedMatMul <alpha = 0.5, transB = 1> (g, W2)
            [gelu] g2 = com.microsoft.Gelu(f)
            [mm_out] y = MatMul(g2, W3)
        }""",
        domains={"com.microsoft": 1},
        W1=randn([4, 4], 80),
        bias=randn([4], 81),
        W2=randn([4, 4], 82),
        W3=randn([4, 4], 83),
    )
    assert not m.graph.value_info
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
    for name in ("mm1", "bias_gelu", "fused_mm", "gelu", "mm_out"):
        assert C.entry(result, name).precision == precision, name
    assert "unknown-type" not in C.warning_codes(result) and "unknown-op" not in C.warning_codes(result)
    for name in ("W1", "bias", "W2", "W3"):
        assert C.initializer(out.graph, name).data_type == target
    assert result.stats.casts_added == (2 if keep_io else 0)
    C.compare_runs(m, out, {"x": randn([2, 4], 84)}, precision)


def test_schema_without_target_type_keeps_node_fp32():
    # LeakyRelu has no bfloat16 schema at opset 13 (it gained one in opset 16).
    m = mlp()
    H.node_by_name(m, "enc/act").op_type = "LeakyRelu"
    m.opset_import[0].version = 13
    r = convert(m, precision="bf16")
    assert planned(r, "enc/act") == "fp32"
    assert any(x.code == "schema" for x in r.plan.by_name("enc/act")[0].reasons)
    H.check(r.model)


def test_dtype_attr_ops_whose_schema_lacks_bf16(keep_io):
    """Opset 17: EyeLike and RandomNormalLike admit neither a bf16 input (T1) nor a bf16 dtype
    (T2). A bf16 conversion keeps both fp32, must not feed them a bf16 tensor (the model would
    be invalid), and the fp32 random values still make their consumer fp32."""
    m = H.eye_noise_model(17)
    result, out = convert_and_check(m, precision="bf16", keep_io_types=keep_io)
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
# 3. Port roles and pins: Resize's roi and scales are coordinates
# =========================================================================================
# Conv admits bf16 from opset 22 on: the bf16 case uses opset 22 so that the region converts.
@pytest.mark.parametrize("precision,opset", [("fp16", 17), ("bf16", 22)])
def test_resize_scales_and_roi_stay_float(precision, opset, keep_io):
    roi = np.array([0, 0, 0.1, 0.1, 1, 1, 0.9, 0.9], np.float32)
    scales = np.array([1, 1, 2, 2], np.float32)
    m = parse(
        """
        upsample (float[1,2,4,4] x) => (float[1,2,8,8] y) {
            [conv1] c1 = Conv <pads = [1, 1, 1, 1]> (x, Wc1)
            [upsample] r = Resize <mode = "linear", coordinate_transformation_mode = "tf_crop_and_resize">
                                  (c1, roi, scales)
            [conv2] y = Conv <pads = [1, 1, 1, 1]> (r, Wc2)
        }""",
        opset=opset,
        Wc1=randn([2, 2, 3, 3], 50, 0.3),
        roi=roi,
        scales=scales,
        Wc2=randn([2, 2, 3, 3], 51, 0.3),
    )
    H.check(m)
    target = C.TARGET[precision]
    result, out = convert_and_check(m, precision=precision, keep_io_types=keep_io)
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
# 4. Data rules: constants out of the low-precision range, constants that flush to zero
# =========================================================================================
def attention_mask_model(scale_after_mask=False):
    """Scores + mask (-1e9 in the last column) -> Softmax. With `scale_after_mask` the masked scores
    are divided by 2 before the Softmax: the mask then reaches a Div, not only a Softmax input, so
    it is no attention-mask sentinel (plan/masks.py) and the data rules judge it as any constant."""
    mask = np.zeros([2, 4], np.float32)
    mask[:, 3] = -1e9
    scaled = "[attn_scale] scaled = Div(masked, two)" if scale_after_mask else ""
    return parse(
        f"""
        masked_attention (float[2,4] x) => (float[2,4] y) {{
            [attn_scores] s = MatMul(x, Wk)
            [mask_add] masked = Add(s, mask)
            {scaled}
            [attn_softmax] p = Softmax <axis = -1> ({"scaled" if scale_after_mask else "masked"})
            [attn_out] y = MatMul(p, Wv)
        }}""",
        Wk=randn([4, 4], 110),
        mask=mask,
        Wv=randn([4, 4], 111),
        **({"two": np.array(2.0, np.float32)} if scale_after_mask else {}),
    )


def epsilon_model():
    return parse(
        """
        epsilon (float[2,4] x) => (float[2,4] y) {
            [mm1] a = MatMul(x, W1)
            [eps_add] b = Add(a, eps)
            [mm2] y = MatMul(b, W2)
        }""",
        W1=randn([4, 4], 113),
        eps=np.array([1e-12], np.float32),
        W2=randn([4, 4], 114),
    )


def emulated_close(m, out, feeds, precision):
    """The converted model's outputs with its fp16/bf16 numerics emulated (validate's way) match the
    fp32 model's within the low type's tolerance (case_helpers.assert_close)."""
    from validate_helpers import run_emulated

    from autocast_onnx.validate.emulate import emulation_model

    ref = H.run(m, feeds)
    got = run_emulated(emulation_model(out), feeds)
    assert len(got) == len(ref)
    for a, e in zip(got, ref):
        C.assert_close(a, e, precision)


def test_attention_mask_out_of_range_is_a_mask_sentinel(precision):
    """By default the -1e9 mask, which reaches only the Softmax, is an attention-mask sentinel: in
    fp16, whose range it is beyond, it becomes -49152 (plan/masks.py) and the mask Add runs low with
    the scores, instead of staying fp32 (data-range); the Softmax between fp16 scores and an fp16
    MatMul runs at fp16 too, its CUDA kernel computing in fp32 (kernel-fp32)."""
    m = attention_mask_model()
    result, out = convert_and_check(m, precision=precision)
    for name in ("attn_scores", "mask_add", "attn_softmax", "attn_out"):
        assert C.entry(result, name).precision == precision, name
    softmax = C.entry(result, "attn_softmax").reasons[-1]
    assert (
        softmax.code == "kernel-fp32"
        and "Softmax kernel computes in fp32 and rounds its outputs once" in softmax.message
    )
    assert "data-range" not in C.reason_codes(result, "mask_add")
    assert "data-range" not in C.warning_codes(result)
    mask = C.initializer(out.graph, "mask")
    assert mask.data_type == C.TARGET[precision]
    np.testing.assert_array_equal(C.as_float(mask)[:, :3], 0.0)
    if precision == "fp16":
        (why,) = [r for r in C.entry(result, "mask_add").reasons if r.code == "mask-sentinel"]
        assert why.value == pytest.approx(1e9)
        assert "attention-mask sentinel 'mask'" in why.message and "reach only 1 Softmax input(s)" in why.message
        assert "they become -49152" in why.message
        assert result.plan.mask_sentinels == {"mask": -49152.0}
        np.testing.assert_array_equal(C.as_float(mask)[:, 3], -49152.0)
        assert result.stats.sentinel_values == 2 and result.stats.clamped_values == 0
    else:
        # -1e9 is well inside bf16's range: no sentinel, the mask is converted as it is
        assert "mask-sentinel" not in C.reason_codes(result, "mask_add")
        assert result.plan.mask_sentinels == {}
        np.testing.assert_allclose(C.as_float(mask)[:, 3], -1e9, rtol=2**-8)
    assert result.stats.casts_added == 2  # x in, y out: none around the mask Add or the Softmax
    feeds = {"x": randn([2, 4], 112)}
    C.compare_runs(m, out, feeds, precision)
    emulated_close(m, out, feeds, precision)


def test_attention_mask_out_of_range_stays_fp32(precision):
    """A -1e9 mask that is no sentinel (it reaches a Div on its way to the Softmax), planned for no
    particular runtime (the Softmax kept fp32): the data rule keeps the fp16 mask Add fp32."""
    m = attention_mask_model(scale_after_mask=True)
    result, out = convert_and_check(m, precision=precision, runtime="any")
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
    assert result.plan.mask_sentinels == {}
    C.compare_runs(m, out, {"x": randn([2, 4], 112)}, precision)


def test_tiny_epsilon_keeps_add_fp32(precision):
    m = epsilon_model()
    result, out = convert_and_check(m, precision=precision)
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
    # a mask that is no sentinel (it reaches a Div), for no particular runtime: the clamp of a constant
    # that a forced node converts (a sentinel would take -49152 instead, plan/masks.py)
    m = attention_mask_model(scale_after_mask=True)
    result, out = convert_and_check(m, precision="fp16", include_nodes=["^mask_add$"], runtime="any")
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
    result, out = convert_and_check(m, precision="fp16", include_nodes=["eps_add"])
    assert C.entry(result, "eps_add").precision == "fp16"
    assert [w.node for w in result.plan.warnings if w.code == "data-flush"] == ["eps_add"]
    assert C.initializer(out.graph, "eps").data_type == F16
    x = randn([2, 4], 117)
    C.assert_close(H.run(out, {"x": x})[0], H.run(m, {"x": x})[0], "fp16")
