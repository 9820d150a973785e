"""The emulation follows the compute table (validate/emulate_steps.py, issue 37 item 4): a node whose CUDA kernel
chains several operations in the low type is emulated step by step, each step rounded, as the kernel computes it;
a node whose kernel computes in float and rounds once is emulated as before.

The references below transcribe each kernel's arithmetic (the source lines data/compute_cuda.json cites) in numpy:
numpy's float16 operations are IEEE operations of half precision, and a bfloat16 operation is the float operation
rounded to bfloat16, as ONNX Runtime's BFloat16 operators compute it. Every fp16 (or bf16) value in a range is fed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx.catalog.compute import ComputeFact
from autocast_onnx.dtypes import bf16_bits_to_float, float_to_bf16_bits
from autocast_onnx.validate import emulate_steps
from autocast_onnx.validate.emulate import emulation_model

F16, BF16, F32 = TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT
MS = "com.microsoft"
ROOT = Path(__file__).resolve().parents[2]


def rnd(x, low):
    """Round float32 values to the low type and back (what one low-precision operation does to its result)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if low == F16:
            return x.astype(np.float16).astype(np.float32)
        return np.where(np.isnan(x), x, bf16_bits_to_float(float_to_bf16_bits(x)))


def every_value(low, lo, hi):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16).astype(np.float32) if low == F16 else bf16_bits_to_float(bits)
    return np.unique(x[np.isfinite(x) & (x >= lo) & (x <= hi)])


def f32(fn):
    return lambda x: fn(np.asarray(x, dtype=np.float64)).astype(np.float32)


EXP, LOG, TANH = f32(np.exp), f32(np.log), f32(np.tanh)
ERF = f32(np.vectorize(math.erf, otypes=[np.float64]))


# --- the kernels' arithmetic, each operation rounded (r) --------------------------------------------------------
def fast_gelu(x, low):  # gelu_approximate_impl.cu FastGeluKernel
    r = lambda v: rnd(v, low)  # noqa: E731
    a, b, c = r(0.5), r(0.7978845608028654), r(0.035677408136300125)
    t = r(r(r(r(c * x) * x) + b) * x)
    return r(x * r(a + r(a * r(TANH(t)))))


def half_gelu(x, low):  # common.cuh _Gelu(half) after BiasGelu's x + bias
    r = lambda v: rnd(v, low)  # noqa: E731
    return r(r(x * r(0.5)) * r(r(1.0) + r(ERF(r(r(0.7071067811865476) * x)))))


def sigmoid_branches(v, low):  # OP_Sigmoid / OP_QuickGelu: both branches in T
    r = lambda u: rnd(u, low)  # noqa: E731
    with np.errstate(all="ignore"):
        return r(1 / r(1 + r(EXP(-v)))), r(1 - r(1 / r(1 + r(EXP(v)))))


def sigmoid(x, low):
    pos, neg = sigmoid_branches(x, low)
    return np.where(x > 0, pos, neg)


def quick_gelu(x, low):
    v = rnd(x * rnd(1.702, low), low)
    pos, neg = sigmoid_branches(v, low)
    return rnd(x * np.where(v >= 0, pos, neg), low)


def elu(x, low):
    return np.where(x > 0, x, rnd(rnd(1.0, low) * rnd(rnd(EXP(x), low) - 1, low), low))


def selu(x, low):
    r = lambda v: rnd(v, low)  # noqa: E731
    gamma, alpha = r(1.05070102214813232421875), r(1.67326319217681884765625)
    return np.where(x > 0, r(gamma * x), r(r(gamma * alpha) * r(r(EXP(x)) - 1)))


def softplus(x, low):
    r = lambda v: rnd(v, low)  # noqa: E731
    with np.errstate(all="ignore"):
        return np.where(x > 0, r(x + r(LOG(r(r(EXP(-x)) + 1)))), r(LOG(r(r(EXP(x)) + 1))))


def softsign(x, low):
    return rnd(x / rnd(1 + np.abs(x), low), low)


def hard_sigmoid(x, low):
    return np.maximum(np.minimum(rnd(rnd(rnd(0.2, low) * x, low) + rnd(0.5, low), low), 1), 0)


def leaky_relu(x, low):
    return np.where(x > 0, x, rnd(rnd(0.01, low) * x, low))


def once(fn, low):
    """The float formula rounded once: what the emulation computed for these ops before."""
    return lambda x: rnd(fn(x), low)


FLOAT_FORMULA = {
    "FastGelu": lambda x: (
        x * (0.5 + 0.5 * TANH(x * (np.float32(0.035677408136300125) * x * x + np.float32(0.7978845608028654))))
    ),
    "Sigmoid": lambda x: 1 / (1 + EXP(-x)),
    "Elu": lambda x: np.where(x > 0, x, EXP(x) - 1),
    "LeakyRelu": lambda x: np.where(x > 0, x, np.float32(0.01) * x),
}


# --- models ------------------------------------------------------------------------------------------------------
def one_node(op, low, domain="", inputs=("x",), opset=20, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, list(inputs), ["y"], name="node", domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, low, [None]) for n in inputs],
        [helper.make_tensor_value_info("y", low, [None])],
    )
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def emulated(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    session = ort.InferenceSession(emulation_model(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0].astype(np.float32)


def feed(x, low):
    """fp16 inputs are fed as fp16; bf16 inputs as fp32 holding bf16 values (the emulation's convention)."""
    return x.astype(np.float16) if low == F16 else x.astype(np.float32)


def same_bits(a, b) -> bool:
    return bool(np.array_equal(np.nan_to_num(a, nan=7.0), np.nan_to_num(b, nan=7.0)))


CASES = [
    ("FastGelu", MS, {}, fast_gelu, F16, (-10, 10)),
    ("FastGelu", MS, {}, fast_gelu, BF16, (-10, 10)),
    ("Gelu", "", {"approximate": "tanh"}, fast_gelu, F16, (-10, 10)),
    ("Sigmoid", "", {}, sigmoid, BF16, (-20, 20)),
    ("QuickGelu", MS, {}, quick_gelu, F16, (-20, 20)),
    ("QuickGelu", MS, {}, quick_gelu, BF16, (-20, 20)),
    ("Elu", "", {}, elu, F16, (-20, 5)),
    ("Selu", "", {}, selu, F16, (-20, 5)),
    ("Softplus", "", {}, softplus, F16, (-20, 20)),
    ("Softsign", "", {}, softsign, F16, (-100, 100)),
    ("HardSigmoid", "", {}, hard_sigmoid, F16, (-6, 6)),
    ("LeakyRelu", "", {}, leaky_relu, F16, (-1000, 10)),
]


@pytest.mark.parametrize("op, domain, attrs, kernel, low, span", CASES, ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_a_per_step_kernel_is_emulated_step_by_step(op, domain, attrs, kernel, low, span):
    x = every_value(low, *span)
    got = emulated(one_node(op, low, domain, **attrs), {"x": feed(x, low)})
    assert same_bits(got, kernel(x, low))


@pytest.mark.parametrize(
    "op, low", [("FastGelu", F16), ("FastGelu", BF16), ("Sigmoid", BF16), ("Elu", F16), ("LeakyRelu", F16)]
)
def test_the_steps_change_what_a_single_rounding_gave(op, low):
    """Before this, the emulation rounded these once: thousands of ulps away near the cancellations."""
    x = every_value(low, -10, 10)
    domain = MS if op == "FastGelu" else ""
    got = emulated(one_node(op, low, domain), {"x": feed(x, low)})
    single = once(FLOAT_FORMULA[op], low)(x)
    assert not same_bits(got, single)
    if op == "FastGelu" and low == F16:
        at = int(np.argmin(np.abs(x + 3.586)))  # fp16: 0 where the float formula rounded once gives -4.4e-4
        assert got[at] == 0 and single[at] < -4e-4


def test_fast_gelu_adds_its_bias_in_the_low_type_first():
    x = every_value(F16, -8, 8)
    bias = np.full_like(x, 0.1)
    got = emulated(one_node("FastGelu", F16, MS, inputs=("x", "b")), {"x": feed(x, F16), "b": feed(bias, F16)})
    assert same_bits(got, fast_gelu(rnd(rnd(x, F16) + rnd(bias, F16), F16), F16))


def test_bias_gelu_fp16_is_the_half_gelu_of_the_rounded_sum():
    x = every_value(F16, -8, 8)
    bias = np.full_like(x, -0.3)
    got = emulated(one_node("BiasGelu", F16, MS, inputs=("x", "b")), {"x": feed(x, F16), "b": feed(bias, F16)})
    assert same_bits(got, half_gelu(rnd(x + rnd(bias, F16), F16), F16))


def test_a_sum_of_three_rounds_after_each_add_and_bias_add_runs_on_the_cpu():
    """BiasAdd has no CPU kernel: its steps (two Adds) let the emulation run it at all."""
    a, b, c = (np.full(4, v, np.float16) for v in (2048.0, 1.0, 1.0))
    assert emulated(one_node("Sum", F16, inputs=("a", "b", "c")), {"a": a, "b": b, "c": c}).tolist() == [2048.0] * 4
    assert (
        emulated(one_node("BiasAdd", F16, MS, inputs=("a", "b", "c")), {"a": a, "b": b, "c": c}).tolist()
        == [2048.0] * 4
    )
    # two inputs: one Add, one rounding, as before
    assert emulated(one_node("Sum", F16, inputs=("a", "b")), {"a": a, "b": b}).tolist() == [2048.0] * 4


def test_thresholded_relu_compares_with_its_alpha_rounded():
    """alpha 0.3 is 0.30004883 in fp16: an input of that value passes 0.3 in fp32, not itself in fp16."""
    x = np.array([0.300048828125, 0.5], np.float16)
    assert emulated(one_node("ThresholdedRelu", F16, alpha=0.3), {"x": x}).tolist() == [0.0, 0.5]
    assert emulated(one_node("ThresholdedRelu", F16, alpha=0.5), {"x": x}).tolist() == [0.0, 0.0]


def steps_in(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in emulation_model(model).graph.node if "__emu_step" in n.name or "__emu_c" in n.name]


@pytest.mark.parametrize(
    "model",
    [
        one_node("Softmax", F16, axis=-1),
        one_node("Sigmoid", F16),  # a half specialisation computes in float and rounds once
        one_node("Gelu", F16),  # approximate='none': float, once
        one_node("Sum", BF16, inputs=("a", "b")),
        one_node("FastGelu", F32, MS),  # not a low type
        one_node("Sigmoid", BF16, opset=8),  # the steps need opset 9 (Erf, Where)
    ],
    ids=["softmax", "sigmoid-fp16", "gelu-none", "sum-of-two", "fp32", "opset-8"],
)
def test_other_nodes_are_emulated_as_before(model):
    assert steps_in(model) == []


def test_the_emulation_follows_the_table(monkeypatch):
    """A table that said FastGelu computes in float and rounds once would leave it one rounding."""
    model = one_node("FastGelu", F16, MS)
    assert steps_in(model)

    def float_once(runtime, domain, op, low):
        return ComputeFact(op, "float", "once", "x:1@0", "test", domain=domain, low_type=low)

    monkeypatch.setattr(emulate_steps, "computes_in_fp32", float_once)
    assert steps_in(model) == []


def test_a_node_inside_a_subgraph_is_emulated_step_by_step():
    body = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["s"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("s", BF16, [None])],
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=body)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", BF16, [None])],
        [helper.make_tensor_value_info("y", BF16, [None])],
        [cond],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = every_value(BF16, -12, 12)
    assert same_bits(emulated(model, {"x": x}), sigmoid(x, BF16))


# --- the sizes docs/validate.md quotes ---------------------------------------------------------------------------
def ulps(x, low):
    """Each value's position on the low type's number line (ordered integers), to count ulps between values."""
    bits = x.astype(np.float16).view(np.int16) if low == F16 else float_to_bf16_bits(x).view(np.int16)
    bits = bits.astype(np.int64)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


ONCE = {
    "FastGelu": FLOAT_FORMULA["FastGelu"],
    "BiasGelu": lambda x: x * 0.5 * (1 + ERF(x / np.float32(math.sqrt(2)))),
    "QuickGelu": lambda x: x / (1 + EXP(-1.702 * x)),
    "Sigmoid": FLOAT_FORMULA["Sigmoid"],
    "Elu": FLOAT_FORMULA["Elu"],
    "Selu": lambda x: np.where(
        x > 0,
        np.float32(1.05070102214813232421875) * x,
        np.float32(1.05070102214813232421875 * 1.67326319217681884765625) * (EXP(x) - 1),
    ),
    "Softplus": f32(lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)),
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "HardSigmoid": lambda x: np.clip(np.float32(0.2) * x + np.float32(0.5), 0, 1),
    "LeakyRelu": FLOAT_FORMULA["LeakyRelu"],
}
# op: (kernel, low, range, % of outputs that differ, max ulps, max absolute difference): docs/validate.md's table
DOCUMENTED = {
    "FastGelu": (fast_gelu, F16, (-10, 10), "29.0", 3881, "2e-03"),
    "BiasGelu": (half_gelu, F16, (-10, 10), "29.2", 3916, "2e-03"),
    "QuickGelu": (quick_gelu, F16, (-20, 20), "40.8", 6265, "4e-03"),
    "Sigmoid": (sigmoid, BF16, (-20, 20), "4.3", 15227, "5e-03"),
    "Elu": (elu, F16, (-20, 5), "37.4", 3072, "5e-04"),
    "Selu": (selu, F16, (-20, 5), "45.1", 3848, "4e-03"),
    "Softplus": (softplus, F16, (-20, 20), "45.2", 4095, "4e-03"),
    "Softsign": (softsign, F16, (-100, 100), "23.0", 1, "5e-04"),
    "HardSigmoid": (hard_sigmoid, F16, (-6, 6), "3.8", 410, "5e-04"),
    "LeakyRelu": (leaky_relu, F16, (-1000, 10), "13.2", 1, "8e-03"),
}


@pytest.mark.parametrize("op", sorted(DOCUMENTED))
def test_the_documented_difference_from_a_single_rounding(op):
    """The per-step kernel against the float formula rounded once, over every input of the range: the numbers
    docs/validate.md gives, and the row of its table says them."""
    kernel, low, (lo, hi), percent, max_ulps, max_abs = DOCUMENTED[op]
    x = every_value(low, lo, hi)
    steps, single = kernel(x, low), rnd(ONCE[op](x), low)
    finite = np.isfinite(steps) & np.isfinite(single)
    apart = np.abs(ulps(steps[finite], low) - ulps(single[finite], low))
    assert (f"{100 * np.mean(apart > 0):.1f}", int(apart.max())) == (percent, max_ulps)
    assert f"{np.max(np.abs(steps[finite] - single[finite])):.0e}" == max_abs
    docs = (ROOT / "docs" / "validate.md").read_text(encoding="utf-8")
    [row] = [line for line in docs.splitlines() if line.startswith((f"| {op} (", f"| {op}, "))]
    assert f"| {percent} % | {max_ulps} ulp" in row and f"| {max_abs} |" in row, row


def _skip_ln_model(simplified: bool, with_sum: bool, rows: int = 6, width: int = 64):
    """One fp16 (Skip)(Simplified)LayerNormalization of ONNX Runtime's contrib domain, as the transformers
    optimizer writes it, its inputs and outputs fp16, bias given."""
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    ins = ["x", "skip", "gamma"] + ([] if simplified else ["beta"]) + ["bias"]
    outs = ["y"] + (["", "", "sum"] if with_sum else [])
    node = helper.make_node(op, ins, outs, name="sln", domain="com.microsoft", epsilon=1e-5)
    g = np.random.default_rng(3)
    consts = {"gamma": 1 + 0.1 * g.standard_normal(width), "beta": 0.1 * g.standard_normal(width)}
    consts["bias"] = 0.1 * g.standard_normal(width)
    inits = [numpy_helper.from_array(v.astype(np.float16), k) for k, v in consts.items() if k in ins]
    f16 = TensorProto.FLOAT16
    inputs = [helper.make_tensor_value_info(n, f16, [rows, width]) for n in ("x", "skip")]
    outputs = [helper.make_tensor_value_info(n, f16, [rows, width]) for n in outs if n]
    graph = helper.make_graph([node], "sln", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return m, {k: v.astype(np.float16) for k, v in consts.items()}


def _kernel_skip_ln(x, skip, c, simplified: bool, eps: float = 1e-5):
    """numpy's account of skip_layer_norm_impl.cu / layer_norm.cuh without strict mode (the compute
    table's row): every step in half, the block sums taken in float and rounded once."""
    h = np.float16

    def r(v):
        return np.asarray(v, np.float32).astype(h)

    val = r(r(x.astype(np.float32) + skip) + c["bias"])
    inv = r(1.0 / x.shape[-1])
    scaled = r(val.astype(np.float32) * inv)
    mean_sq = r((r(scaled.astype(np.float32) * val)).astype(np.float32).sum(-1, keepdims=True))
    if simplified:
        var = mean_sq
    else:
        mean = r(scaled.astype(np.float32).sum(-1, keepdims=True))
        var = r(mean_sq.astype(np.float32) - r(mean.astype(np.float32) * mean))
    rsigma = r(1.0 / np.sqrt(r(var.astype(np.float32) + r(eps)).astype(np.float32)))
    if simplified:
        return r(r(c["gamma"].astype(np.float32) * val) * rsigma), val
    out = r(r(c["gamma"].astype(np.float32) * r(val.astype(np.float32) - mean)) * rsigma)
    return r(out.astype(np.float32) + c["beta"]), val


@pytest.mark.parametrize("simplified", [False, True], ids=["skip_layer_norm", "skip_simplified"])
@pytest.mark.parametrize("with_sum", [False, True], ids=["y", "y_and_sum"])
def test_skip_layer_norm_is_emulated_as_its_kernel_steps(simplified, with_sum):
    """The CUDA SkipLayerNormalization kernel at the compute table's commit computes in fp16 (no strict
    mode): its emulation takes those steps (validate/emulate_steps.py `_skip_layer_norm`), so an
    fp16 SkipLayerNormalization (a model the optimizer fused, converted by any tool) is emulated as the
    GPU runs it, within an ulp of numpy's account of the kernel, and not as one rounding of the float
    formula; the sum output is the rounded sum."""
    m, c = _skip_ln_model(simplified, with_sum)
    g = np.random.default_rng(8)
    x = (4 + 3 * g.standard_normal((6, 64))).astype(np.float16)  # an offset row: the fp16 statistics lose most
    skip = g.standard_normal((6, 64)).astype(np.float16)
    emulated = emulation_model(m)
    assert "SkipLayerNormalization" not in {n.op_type for n in emulated.graph.node}
    outs = run_model(emulated, {"x": x, "skip": skip})
    want, val = _kernel_skip_ln(x, skip, c, simplified)
    got = outs[0].astype(np.float32)
    ulp = np.spacing(np.abs(want)).astype(np.float32)
    assert np.all(np.abs(got - want.astype(np.float32)) <= ulp)
    if with_sum:
        assert np.array_equal(outs[1], val)
    v = val.astype(np.float32)
    if simplified:
        once = c["gamma"] * v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-5)
    else:
        mu = v.mean(-1, keepdims=True)
        once = c["gamma"] * (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + 1e-5) + c["beta"]
    assert not np.array_equal(got, once.astype(np.float16).astype(np.float32))


def test_skip_layer_norm_writing_its_statistics_is_left_whole():
    m, _ = _skip_ln_model(False, False)
    node = m.graph.node[0]
    node.output.extend(["mean", ""])
    m.graph.output.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, [6, 1]))
    assert emulate_steps.decompose(m) == 0


def run_model(model: onnx.ModelProto, feeds: dict) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
