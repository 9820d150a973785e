"""fp16/bf16 emulation on CPU (validate/emulate.py).

ONNX Runtime's CPU provider has few fp16 kernels: it runs most fp16 nodes in fp32 behind casts
it inserts itself and then removes the fp16 round trips, so a converted model run "plain" on CPU
mostly computes in fp32 and hides overflow, underflow and rounding. `emulation_model` rounds every
fp16/bf16 tensor like a GPU does. Each case below is a constructed graph (ir_version 8, opset 17)
where fp16 is unsafe: emulation must show the inf/NaN/large error a GPU would produce, while the
fp32 reference stays finite. The safe cases check emulation matches fp32 within fp16 tolerance and
really rounds.
"""

import numpy as np
import onnx
import pytest
from helpers import BF16, F16, F32, check, convert, init, model, run, tensor
from onnx import helper
from validate_helpers import bf16_exact, fp16_exact, io_signature, nonfinite, run_emulated

from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.emulate import emulation_model
from autocast_onnx.validate.metrics import Thresholds


def emulate(converted: onnx.ModelProto) -> onnx.ModelProto:
    """The emulation model, with the structural checks every case shares: full ONNX check, and the
    converted model's input/output names and types kept."""
    emu = emulation_model(converted)
    onnx.checker.check_model(emu, full_check=True)
    assert io_signature(emu) == io_signature(converted)
    return emu


def check_validate(reference, converted, **options):
    options.setdefault("speed", False)
    options.setdefault("numerics", "emulate")
    return validate(reference, converted, ValidateOptions(**options))


def precisions(result):
    return {n.name: n.precision for n in result.plan.nodes if n.name}


def warning_codes(result):
    return [w.code for w in result.plan.warnings]


# 1. Attention mask of -1e9 added twice, with a fully masked row -------------------------------------

B, S, D = 3, 4, 8


def masked_attention(shared=False):
    """scores + mask + mask -> Softmax. With `shared` the mask is also a model output, so it is
    more than a mask (no sentinel, plan/masks.py) and the data rules keep its readers fp32."""
    mask = np.zeros((B, 1, S), np.float32)
    mask[1, :, 2:] = -1e9  # batch 1: padded after 2 tokens
    mask[2] = -1e9  # batch 2: fully masked
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Add", ["scores", "mask"], ["masked1"], name="mask_add1"),
        helper.make_node("Add", ["masked1", "mask"], ["masked2"], name="mask_add2"),
        helper.make_node("Softmax", ["masked2"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["out"], name="pv"),
    ]
    outputs = [tensor("out", F32, [B, S, D])]
    if shared:
        nodes.append(helper.make_node("Identity", ["mask"], ["mask_out"], name="mask_copy"))
        outputs.append(tensor("mask_out", F32, [B, 1, S]))
    m = model(
        nodes,
        [tensor("q", F32, [B, S, D]), tensor("kt", F32, [B, D, S]), tensor("v", F32, [B, S, D])],
        outputs,
        [init("mask", mask)],
    )
    check(m)
    return m


def attention_feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((B, S, D)).astype(np.float32),
        "kt": rng.standard_normal((B, D, S)).astype(np.float32),
        "v": rng.standard_normal((B, S, D)).astype(np.float32),
    }


def test_attention_mask_default_conversion_keeps_the_adds_of_a_shared_mask_fp32():
    result = convert(masked_attention(shared=True))
    p = precisions(result)
    assert p["mask_add1"] == "fp32" and p["mask_add2"] == "fp32"
    # and then the conversion is safe: emulation finds nothing
    report = check_validate(masked_attention(shared=True), result.model)
    assert report["passed"], report["outputs"]


def test_attention_mask_that_only_masks_runs_low_with_the_halved_sentinel():
    """The -1e9 mask added twice on the way to the softmax and read by nothing else: it takes
    -49152 / 2, both Adds and the Softmax run fp16, and emulation finds the fully masked row
    finite and uniform as in fp32."""
    m = masked_attention()
    result = convert(m)
    p = precisions(result)
    assert p["mask_add1"] == "fp16" and p["mask_add2"] == "fp16" and p["softmax"] == "fp16"
    assert result.plan.mask_sentinels == {"mask": -24576.0} and result.stats.clamped_values == 0
    report = check_validate(m, result.model)
    assert report["passed"], report["outputs"]
    feeds = attention_feeds()
    emu, ref = run_emulated(emulate(result.model), feeds)[0], run(m, feeds)[0]
    assert nonfinite(emu) == 0
    np.testing.assert_allclose(emu[2], ref[2], rtol=0, atol=1e-2 * np.abs(ref[2]).max())


def test_attention_mask_forced_low_gives_nan_in_the_fully_masked_row():
    m = masked_attention(shared=True)
    result = convert(m, include_nodes=["^mask_add"])
    p = precisions(result)
    assert p["mask_add1"] == "fp16" and p["mask_add2"] == "fp16"
    assert "data-range" in warning_codes(result)  # -1e9 clamped to -65504, said out loud
    assert result.stats.clamped_values > 0

    feeds = attention_feeds()
    ref = run(m, feeds)[0]
    emu = run_emulated(emulate(result.model), feeds)[0]
    assert nonfinite(ref) == 0
    # -65504 + -65504 = -131008 overflows fp16 to -inf; a Softmax row of only -inf is NaN.
    assert nonfinite(emu[2]) == emu[2].size
    assert np.isnan(emu[2]).all()
    # the rows with visible tokens stay finite and close to fp32
    assert nonfinite(emu[:2]) == 0
    np.testing.assert_allclose(emu[:2], ref[:2], rtol=0, atol=1e-2 * np.abs(ref[:2]).max())

    # A plain CPU run of the same converted model hides the overflow: ONNX Runtime's CPU provider has
    # no fp16 kernel for these Adds/Softmax, runs them in fp32 behind its own casts and drops the fp16
    # round trips, so -131008 is representable and every row stays finite (the fully masked row is
    # merely different from fp32, because the clamp to -65504 no longer drowns the scores).
    plain = run(result.model, feeds)[0]
    assert nonfinite(plain) == 0

    report = check_validate(m, result.model)
    out = report["outputs"][0]
    assert out["new_nan"] + out["new_inf"] > 0
    assert out["new_nan"] >= emu[2].size
    assert not out["passed"] and not report["passed"]
    assert any("NaN" in f for f in out["failures"])


# 2. Decomposed LayerNorm whose variance overflows fp16 -----------------------------------------------

C = 16


def layernorm_pow():
    """mean, x - mean, Pow 2, mean, + eps, Sqrt, Div."""
    nodes = [
        helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps_v", F32, [], [1e-5])),
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two_v", F32, [], [2.0])),
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="ln_mean"),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="ln_sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="ln_pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="ln_var"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln_add"),
        helper.make_node("Sqrt", ["var_eps"], ["sd"], name="ln_sqrt"),
        helper.make_node("Div", ["d", "sd"], ["y"], name="ln_div"),
    ]
    m = model(nodes, [tensor("x", F32, ["batch", C])], [tensor("y", F32, ["batch", C])])
    check(m)
    return m


def layernorm_naive():
    """var = mean(x*x) - mean(x)^2: both terms overflow for x of a few hundred."""
    nodes = [
        helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps_v", F32, [], [1e-5])),
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="ln_mean"),
        helper.make_node("Mul", ["x", "x"], ["x2"], name="ln_square"),
        helper.make_node("ReduceMean", ["x2"], ["ex2"], axes=[-1], name="ln_ex2"),
        helper.make_node("Mul", ["mu", "mu"], ["mu2"], name="ln_mu2"),
        helper.make_node("Sub", ["ex2", "mu2"], ["var"], name="ln_var"),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="ln_sub"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="ln_add"),
        helper.make_node("Sqrt", ["var_eps"], ["sd"], name="ln_sqrt"),
        helper.make_node("Div", ["d", "sd"], ["y"], name="ln_div"),
    ]
    m = model(nodes, [tensor("x", F32, ["batch", C])], [tensor("y", F32, ["batch", C])])
    check(m)
    return m


def big_rows(seed=1):
    return np.random.default_rng(seed).uniform(300, 1000, (4, C)).astype(np.float32)


def test_layernorm_default_conversion_keeps_reductions_fp32():
    result = convert(layernorm_pow())
    p = precisions(result)
    assert p["ln_mean"] == "fp32" and p["ln_pow"] == "fp32" and p["ln_var"] == "fp32" and p["ln_sqrt"] == "fp32"
    report = check_validate(layernorm_pow(), result.model, ranges={"x": (300.0, 1000.0)})
    assert report["passed"], report["outputs"]


def test_layernorm_variance_overflow_forced_low():
    m = layernorm_pow()
    result = convert(m, include_nodes=["^ln_"])
    assert set(precisions(result).values()) == {"fp16"}
    x = big_rows()
    ref = run(m, {"x": x})[0]
    emu, d2 = run_emulated(emulate(result.model), {"x": x}, extra_outputs=["d2"])
    assert nonfinite(ref) == 0
    # (x - mean)^2 reaches ~1e5 > 65504: inf in fp16, so sd = inf and y = d / inf = 0 (or NaN)
    assert np.isinf(d2).any()
    assert np.isinf(d2).sum() <= d2.size
    err = np.abs(np.nan_to_num(emu.astype(np.float64), nan=1e9) - ref)
    assert nonfinite(emu) > 0 or err.max() > 0.5 * np.abs(ref).max()

    # plain ORT CPU computes these ops in fp32 and hides it
    plain = run(result.model, {"x": x})[0]
    np.testing.assert_allclose(plain, ref, rtol=1e-3, atol=1e-3)

    report = check_validate(m, result.model, ranges={"x": (300.0, 1000.0)})
    assert not report["passed"]
    out = report["outputs"][0]
    assert out["new_nan"] + out["new_inf"] > 0 or out["relative_error"] > 0.5


def test_layernorm_naive_variance_overflow_gives_nan():
    m = layernorm_naive()
    result = convert(m, include_nodes=["^ln_"])
    assert set(precisions(result).values()) == {"fp16"}
    x = big_rows()
    ref = run(m, {"x": x})[0]
    emu = run_emulated(emulate(result.model), {"x": x})[0]
    assert nonfinite(ref) == 0
    assert np.isnan(emu).any()  # inf - inf
    report = check_validate(m, result.model, ranges={"x": (300.0, 1000.0)})
    assert report["outputs"][0]["new_nan"] > 0 and not report["passed"]
    # on standard-normal inputs the same conversion is harmless: the checker is input-dependent
    assert check_validate(m, result.model)["outputs"][0]["new_nan"] == 0


# 3. An epsilon that flushes to zero in fp16, on rows whose variance is 0 --------------------------------


def normalize_eps():
    nodes = [
        helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps_v", F32, [], [1e-12])),
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="n_mean"),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="n_sub"),
        helper.make_node("Mul", ["d", "d"], ["d2"], name="n_square"),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="n_var"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="n_add"),
        helper.make_node("Sqrt", ["var_eps"], ["sd"], name="n_sqrt"),
        helper.make_node("Div", ["d", "sd"], ["y"], name="n_div"),
    ]
    m = model(nodes, [tensor("x", F32, ["batch", C])], [tensor("y", F32, ["batch", C])])
    check(m)
    return m


def constant_rows():
    x = np.random.default_rng(2).standard_normal((4, C)).astype(np.float32)
    x[1] = 0.5
    x[3] = -2.0
    return x


def test_flushed_epsilon_forced_low_divides_by_zero(tmp_path):
    m = normalize_eps()
    assert set(precisions(convert(m)).values()) == {"fp32"}  # by default the eps keeps it fp32
    result = convert(m, include_nodes=["^n_"])
    assert set(precisions(result).values()) == {"fp16"}
    assert "data-flush" in warning_codes(result)
    x = constant_rows()
    ref = run(m, {"x": x})[0]
    emu = run_emulated(emulate(result.model), {"x": x})[0]
    assert nonfinite(ref) == 0
    np.testing.assert_array_equal(ref[1], 0)
    # var = 0, eps = 0 in fp16: 0 / sqrt(0) = NaN on the constant rows only
    assert np.isnan(emu[1]).all() and np.isnan(emu[3]).all()
    assert nonfinite(emu[[0, 2]]) == 0
    np.testing.assert_allclose(emu[[0, 2]], ref[[0, 2]], rtol=0, atol=1e-2)
    # Here the plain CPU run shows it too: the converted model stores eps as an fp16 zero, so even
    # fp32 arithmetic divides 0 by 0.
    plain = run(result.model, {"x": x})[0]
    assert np.isnan(plain[1]).all()

    np.savez(tmp_path / "rows.npz", x=x)
    report = check_validate(m, result.model, inputs=str(tmp_path / "rows.npz"))
    assert report["outputs"][0]["new_nan"] == 2 * C
    assert not report["passed"]


# 4. Values beyond 65504: a forced weight, and MatMul outputs -------------------------------------------

K, N = 8, 4


def matmul_model(w):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        [tensor("x", F32, ["batch", K])],
        [tensor("y", F32, ["batch", N])],
        [init("w", w)],
    )
    check(m)
    return m


def test_weight_above_fp16_range_forced_low_overflows():
    w = np.random.default_rng(3).standard_normal((K, N)).astype(np.float32)
    w[0, 0] = 1e5
    m = matmul_model(w)
    assert precisions(convert(m))["fc"] == "fp32"
    result = convert(m, include_nodes=["^fc$"])
    assert precisions(result)["fc"] == "fp16"
    assert "data-range" in warning_codes(result) and result.stats.clamped_values == 1
    x = np.random.default_rng(4).standard_normal((3, K)).astype(np.float32)
    x[:, 0] = 2.0
    ref = run(m, {"x": x})[0]
    emu = run_emulated(emulate(result.model), {"x": x})[0]
    assert nonfinite(ref) == 0 and np.abs(ref[:, 0]).min() > 65504
    # 2 * 65504 (the clamped weight) + ... overflows in the fp16 output of the MatMul
    assert np.isinf(emu[:, 0]).all()
    assert nonfinite(emu[:, 1:]) == 0
    # plain CPU keeps the MatMul output in fp32: finite (but off by the clamp)
    plain = run(result.model, {"x": x})[0]
    assert nonfinite(plain) == 0

    report = check_validate(m, result.model, ranges={"x": (1.5, 2.5)})
    assert report["outputs"][0]["new_inf"] > 0 and not report["passed"]


def test_matmul_outputs_above_fp16_range_overflow_only_in_emulation():
    m = matmul_model(np.ones((K, N), np.float32))
    result = convert(m)
    assert precisions(result)["fc"] == "fp16"  # nothing in the graph says it is unsafe
    x = np.random.default_rng(5).uniform(9000, 10000, (3, K)).astype(np.float32)
    ref = run(m, {"x": x})[0]
    assert nonfinite(ref) == 0 and ref.min() > 65504
    emu = run_emulated(emulate(result.model), {"x": x})[0]
    assert np.isposinf(emu).all()
    # plain CPU: the fp32 kernel behind ORT's casts; exactly the reference
    plain = run(result.model, {"x": x})[0]
    np.testing.assert_allclose(plain, ref, rtol=1e-6)

    emulated = check_validate(m, result.model, ranges={"x": (9000.0, 10000.0)})
    assert emulated["numerics"] == "emulate"
    assert emulated["outputs"][0]["new_inf"] == emulated["outputs"][0]["elements"] > 0
    assert not emulated["passed"]
    plain_report = check_validate(m, result.model, ranges={"x": (9000.0, 10000.0)}, numerics="plain")
    assert plain_report["numerics"] == "plain"
    assert plain_report["outputs"][0]["new_inf"] == 0 and plain_report["passed"]


# 5. Safe case: a small MLP ---------------------------------------------------------------------------


def mlp(seed=6):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((16, 32)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((32, 8)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    m = model(
        nodes, [tensor("x", F32, ["batch", 16])], [tensor("y", F32, ["batch", 8])], [init("w1", w1), init("w2", w2)]
    )
    check(m)
    return m


def mlp_input(seed=7):
    return np.random.default_rng(seed).standard_normal((4, 16)).astype(np.float32)


def test_safe_mlp_matches_fp32_and_really_rounds():
    m = mlp()
    result = convert(m)
    assert precisions(result) == {"fc1": "fp16", "relu": "fp16", "fc2": "fp16"}
    emu_model = emulate(result.model)
    x = mlp_input()
    ref = run(m, {"x": x})[0]
    emu, h, a = run_emulated(emu_model, {"x": x}, extra_outputs=["h", "a"])
    assert nonfinite(emu) == 0
    diff = np.abs(emu.astype(np.float64) - ref)
    assert diff.max() <= 1e-2 * np.abs(ref).max()
    assert diff.max() > 0  # rounding really happens
    # the fp16 tensors of the converted model hold fp16 values (and are not just fp32 copies)
    for inner in (h, a, emu):
        assert fp16_exact(inner)
        assert np.array_equal(np.float16(inner).astype(np.float32), inner)
    href = run(_with_outputs(m, ["h"]), {"x": x})[1]
    assert not np.array_equal(h, href)
    np.testing.assert_allclose(h, href, rtol=1e-2, atol=1e-2)

    report = check_validate(m, result.model)
    assert report["passed"]
    assert 0 < report["outputs"][0]["relative_error"] < 1e-2


def _with_outputs(m, names):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for name in names:
        out.graph.output.append(helper.make_tensor_value_info(name, F32, None))
    return out


def test_emulation_leaves_the_converted_model_untouched():
    result = convert(mlp())
    before = result.model.SerializeToString()
    emulation_model(result.model)
    assert result.model.SerializeToString() == before


def test_emulation_keeps_low_precision_model_inputs_and_outputs():
    """keep_io_types=False: the model's own inputs/outputs are fp16 and stay so; the feed is used exactly."""
    m = mlp()
    result = convert(m, keep_io_types=False)
    inputs = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.input}
    outputs = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.output}
    assert inputs["x"] == F16 and outputs["y"] == F16
    emu_model = emulate(result.model)
    x = mlp_input()
    emu = run_emulated(emu_model, {"x": x.astype(np.float16)})[0]
    assert emu.dtype == np.float16
    ref = run(m, {"x": x})[0]
    np.testing.assert_allclose(emu.astype(np.float32), ref, rtol=0, atol=1e-2 * np.abs(ref).max())
    assert check_validate(m, result.model)["passed"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_rounding_is_round_to_nearest_even_with_overflow_and_underflow(precision):
    """A value-preserving op (Neg) forced low: emulation must give exactly numpy's conversion
    (round to nearest even; beyond the range -> inf; below half the smallest subnormal -> 0)."""
    m = model([helper.make_node("Neg", ["x"], ["y"], name="neg")], [tensor("x", F32, [12])], [tensor("y", F32, [12])])
    result = convert(m, precision=precision, include_nodes=["^neg$"])
    assert precisions(result)["neg"] == precision
    emu_model = emulate(result.model)
    if precision == "fp16":
        ulp = 2.0**-10
        x = np.array(
            [
                1 + 0.75 * ulp,
                1 + 0.25 * ulp,
                1 + 0.5 * ulp,
                1 + 1.5 * ulp,
                70000.0,
                -1e6,
                2e-8,
                4e-8,
                65504.0,
                3.0e-5,
                -0.1,
                123.456,
            ],
            np.float32,
        )
        with np.errstate(over="ignore"):
            want = -(x.astype(np.float16).astype(np.float32))
        assert np.isinf(want[4]) and want[6] == 0 and want[7] != 0
    else:
        ulp = 2.0**-7
        x = np.array(
            [
                1 + 0.75 * ulp,
                1 + 0.25 * ulp,
                1 + 0.5 * ulp,
                1 + 1.5 * ulp,
                3.0e38,
                -1e30,
                1e-30,
                3.3e-39,
                65504.0,
                3.0e-5,
                -0.1,
                123.456,
            ],
            np.float32,
        )
        want = -_round_bf16(x)
    emu = run_emulated(emu_model, {"x": x})[0]
    np.testing.assert_array_equal(emu, want)


def _round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even) -> float32, for finite x."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


# 6. bf16 -----------------------------------------------------------------------------------------------


def test_bf16_mlp_rounds_to_bf16():
    m = mlp()
    assert m.opset_import[0].version == 17
    result = convert(m, precision="bf16")
    assert precisions(result) == {"fc1": "bf16", "relu": "bf16", "fc2": "bf16"}
    assert {t.data_type for t in result.model.graph.initializer} == {BF16}
    emu_model = emulate(result.model)
    # every initializer of the emulation model is fp32, holding the bf16 values exactly
    assert {t.data_type for t in emu_model.graph.initializer} == {F32}
    for t in emu_model.graph.initializer:
        assert bf16_exact(onnx.numpy_helper.to_array(t))
    x = mlp_input()
    ref = run(m, {"x": x})[0]
    emu, h, a = run_emulated(emu_model, {"x": x}, extra_outputs=["h", "a"])
    for inner in (h, a, emu):
        assert bf16_exact(inner)
    href = run(_with_outputs(m, ["h"]), {"x": x})[1]
    assert not bf16_exact(href)  # the fp32 values are not bf16 values: the rounding is emulation's
    diff = np.abs(emu.astype(np.float64) - ref)
    assert 0 < diff.max() <= 3e-2 * np.abs(ref).max()
    report = check_validate(m, result.model, thresholds=Thresholds(rtol=0.05, min_cosine=0.99))
    assert report["numerics"] == "emulate" and report["passed"]


# 7. Subgraphs ------------------------------------------------------------------------------------------


def if_model():
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((8, 4)) * 0.5).astype(np.float32)
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t_out"], name="then_fc")],
        "then",
        [],
        [tensor("t_out", F32, ["batch", 4])],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w_else"], ["e_mm"], name="else_fc"),
            helper.make_node("Neg", ["e_mm"], ["e_out"], name="else_neg"),
        ],
        "else",
        [],
        [tensor("e_out", F32, ["batch", 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero_v", F32, [], [0.0])),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="cond"),
        helper.make_node("If", ["c"], ["branch_out"], then_branch=then_g, else_branch=else_g, name="branch"),
        helper.make_node("MatMul", ["branch_out", "w_head"], ["y"], name="head"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, ["batch", 8])],
        [tensor("y", F32, ["batch", 2])],
        [init("w", w), init("w_else", -w), init("w_head", w[:4, :2].copy())],
    )
    check(m)
    return m


def test_if_branch_with_fp16_matmul():
    m = if_model()
    result = convert(m)
    p = precisions(result)
    assert p["then_fc"] == "fp16" and p["else_fc"] == "fp16" and p["head"] == "fp16"
    emu_model = emulate(result.model)
    # inside the branches the emulation computes in fp32 and rounds through fp16
    branch = next(n for n in emu_model.graph.node if n.op_type == "If")
    for attr in branch.attribute:
        casts = [n for n in attr.g.node if n.op_type == "Cast"]
        assert any(c.attribute[0].i == F16 for c in casts)
        assert not any(t.data_type in (F16, BF16) for t in attr.g.initializer)
    rng = np.random.default_rng(9)
    for sign in (1.0, -1.0):  # both branches
        x = (sign * np.abs(rng.standard_normal((3, 8)))).astype(np.float32)
        ref = run(m, {"x": x})[0]
        emu = run_emulated(emu_model, {"x": x})[0]
        assert nonfinite(emu) == 0
        diff = np.abs(emu - ref)
        assert 0 < diff.max() <= 1e-2 * np.abs(ref).max()
        assert fp16_exact(emu)
    assert check_validate(m, result.model, batches=3)["passed"]


def test_emulation_of_a_scan_body_with_low_precision_tensors_loads_and_matches():
    """Regression (found by the property tests): the emulation builder cleared the body graphs'
    value_info after the node lists were rewritten, i.e. on detached copies, so the body kept
    declaring fp16 for tensors that the emulation computes in fp32 and ONNX Runtime refused it."""
    import onnxruntime as ort
    from helpers import parse, randn

    import autocast_onnx

    body = onnx.parser.parse_graph("""
        body (float[8] s, float[8] xt) => (float[8] s_out, float[8] y) {
            m = MatMul(xt, w)
            s_out = Add(s, m)
            y = Tanh(m)
        }""")
    body.value_info.append(helper.make_tensor_value_info("m", onnx.TensorProto.FLOAT, [8]))
    model = parse(
        """
        scan (float[8] s0, float[4,8] x) => (float[8] s, float[4,8] ys) {
            s, ys = Scan<num_scan_inputs = 1>(s0, x)
        }""",
        w=randn([8, 8], 3, 0.3),
    )
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("body", body))
    converted = autocast_onnx.convert(model).model
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in converted.graph.node[0].attribute[-1].g.value_info}
    assert declared["m"] == F16  # the converted body declares its fp16 tensor
    emulated = emulation_model(converted)
    feeds = {"s0": randn([8], 1), "x": randn([4, 8], 2)}
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    out = ort.InferenceSession(emulated.SerializeToString()).run(None, feeds)
    for r, o in zip(ref, out):
        np.testing.assert_allclose(o, r, atol=2e-2 * max(1.0, float(np.abs(r).max())))
