"""A sensitive op forced low (`--include-node 'Softmax$'`, a `[[nodes]]` rule, or a replayed plan
edited to put Softmax in fp16) next to an out-of-range mask fill. The mask's arithmetic stays fp32
(the data rules), so the -3.4e38 fill reaches the forced fp16 Softmax through an fp32 Add and the
Cast the rewrite puts in front of it, where it used to become -inf: a fully masked row was NaN,
with no warning. Now the plan warns, naming the constant and the node, and the rewrite clips the
tensor to the finite fp16 range before that Cast: ONNX Runtime finds no NaN.

A fill that only masks is retargeted to a finite fp16 sentinel instead, and the mask then runs
low (plan/masks.py; the last test here, and tests/plan/test_mask_sentinels.py); so the forced-low
cases use a fill that is also a model output (`shared`), which keeps its readers fp32."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import parse, planned, randn, run
from onnx import helper, numpy_helper

import autocast_onnx
from autocast_onnx.plan.model import PrecisionPlan
from autocast_onnx.validate.emulate import emulation_model

LOWEST = np.float32(-3.4028235e38)


def _masked_softmax(fill=LOWEST, shared=False):
    """BERT's extended attention mask: (1 - attention_mask) * fill, added to the scores. With
    `shared` the mask bias is also a model output, so the fill is not only a mask (no sentinel:
    plan/masks.py) and its readers stay fp32 by the data rules."""
    extra_out, extra_node = (", float[2,1,4] bias_out", "[bias_copy] bias_out = Identity(bias)") if shared else ("", "")
    return parse(
        f"""
        g (float[2,4,8] q, float[2,4] attention_mask) => (float[2,4,4] y{extra_out}) {{
            [qk] s = MatMul(q, k)
            [mask_sub] inv = Sub(one, attention_mask)
            [mask_unsqueeze] inv3 = Unsqueeze(inv, axes)
            [mask_mul] bias = Mul(inv3, fill)
            [mask_add] masked = Add(s, bias)
            ["attn/Softmax"] y = Softmax<axis = -1>(masked)
            {extra_node}
        }}""",
        k=randn([8, 4], 1, 0.3),
        one=np.array(1.0, np.float32),
        axes=np.array([1], np.int64),
        fill=np.array(fill, np.float32),
    )


def _feeds():
    mask = np.ones((2, 4), np.float32)
    mask[1] = 0.0  # batch 1: every position masked
    mask[0, 3] = 0.0
    return {"q": randn([2, 4, 8], 2), "attention_mask": mask}


def _nan(model) -> int:
    return int(np.isnan(run(model, _feeds())[0]).sum())


def _clamp_warnings(result):
    return [w for w in result.plan.warnings if w.code == "data-range" and "'fill'" in w.message]


def test_the_reference_has_no_nan_and_the_default_conversion_keeps_a_shared_mask_fp32():
    model = _masked_softmax(shared=True)
    assert _nan(model) == 0
    result = autocast_onnx.convert(model)
    assert planned(result, "attn/Softmax") == "fp32" and planned(result, "mask_add") == "fp32"
    assert _nan(result.model) == 0 and not _clamp_warnings(result)
    assert not [n for n in result.model.graph.node if n.op_type == "Clip"]


def test_include_node_softmax_clips_the_mask_before_the_cast_and_warns():
    result = autocast_onnx.convert(_masked_softmax(shared=True), include_nodes=["Softmax$"])
    assert planned(result, "attn/Softmax") == "fp16" and planned(result, "mask_add") == "fp32"
    assert _nan(result.model) == 0  # was 4: the fully masked row
    (warning,) = _clamp_warnings(result)
    assert warning.node == "attn/Softmax"
    assert "Mul, Add (fp32)" in warning.message and "clamped" in warning.message and "65504" in warning.message
    assert "fill" in result.plan.clamp_initializers
    clips = [n for n in result.model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 1 and clips[0].input[0] == "masked"
    # the fully masked row is uniform, as in fp32 (every position equally masked)
    probs = run(result.model, _feeds())[0]
    np.testing.assert_allclose(probs[1], 0.25, atol=1e-3)


@pytest.mark.parametrize("opset", [10, 13])
def test_the_clip_takes_its_bounds_as_the_opset_requires(opset):
    """Clip's bounds are attributes before opset 11, inputs from it."""
    model = _masked_softmax(shared=True)
    model.opset_import[0].version = opset
    if opset < 13:  # Unsqueeze takes its axes as an attribute before opset 13, Softmax no -1 axis before 11
        unsqueeze = next(n for n in model.graph.node if n.op_type == "Unsqueeze")
        del unsqueeze.input[1]
        unsqueeze.attribute.append(helper.make_attribute("axes", [1]))
        softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
        softmax.attribute[0].i = 2
    result = autocast_onnx.convert(model, include_nodes=["Softmax$"], check="full")
    (clip,) = [n for n in result.model.graph.node if n.op_type == "Clip"]
    assert (len(clip.input), len(clip.attribute)) == ((1, 2) if opset < 11 else (3, 0))
    assert _nan(result.model) == 0


def test_a_replayed_plan_edited_to_put_softmax_low_is_clipped_too(tmp_path):
    model = _masked_softmax(shared=True)
    plan = autocast_onnx.convert(model).plan
    path = tmp_path / "plan.json"
    plan.save(path)
    edited = PrecisionPlan.load(path)
    for node in edited.nodes:
        if node.name == "attn/Softmax":
            node.precision = "fp16"
    edited.save(path)
    result = autocast_onnx.convert(model, plan=path)
    assert planned(result, "attn/Softmax") == "fp16"
    assert _nan(result.model) == 0
    assert len(_clamp_warnings(result)) == 1


def test_a_constant_node_read_directly_by_a_forced_node_is_clamped():
    """A Constant output (not only an initializer) that a node forced low converts is clamped:
    it used to be converted to -inf."""
    model = parse(
        """
        g (float[2,4] x) => (float[2,4] y) {
            [fill] c = Constant<value = float {-3.4e38}>()
            [add] y = Add(x, c)
        }"""
    )
    result = autocast_onnx.convert(model, include_nodes=["^add$"])
    assert planned(result, "add") == "fp16"
    out = run(result.model, {"x": np.zeros((2, 4), np.float32)})[0]
    assert np.isfinite(out).all() and out.min() == -65504.0


def test_a_replayed_plan_that_puts_a_reader_of_the_fill_low_clamps_its_copy(tmp_path):
    """An edited plan setting the Mul that reads the fill itself to fp16: the fill's fp16 copy is
    clamped to -65504 (it was -inf), with the warning."""
    model = _masked_softmax()
    path = tmp_path / "plan.json"
    autocast_onnx.convert(model).plan.save(path)
    edited = PrecisionPlan.load(path)
    for node in edited.nodes:
        if node.name == "mask_mul":
            node.precision = "fp16"
    edited.save(path)
    result = autocast_onnx.convert(model, plan=path)
    assert planned(result, "mask_mul") == "fp16"
    (warning,) = _clamp_warnings(result)
    assert warning.node == "mask_mul" and "clamped to ±65504" in warning.message
    fills = [t for t in result.model.graph.initializer if t.name.startswith("fill") and t.data_type == 10]
    assert fills and all(np.isfinite(numpy_helper.to_array(t)).all() for t in fills)


def test_the_default_conversion_retargets_a_fill_that_only_masks_and_runs_the_add_low():
    """The -3.4e38 fill becomes a finite fp16 sentinel (no data-range warning), the mask Add runs
    fp16, and the fp32 mask bias is clipped from the sentinel up before its Cast (so a mask input
    outside 0/1 cannot overflow either). Under fp16 emulation the fully masked row is uniform, as
    in fp32 (the CPU provider would compute the Add in fp32 and keep the scores' differences)."""
    model = _masked_softmax()
    result = autocast_onnx.convert(model)
    assert planned(result, "mask_add") == "fp16"
    assert result.plan.mask_sentinels == {"fill": -49152.0} and not _clamp_warnings(result)
    (clip,) = [n for n in result.model.graph.node if n.op_type == "Clip"]
    low = next(i for i in result.model.graph.initializer if i.name == clip.input[1])
    assert clip.input[0] == "bias" and float(numpy_helper.to_array(low)) == -49152.0
    probs = run(emulation_model(result.model), _feeds())[0]
    assert not np.isnan(probs).any()
    np.testing.assert_allclose(probs[1], 0.25, atol=1e-3)
    np.testing.assert_allclose(probs[0], run(model, _feeds())[0][0], atol=2e-3)
