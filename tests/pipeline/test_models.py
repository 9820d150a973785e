"""End to end on real architectures shipped in examples/models: the converted models pass the
full checker, run in ONNX Runtime, keep softmax/normalizations/reductions in fp32 (but for those
the runtime's kernel computes in fp32 between low-precision neighbours: paint pass 6, kernel-fp32)
and the matmuls/convolutions in low precision, and stay close to fp32 (the trained one keeps its
accuracy)."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import F16, F32, cost_of, run
from onnx import numpy_helper
from validate_helpers import run_emulated

import autocast_onnx
from autocast_onnx.validate.emulate import emulation_model

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
KEEP_FP32_OPS = {
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ReduceProd",
    "Exp",
    "Log",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "CumSum",
}
LOW_OPS = {"MatMul", "Conv", "Gemm"}


def feeds_for(name, rng):
    if name in ("bert_tiny", "gpt2_tiny"):
        ids = rng.integers(0, 1000, size=(3, 16), dtype=np.int64)
        mask = np.ones((3, 16), np.int64)
        mask[1, 10:] = 0  # padded row
        mask[2, 1:] = 0  # nearly fully masked row
        feeds = {"input_ids": ids, "attention_mask": mask}
        if name == "bert_tiny":
            feeds["token_type_ids"] = (np.arange(16)[None, :] >= 8).astype(np.int64).repeat(3, 0)
        return feeds
    if name == "digits_cnn":
        return {"pixels": np.load(DATA / "digits_test.npz")["x"][:64]}
    return {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}


def node_types(model):
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in list(g.input) + list(g.value_info) + list(g.output)
        if vi.type.HasField("tensor_type")
    }
    types.update({t.name: t.data_type for t in g.initializer})
    return types


@pytest.fixture(scope="module", params=["bert_tiny", "gpt2_tiny", "resnet_tiny", "vit_tiny", "digits_cnn"])
def converted(request):
    path = MODELS / f"{request.param}.onnx"
    result = autocast_onnx.convert(path, check="full")
    return request.param, onnx.load(path), result


def test_converted_model_passes_full_checker_and_keeps_io(converted):
    _name, original, result = converted
    onnx.checker.check_model(result.model, full_check=True)
    assert [(i.name, i.type.tensor_type.elem_type) for i in result.model.graph.input] == [
        (i.name, i.type.tensor_type.elem_type) for i in original.graph.input
    ]
    assert [(o.name, o.type.tensor_type.elem_type) for o in result.model.graph.output] == [
        (o.name, o.type.tensor_type.elem_type) for o in original.graph.output
    ]
    assert result.model.opset_import == original.opset_import


# the keep_fp32 nodes the default conversion runs at fp16 because ONNX Runtime's CUDA kernel computes
# them in fp32 and rounds once (kernel-fp32, and the fast plan's fast-plan): the attention Softmaxes, the
# LayerNormalizations on the residual stream, GPT-2's GELU Pow, digits_cnn's LayerNormalization
KERNEL_FP32 = {
    "bert_tiny": {"LayerNormalization": 4, "Softmax": 2},
    "gpt2_tiny": {"LayerNormalization": 5, "Pow": 2, "Softmax": 2},
    "vit_tiny": {"LayerNormalization": 5, "Softmax": 2},
    "digits_cnn": {"LayerNormalization": 1},
}


def test_categories_hold_in_the_converted_graph(converted):
    name, _, result = converted
    types = node_types(result.model)
    entries = {e.name: e for e in result.plan.nodes if e.name}
    low_seen = 0
    kernel_fp32: dict = {}
    for node in result.model.graph.node:
        floats = [types.get(t) for t in list(node.input) + list(node.output) if t and types.get(t) in (F32, F16)]
        if node.op_type in KEEP_FP32_OPS:
            entry = entries[node.name]
            if entry.reasons[-1].code in ("kernel-fp32", "fast-plan"):  # its fp32 kernel at fp16 I/O: no Casts
                assert entry.precision == "fp16", entry.explain()
                assert floats and all(t == F16 for t in floats), f"{node.name} ({node.op_type}) is not fp16"
                kernel_fp32[node.op_type] = kernel_fp32.get(node.op_type, 0) + 1
            else:
                assert entry.precision == "fp32", entry.explain()
                assert floats and all(t == F32 for t in floats), f"{node.name} ({node.op_type}) is not fp32"
        if node.op_type == "BatchNormalization":  # the parameters in the data's type where they survive it
            low = any(r.code == "bn-parameters-low" for r in entries[node.name].reasons)
            assert [types.get(t) for t in node.input[1:5]] == [F16 if low else F32] * 4, node.name
        if node.op_type in LOW_OPS:
            if all(t == F16 for t in floats):
                low_seen += 1
    planned_low = [n for n in result.plan.nodes if n.op_type in LOW_OPS and n.precision == "fp16"]
    assert low_seen == len(planned_low) > 0
    # every low-precision op left in fp32 is explained by a data rule (e.g. a tiny constant) or
    # is the small output head (at most 5 % of the MatMul/Gemm/Conv work)
    for entry in result.plan.nodes:
        if entry.op_type in LOW_OPS and entry.precision != "fp16":
            assert any(r.code.startswith("data-") or r.code == "output-head" for r in entry.reasons), entry.label
    cost = cost_of(result)
    assert cost["macs_low_precision"] >= 0.95 * cost["macs"]
    assert dict(sorted(kernel_fp32.items())) == KERNEL_FP32.get(name, {})


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "vit_tiny"])
def test_categories_hold_for_no_particular_runtime(name):
    # --runtime any counts on no runtime's kernels: every keep_fp32 op stays fp32, the old default
    result = autocast_onnx.convert(MODELS / f"{name}.onnx", runtime="any")
    types = node_types(result.model)
    seen = 0
    for node in result.model.graph.node:
        floats = [types.get(t) for t in list(node.input) + list(node.output) if t and types.get(t) in (F32, F16)]
        if node.op_type in KEEP_FP32_OPS:
            assert floats and all(t == F32 for t in floats), f"{node.name} ({node.op_type}) is not fp32"
            seen += 1
    assert seen > 0
    assert not [e for e in result.plan.nodes if any(r.code == "kernel-fp32" for r in e.reasons)]


def test_converted_model_runs_close_to_fp32(converted):
    name, original, result = converted
    feeds = feeds_for(name, np.random.default_rng(0))
    ref = run(original, feeds)
    out = run(result.model, feeds)
    for r, o in zip(ref, out):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert np.isfinite(o).all() == np.isfinite(r).all()
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(o, r, atol=2e-2 * scale, rtol=0)


@pytest.mark.parametrize("runtime", [None, "any"])
@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny"])
def test_masking_constants_are_mask_sentinels(name, runtime):
    # The -3.4e38 mask fill reaches only the Softmaxes (through Where and the mask Adds): it is a mask
    # sentinel (plan/masks.py), whatever the runtime, so it no longer keeps its readers fp32 (data-range);
    # its values take -49152 (stored so by default; by a Clip before the Cast where the Where stays fp32).
    options = {} if runtime is None else {"runtime": runtime}
    model = onnx.load(MODELS / f"{name}.onnx")
    result = autocast_onnx.convert(model, **options)
    reasons = {n.name: {r.code for r in n.reasons} for n in result.plan.nodes}
    assert [n for n, codes in reasons.items() if "data-range" in codes] == []
    ((fill, sentinel),) = result.plan.mask_sentinels.items()
    assert sentinel == -49152.0
    readers = [e for e in result.plan.nodes if "mask-sentinel" in reasons[e.name]]
    assert readers, f"{name}: the -3.4e38 mask fill should be a mask sentinel"
    for entry in readers:
        (why,) = [r for r in entry.reasons if r.code == "mask-sentinel"]
        assert f"attention-mask sentinel '{fill}'" in why.message and "reach only 2 Softmax input(s)" in why.message
        assert "they become -49152" in why.message
    softmaxes = [e for e in result.plan.nodes if e.op_type == "Softmax"]
    assert len(softmaxes) == 2
    for entry in softmaxes:
        if runtime is None:
            assert entry.precision == "fp16" and entry.reasons[-1].code in ("kernel-fp32", "fast-plan"), entry.explain()
        else:
            assert entry.precision == "fp32" and entry.reasons[-1].code == "op-category", entry.explain()
    # the mask Adds in front of the Softmaxes run at fp16 either way
    producers = {o: n for n in model.graph.node for o in n.output}
    adds = [producers[n.input[0]] for n in model.graph.node if n.op_type == "Softmax"]
    assert [a.op_type for a in adds] == ["Add", "Add"]
    assert [result.plan.by_name(a.name)[0].precision for a in adds] == ["fp16", "fp16"]
    # no -inf reaches the scores: planned for CUDA (the fast plan) the Where runs fp16 with the fill
    # stored as -49152; for any runtime the Where stays fp32 and a Clip to -49152 precedes its Cast
    inits = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    clips = [n for n in result.model.graph.node if n.op_type == "Clip"]
    if runtime is None:
        assert clips == [] and float(inits[fill]) == -49152.0 and inits[fill].dtype == np.float16
    else:
        assert [float(inits[c.input[1]]) for c in clips] == [-49152.0]
    # and its emulated fp16 outputs match fp32, a fully masked row included
    feeds = feeds_for(name, np.random.default_rng(0))
    feeds["attention_mask"][2, :] = 0
    ref = run(model, feeds)
    emulated = run_emulated(emulation_model(result.model), feeds)
    for r, o in zip(ref, emulated):
        assert np.isfinite(r).all() and np.isfinite(o).all()
        scale = max(1.0, float(np.abs(r).max()))
        np.testing.assert_allclose(o, r, atol=2e-2 * scale, rtol=0)


def test_trained_model_keeps_its_accuracy():
    data = np.load(DATA / "digits_test.npz")
    meta = json.loads((MODELS / "digits_cnn.json").read_text())
    result = autocast_onnx.convert(MODELS / "digits_cnn.onnx")
    probs = run(result.model, {"pixels": data["x"]})[0]
    accuracy = float((probs.argmax(1) == data["y"]).mean())
    assert accuracy >= meta["test_accuracy"] - 0.005
    assert np.allclose(probs.sum(1), 1.0, atol=1e-3)


def test_convert_is_idempotent_on_real_models():
    for name in ("bert_tiny", "resnet_tiny"):
        first = autocast_onnx.convert(MODELS / f"{name}.onnx")
        second = autocast_onnx.convert(first.model)
        assert second.stats.casts_added == 0
        assert second.model.SerializeToString() == first.model.SerializeToString()
