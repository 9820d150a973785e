"""Paint pass 6 (plan/kernel_io.py, issue 37 item 2): no Cast that changes no number. A keep_fp32
node whose runtime kernel computes in fp32 and rounds once (catalog/compute.py) and that sits
between low-precision neighbours runs at low-precision inputs and outputs, without Casts; its
emulated outputs are bit-identical with the plan that keeps it fp32 between Casts (`--runtime any`,
which counts on no kernel and so leaves it fp32). These tests plan with `precise=True`, the
conservative pass alone; the fast plan (the default), which lowers normalizations together with
their streams and so changes numbers, is tested in test_fast_plan.py."""

from __future__ import annotations

from pathlib import Path

import helpers as H
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import F16, F32, cost_of, model, randn, tensor
from onnx import helper, numpy_helper

import autocast_onnx
from autocast_onnx.validate.emulate import emulation_model

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "examples" / "models").glob("*.onnx"))


def convert(m, **kw):
    kw.setdefault("precise", True)
    return H.convert(m, **kw)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def precisions(result) -> dict[str, str]:
    return {n.name: n.precision for n in result.plan.nodes if n.name}


def reason_codes(result, name: str) -> list[str]:
    [node] = result.plan.by_name(name)
    return [r.code for r in node.reasons]


def casts(m: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for n in m.graph.node)


def emulated(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The converted model's outputs with its low-precision numerics emulated (validate's way)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    session = ort.InferenceSession(emulation_model(m).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_bit_identical(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), np.max(np.abs(x.astype(float) - y.astype(float)))


def mm_between(*middle: onnx.NodeProto, first_out="h", last_in="s", extra=()) -> onnx.ModelProto:
    """x -> MatMul(w1) -> FIRST_OUT ... middle ... LAST_IN -> MatMul(w2) -> y."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], [first_out], name="mm1"),
        *middle,
        helper.make_node("MatMul", [last_in, "w2"], ["y"], name="mm2"),
    ]
    inits = [init("w1", randn([8, 8], seed=1)), init("w2", randn([8, 8], seed=2)), *extra]
    return model(nodes, [tensor("x", F32, [4, 8])], [tensor("y", F32, [4, 8])], inits)


FEEDS = {"x": randn([4, 8], seed=3).astype(np.float32)}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_softmax_between_low_matmuls_runs_low_without_casts(precision):
    m = mm_between(helper.make_node("Softmax", ["h"], ["s"], name="softmax", axis=-1))
    fast, kept = convert(m, precision=precision), convert(m, precision=precision, runtime="any")
    assert precisions(fast)["softmax"] == precision and precisions(kept)["softmax"] == "fp32"
    assert reason_codes(fast, "softmax")[-1] == "kernel-fp32"
    assert casts(kept.model) == casts(fast.model) + 2
    assert_bit_identical(emulated(fast.model, FEEDS), emulated(kept.model, FEEDS))


def test_the_reason_says_what_the_kernel_does_and_the_bytes_saved():
    m = mm_between(helper.make_node("Softmax", ["h"], ["s"], name="softmax", axis=-1))
    [reason] = [r for r in convert(m).plan.by_name("softmax")[0].reasons if r.code == "kernel-fp32"]
    assert "computes in fp32 and rounds its outputs once" in reason.message
    # two Casts of a [4, 8] tensor, each element read in one type and written in the other
    assert "saving 384 bytes of Casts per inference" in reason.message
    assert "onnxruntime" in reason.message and (".cu" in reason.message or ".cc" in reason.message)


def test_two_computing_fp32_nodes_in_a_row_stay_fp32():
    """Softmax -> Softmax: each is judged alone, and each has an fp32 neighbour; lowering the first
    would round the tensor between them (the runtime fuses no such pair)."""
    m = mm_between(
        helper.make_node("Softmax", ["h"], ["a"], name="softmax1", axis=-1),
        helper.make_node("Softmax", ["a"], ["s"], name="softmax2", axis=-1),
    )
    assert (precisions(convert(m))["softmax1"], precisions(convert(m))["softmax2"]) == ("fp32", "fp32")


def test_a_clear_op_between_the_node_and_its_low_reader_is_looked_through():
    """Softmax -> Transpose -> MatMul: the Transpose is fp32 only by the Softmax's taint and moves
    values without arithmetic, so the MatMul is the reader judged; both run low."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Softmax", ["h"], ["a"], name="softmax", axis=-1),
        helper.make_node("Transpose", ["a"], ["s"], name="transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    inits = [init("w1", randn([8, 8], seed=1)), init("w2", randn([4, 8], seed=2))]
    m = model(nodes, [tensor("x", F32, [4, 8])], [tensor("y", F32, [8, 8])], inits)
    fast, kept = convert(m), convert(m, runtime="any")
    assert (precisions(fast)["softmax"], precisions(fast)["transpose"]) == ("fp16", "fp16")
    assert precisions(kept)["transpose"] == "fp32"
    assert casts(fast.model) < casts(kept.model)
    assert_bit_identical(emulated(fast.model, FEEDS), emulated(kept.model, FEEDS))


def test_a_reduce_whose_sum_overflows_gives_the_same_inf_either_way():
    """ReduceSum's CUDA kernel accumulates in float and rounds once: a sum past 65504 is inf at
    the Cast back to fp16 just as it is at the kernel's own rounding."""
    big = init("w1", np.full((8, 8), 3000.0))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=1, axes=[1]),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    m = model(nodes, [tensor("x", F32, [4, 8])], [tensor("y", F32, [4, 8])], [big, init("w2", randn([1, 8]))], opset=12)
    feeds = {"x": np.full((4, 8), 1.0, np.float32)}
    fast, kept = convert(m), convert(m, runtime="any")
    assert precisions(fast)["sum"] == "fp16"
    out_fast, out_kept = emulated(fast.model, feeds), emulated(kept.model, feeds)
    assert np.isinf(out_fast[0]).any()
    assert_bit_identical(out_fast, out_kept)


def layer_norm(scale, bias, out="s") -> onnx.ModelProto:
    ln = helper.make_node("LayerNormalization", ["h", "gamma", "beta"], [out], name="ln", axis=-1)
    return mm_between(ln, last_in="s", extra=[init("gamma", scale), init("beta", bias)])


def test_a_layer_norm_with_exact_parameters_runs_low():
    m = layer_norm(np.ones(8), np.zeros(8))
    fast, kept = convert(m), convert(m, runtime="any")
    assert precisions(fast)["ln"] == "fp16" and precisions(kept)["ln"] == "fp32"
    assert_bit_identical(emulated(fast.model, FEEDS), emulated(kept.model, FEEDS))


def test_a_layer_norm_whose_scale_the_low_type_rounds_stays_fp32():
    """Converting a scale of 1.0001 to fp16 changes it: not a cast that changes no number."""
    m = layer_norm(np.full(8, 1.0001), np.zeros(8))
    assert precisions(convert(m))["ln"] == "fp32"


def test_a_layer_norm_feeding_an_fp32_reader_stays_fp32():
    """Its output is a graph output that keeps its type (keep_io_types): someone reads it in fp32."""
    ln = helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["s"], name="ln", axis=-1)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), ln]
    inits = [init("w1", randn([8, 8], seed=1)), init("gamma", np.ones(8)), init("beta", np.zeros(8))]
    m = model(nodes, [tensor("x", F32, [4, 8])], [tensor("s", F32, [4, 8])], inits)
    assert precisions(convert(m))["ln"] == "fp32"
    assert precisions(convert(m, keep_io_types=False))["ln"] == "fp16"


def test_a_softmax_fed_by_an_fp32_model_input_stays_fp32():
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    m = model(nodes, [tensor("x", F32, [4, 8])], [tensor("y", F32, [4, 8])], [init("w2", randn([8, 8]))])
    assert precisions(convert(m))["softmax"] == "fp32"


def test_an_fp16_model_input_counts_as_low():
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    m = model(nodes, [tensor("x", F16, [4, 8])], [tensor("y", F32, [4, 8])], [init("w2", randn([8, 8]))])
    assert precisions(convert(m))["softmax"] == "fp16"


def test_a_node_kept_fp32_by_the_user_stays_fp32():
    m = mm_between(helper.make_node("Softmax", ["h"], ["s"], name="softmax", axis=-1))
    assert precisions(convert(m, exclude_nodes=["^softmax$"]))["softmax"] == "fp32"


@pytest.mark.parametrize("op", ["ReduceMean", "Softplus"])
def test_an_op_whose_kernel_rounds_inside_stays_fp32(op):
    """ONNX Runtime's CUDA ReduceMean rounds the sum before it divides, and its Softplus computes in
    half (data/compute_cuda.json): fp32 between Casts computes something else, so they stay fp32."""
    from autocast_onnx.catalog.compute import computes_in_fp32

    fact = computes_in_fp32(None, "", op, onnx.TensorProto.FLOAT16)
    assert fact is not None and not fact.fp32_once
    attrs = {"keepdims": 1} if op == "ReduceMean" else {}
    m = mm_between(helper.make_node(op, ["h"], ["s"], name="node", **attrs))
    if op == "ReduceMean":  # a mean over the last axis, broadcast back by the MatMul's [1, 8] weight
        m.graph.initializer[1].CopyFrom(init("w2", randn([1, 8], seed=2)))
    assert precisions(convert(m))["node"] == "fp32"


def test_a_softmax_on_the_path_that_rounds_inside_stays_fp32():
    """Rows of 1025 to 2048 elements in batches of 8192 or more: ONNX Runtime's softmax rounds
    intermediates there (the table's condition), and validate's emulation takes those steps for
    every row of that width (it cannot know the rows), so pass 6, which promises bit-identical
    emulated outputs, leaves such a node fp32 (--precise); the fast plan takes it (test_fast_plan)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Softmax", ["h"], ["s"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    inits = [init("w1", randn([8, 1536], seed=1)), init("w2", randn([1536, 8], seed=2))]
    big = model(nodes, [tensor("x", F32, [8192, 8])], [tensor("y", F32, [8192, 8])], inits)
    small = model(nodes, [tensor("x", F32, [64, 8])], [tensor("y", F32, [64, 8])], inits)
    assert precisions(convert(big, precise=True))["softmax"] == "fp32"
    assert precisions(convert(small, precise=True))["softmax"] == "fp32"
    narrow = [init("w1", randn([8, 1024], seed=1)), init("w2", randn([1024, 8], seed=2))]
    at_1024 = model(nodes, [tensor("x", F32, [8192, 8])], [tensor("y", F32, [8192, 8])], narrow)
    assert precisions(convert(at_1024, precise=True))["softmax"] == "fp16"  # the general kernel
    assert precisions(convert(big, precise=False))["softmax"] == "fp16"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_models_emulate_bit_identically_with_fewer_cast_bytes(path, precision):
    """The proof the issue asks for: on every shipped model, the plan with pass 6 and the plan
    without it (--runtime any) give bit-identical emulated outputs, and the Casts move no more."""
    fast = autocast_onnx.convert(str(path), precision=precision, precise=True)
    kept = autocast_onnx.convert(str(path), precision=precision, runtime="any")
    feeds = generated_feeds(path)
    assert_bit_identical(emulated(fast.model, feeds), emulated(kept.model, feeds))
    assert cost_of(fast)["cast_bytes"] <= cost_of(kept)["cast_bytes"]


def generated_feeds(path: Path) -> dict:
    """One batch as validate generates it."""
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

    return generate(plan_inputs(describe_inputs(onnx.load(path))), seed=0)
