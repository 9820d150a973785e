"""The fast plan (plan/kernel_io.py, FAST_OPS; paint pass 6, its first phase): planned for ONNX
Runtime's CUDA provider (the default), the normalizations, softmaxes and other bounded ops whose
kernels compute in fp32 run at low-precision inputs and outputs together with the streams they
sit on (a transformer's residual stream), as an all-fp16 conversion runs them; `--precise` keeps
them fp32 with those streams. Minimal graphs for each rule, and the shipped models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import F32, check, convert, cost_of, init, model, randn, run, tensor
from onnx import helper

import autocast_onnx
from autocast_onnx.validate.emulate import emulation_model

ROOT = Path(__file__).resolve().parents[2]
H = 8


def residual_blocks(layers=2, gamma=None):
    """x -> [MatMul -> Add(residual) -> LayerNormalization] x layers -> MatMul -> y: the residual
    stream of a post-norm transformer. `gamma` (default: rounded-by-fp16 values) is every
    LayerNormalization's scale."""
    gamma = randn([H], 9, 0.1) + 1.0 if gamma is None else gamma
    nodes, inits, stream = [], [init("gamma", gamma), init("beta", randn([H], 8, 0.1))], "x0"
    nodes.append(helper.make_node("MatMul", ["x", "w_in"], [stream], name="mm_in"))
    inits.append(init("w_in", randn([H, H], 1, 0.3)))
    for k in range(layers):
        nodes += [
            helper.make_node("MatMul", [stream, f"w{k}"], [f"h{k}"], name=f"mm{k}"),
            helper.make_node("Add", [stream, f"h{k}"], [f"r{k}"], name=f"res{k}"),
            helper.make_node("LayerNormalization", [f"r{k}", "gamma", "beta"], [f"n{k}"], name=f"ln{k}", axis=-1),
        ]
        inits.append(init(f"w{k}", randn([H, H], 10 + k, 0.3)))
        stream = f"n{k}"
    nodes.append(helper.make_node("MatMul", [stream, "w_out"], ["y"], name="mm_out"))
    inits.append(init("w_out", randn([H, H], 2, 0.3)))
    m = model(nodes, [tensor("x", F32, [4, H])], [tensor("y", F32, [4, H])], inits)
    check(m)
    return m


def precisions(result):
    return {n.name: n.precision for n in result.plan.nodes if n.name}


def last_code(result, name):
    [node] = result.plan.by_name(name)
    return node.reasons[-1].code


def test_the_residual_stream_runs_low_by_default_and_fp32_with_precise():
    m = residual_blocks()
    fast, precise = convert(m), convert(m, precise=True)
    p, q = precisions(fast), precisions(precise)
    assert [p[f"ln{k}"] for k in range(2)] == ["fp16", "fp16"] and p["res1"] == "fp16"
    assert (
        last_code(fast, "ln0") == "fast-plan"
        and "--precise keeps it" in fast.plan.by_name("ln0")[0].reasons[-1].message
    )
    assert [q[f"ln{k}"] for k in range(2)] == ["fp32", "fp32"] and q["res1"] == "fp32"
    assert fast.stats.casts_added == 2 and precise.stats.casts_added > 2
    assert cost_of(fast)["cast_bytes"] < cost_of(precise)["cast_bytes"]
    feeds = {"x": randn([4, H], 3)}
    ref = run(m, feeds)[0]
    for result in (fast, precise):
        out = run(emulation_model(result.model), feeds)[0]
        assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max()


def test_the_summary_names_the_fast_plan_and_the_price_of_precise():
    result = convert(residual_blocks())
    from autocast_onnx.report.summary import conversion_summary, summary_dict

    fast = summary_dict(result)["fast_plan"]
    assert fast["nodes"] == 2 and fast["ops"] == {"LayerNormalization": 2} and fast["cast_bytes"] > 0
    [line] = [x for x in conversion_summary(result).splitlines() if x.startswith("fast plan:")]
    assert "LayerNormalization 2" in line and "--precise" in line


@pytest.mark.parametrize("runtime", ["any", "tensorrt", "dml"])
def test_no_fast_plan_for_other_runtimes(runtime):
    result = convert(residual_blocks(), runtime=runtime)
    assert precisions(result)["ln0"] == "fp32"
    assert not any(code == "fast-plan" for code in result.plan.last_reason_codes())


def test_a_normalization_fed_by_a_range_kept_tensor_stays_fp32():
    """The stream kept fp32 for a reason (here the user's --exclude-node on the residual Add) is
    never cast down into the normalization."""
    result = convert(residual_blocks(layers=1), exclude_nodes=["^res0$"])
    assert precisions(result)["ln0"] == "fp32"


def test_an_exp_whose_output_grows_is_not_in_the_fast_plan():
    # x -> MatMul -> Exp -> Add -> MatMul: Exp overflows fp16 above 11; it stays fp32 with the Add
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Exp", ["h"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "h"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [4, H])],
        [tensor("y", F32, [4, H])],
        [init("w1", randn([H, H], 1)), init("w2", randn([H, H], 2))],
    )
    p = precisions(convert(m))
    assert p["exp"] == "fp32" and p["add"] == "fp32"


def gelu_tanh():
    """GPT-2's GELU: 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x**3)))."""
    c = {"three": 3.0, "k": 0.044715, "s": 0.7978845608, "one": 1.0, "half": 0.5}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Pow", ["h", "three"], ["p"], name="pow"),
        helper.make_node("Mul", ["p", "k"], ["pk"], name="mul_k"),
        helper.make_node("Add", ["h", "pk"], ["inner"], name="add_inner"),
        helper.make_node("Mul", ["inner", "s"], ["scaled"], name="mul_s"),
        helper.make_node("Tanh", ["scaled"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "one"], ["t1"], name="add_one"),
        helper.make_node("Mul", ["h", "t1"], ["ht"], name="mul_x"),
        helper.make_node("Mul", ["ht", "half"], ["g"], name="mul_half"),
        helper.make_node("MatMul", ["g", "w2"], ["y"], name="mm2"),
    ]
    inits = [init("w1", randn([H, H], 1)), init("w2", randn([H, H], 2))]
    inits += [init(k, np.array(v, np.float32)) for k, v in c.items()]
    return model(nodes, [tensor("x", F32, [4, H])], [tensor("y", F32, [4, H])], inits)


def test_the_tanh_gelu_runs_low_whole_and_its_overflow_saturates():
    m = gelu_tanh()
    result = convert(m)
    p = precisions(result)
    assert all(v == "fp16" for v in p.values()), p
    assert last_code(result, "pow") == "fast-plan" and result.stats.casts_added == 2
    # inputs large enough that x**3 overflows fp16 (|x| > 40): the tanh turns +-inf into +-1
    feeds = {"x": (randn([4, H], 5) * 30).astype(np.float32)}
    ref, out = run(m, feeds)[0], run(emulation_model(result.model), feeds)[0]
    assert np.all(np.isfinite(out))
    assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max()
    assert precisions(convert(m, precise=True))["pow"] == "fp32"


def test_a_pow_that_does_not_end_in_a_saturating_op_stays_fp32():
    m = gelu_tanh()
    tanh = next(n for n in m.graph.node if n.op_type == "Tanh")
    tanh.op_type = "Relu"  # x**3 now reaches the MatMul unbounded
    assert precisions(convert(m))["pow"] == "fp32"


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "vit_tiny"])
def test_the_shipped_transformers_take_a_handful_of_casts(name):
    """What the fast plan buys on the shipped transformers: the Casts at the model's inputs and
    outputs and a few around the embeddings, where the precise plan has one pair per block."""
    path = str(ROOT / "examples" / "models" / f"{name}.onnx")
    fast, precise = autocast_onnx.convert(path), autocast_onnx.convert(path, precise=True)
    assert fast.stats.casts_added <= 3 < precise.stats.casts_added
    assert cost_of(fast)["cast_bytes"] < cost_of(precise)["cast_bytes"]


def test_bf16_keeps_the_precise_plan():
    """bf16 rounds a residual stream 8 times as coarsely as fp16: no fast plan there."""
    result = convert(residual_blocks(), precision="bf16")
    assert precisions(result)["ln0"] == "fp32"
    assert not any(code == "fast-plan" for code in result.plan.last_reason_codes())


def test_a_normalization_whose_scale_overflows_fp16_stays_fp32():
    """The fuzz found it: a LayerNormalization scale of 1e5 would be stored as inf at fp16 I/O, so
    the fast plan keeps that node fp32 with its constants (the other one still runs low)."""
    gamma = randn([H], 9, 0.1) + 1.0
    gamma[3] = 1e5
    m = residual_blocks(gamma=gamma)
    result = convert(m)
    p = precisions(result)
    assert p["ln0"] == "fp32" and p["ln1"] == "fp32"
    [scale] = [t for t in result.model.graph.initializer if t.name == "gamma"]
    assert scale.data_type == F32
    gamma[3] = 1e4  # in range: the fast plan takes both again
    assert set(precisions(convert(residual_blocks(gamma=gamma))).values()) == {"fp16"}


def softmax_then_cast(to):
    """x -> MatMul -> Softmax -> Cast(to) -> MatMul -> y: the torch exporter's softmax pattern
    (to fp16: the Cast's output is the model's output)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["s"], name="mm0"),
        helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1),
        helper.make_node("Cast", ["p"], ["pc" if to == F32 else "y"], name="cast", to=to),
    ]
    inits = [init("w0", randn([H, H], 1, 0.3))]
    if to == F32:
        nodes.append(helper.make_node("MatMul", ["pc", "w1"], ["y"], name="mm1"))
        inits.append(init("w1", randn([H, H], 2, 0.3)))
    m = model(nodes, [tensor("x", F32, [4, H])], [tensor("y", to, [4, H])], inits)
    check(m)
    return m


def test_a_cast_to_the_low_type_reads_low_so_a_second_conversion_changes_nothing():
    """The idempotence property found it (vit_tiny): the first conversion retargets the author's
    Cast after a Softmax to fp16; a second one must judge the Softmax alike, not add two Casts."""
    first = convert(softmax_then_cast(F32))
    assert precisions(first)["sm"] == "fp16"
    again = convert(first.model)
    assert again.stats.casts_added == 0
    assert again.model.SerializeToString() == first.model.SerializeToString()
    direct = convert(softmax_then_cast(10))
    assert precisions(direct)["sm"] == "fp16" and direct.stats.casts_added == 1


def wide_softmax(width=1500, rows=16):
    """x -> MatMul -> Softmax over `width` columns -> MatMul -> y: Whisper's 1500-wide attention rows."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["s"], name="mm0"),
        helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1),
        helper.make_node("MatMul", ["p", "w1"], ["y"], name="mm1"),
    ]
    inits = [init("w0", randn([H, width], 1, 0.5)), init("w1", randn([width, H], 2, 0.3))]
    m = model(nodes, [tensor("x", F32, [rows, H])], [tensor("y", F32, [rows, H])], inits)
    check(m)
    return m


def test_a_softmax_on_the_kernels_rounding_path_runs_low_and_is_emulated_step_by_step():
    """Rows of 1025 to 2048 take ONNX Runtime's resource-efficient CUDA Softmax, which keeps the row in
    fp16 (data/compute_cuda.json, conditions): pass 6 leaves it (no bit-identity), the fast plan takes it
    with a reason that says so, and validate's emulation rounds x - max, exp and the output."""
    m = wide_softmax()
    fast, precise = convert(m), convert(m, precise=True)
    assert precisions(fast)["sm"] == "fp16" and precisions(precise)["sm"] == "fp32"
    why = fast.plan.by_name("sm")[0].reasons[-1]
    assert why.code == "fast-plan" and "rows of 1025 to 2048" in why.message
    from autocast_onnx.validate.emulate_steps import decompose

    emulated = emulation_model(fast.model)
    assert any("__emu_step" in o for n in emulated.graph.node for o in n.output if n.op_type == "Reciprocal")
    feeds = {"x": randn([16, H], 3)}
    ref = run(m, feeds)[0]
    out = run(emulated, feeds)[0]
    assert np.abs(out - ref).max() <= 2e-2 * max(1.0, np.abs(ref).max())
    narrow = autocast_onnx.convert(wide_softmax(width=1000)).model
    assert decompose(narrow) == 0  # the general kernel: float, one rounding


def test_the_wide_softmax_steps_are_the_kernels():
    """The emulated steps of the resource-efficient Softmax against numpy's account of the kernel
    (softmax_warpwise_impl.cuh: the row in half, x - max and exp stored in half, the float sum, the
    output times its reciprocal rounded once), on fp16 scores."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)]
    m = model(nodes, [tensor("x", 10, [3, 1500])], [tensor("y", 10, [3, 1500])], [])
    x = (np.random.default_rng(5).standard_normal((3, 1500)) * 4).astype(np.float16)
    out = run(emulation_model(m), {"x": x})[0].astype(np.float32)
    d = (x.astype(np.float32) - x.astype(np.float32).max(-1, keepdims=True)).astype(np.float16)
    e = np.exp(d.astype(np.float32)).astype(np.float16).astype(np.float32)
    want = (e * (1.0 / e.sum(-1, keepdims=True, dtype=np.float32))).astype(np.float16).astype(np.float32)
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(out - want) <= ulp)  # the float exp and sum may move one rounding
    once = np.exp(x.astype(np.float32) - x.astype(np.float32).max(-1, keepdims=True))
    once = (once / once.sum(-1, keepdims=True)).astype(np.float16).astype(np.float32)
    assert not np.array_equal(out, once)  # not the general kernel's one rounding
