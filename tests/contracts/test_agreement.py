"""The converter and the linter share one judgement of what is unsafe in low precision
(autocast_onnx/hazards.py): a model that `convert` produced with the default rules never fails
the default `lint`, so `check` never fails a correct conversion.

Checked on every model the repository ships (examples, evidence, training graphs, decoders), on
the attention masks that showed the disagreement, and as a property of random models in
test_properties.py."""

from __future__ import annotations

from pathlib import Path

import helpers as H
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx.dtypes import FLOAT16, round_trip
from autocast_onnx.hazards import range_facts, thresholds
from autocast_onnx.lint.engine import LintOptions, lint

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    [
        *ROOT.glob("examples/models/*.onnx"),
        *ROOT.glob("tests/data/evidence/*.onnx"),
        *ROOT.glob("tests/data/decoders/*.onnx"),
    ]
    + list(ROOT.glob("tests/data/training/*/training_model.onnx"))
)


def errors_after_default_conversion(model, precision: str) -> list[str]:
    converted = autocast_onnx.convert(model, precision=precision).model
    result = lint(converted, LintOptions())
    return [f"{d.code} {d.node}: {d.message}" for d in result.diagnostics if d.severity == "error"]


def test_the_shipped_models_are_found():
    names = {p.name for p in SHIPPED}
    assert {"bert_tiny.onnx", "gpt2_tiny.onnx", "text_detector.onnx", "training_model.onnx"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_lint_passes_what_convert_produced(path, precision):
    assert errors_after_default_conversion(str(path), precision) == []


# ---- quantized models: the converter never splits a Q/DQ unit (AC304) -------------------------
QUANTIZED = ["resnet_tiny", "bert_tiny", "digits_cnn"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("opset", [None, 19])
@pytest.mark.parametrize("name", QUANTIZED)
def test_lint_passes_what_convert_produced_from_a_quantized_model(name, opset, precision):
    import qdq_helpers as Q

    source = Q.quantized(str(ROOT / "examples" / "models" / f"{name}.onnx"), opset)
    converted = autocast_onnx.convert(source, precision=precision).model
    found = [f"{d.code} {d.node}: {d.message}" for d in lint(converted, LintOptions()).diagnostics]
    assert [f for f in found if f.startswith("AC304")] == []
    assert errors_after_default_conversion(source, precision) == []


# ---- the masks that showed the disagreement --------------------------------------------------
# A decoder's attention: scores from an fp16 MatMul, plus a causal mask built with Where from a
# fill constant, plus a padding mask initializer; the Softmax stays fp32. Fills: -inf (PyTorch's
# SDPA export: lint reported AC203 on the converter's output), float32 lowest (transformers'
# finfo.min), -1e9, -65504 (fp16's lowest finite value: the sum of the two masks overflows in fp16)
# and -1e4.
FILLS = [float("-inf"), -3.4028235e38, -1e9, -65504.0, -1e4]


def masked_scores(fill: float, shared: bool = False) -> tuple:
    """The decoder attention above. With `shared` the padding mask is also a model output, so it
    is not only a mask (no sentinel, plan/masks.py) and the data rules judge its readers."""
    rng = np.random.default_rng(0)
    padding = np.zeros((1, 1, 1, 6), np.float32)
    padding[..., 4:] = fill
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Where", ["causal", "zero", "fill"], ["causal_bias"], name="causal_where"),
        helper.make_node("Add", ["scores", "causal_bias"], ["s1"], name="add_causal"),
        helper.make_node("Add", ["s1", "padding"], ["s2"], name="add_padding"),
        helper.make_node("Softmax", ["s2"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="pv"),
    ]
    outputs = [H.tensor("y", H.F32, [1, 2, 6, 8])]
    if shared:
        nodes.append(helper.make_node("Identity", ["padding"], ["padding_out"], name="padding_copy"))
        outputs.append(H.tensor("padding_out", H.F32, [1, 1, 1, 6]))
    inits = [
        H.init("kt", rng.standard_normal((1, 2, 8, 6)).astype(np.float32)),
        H.init("v", rng.standard_normal((1, 2, 6, 8)).astype(np.float32)),
        H.init("zero", np.array(0.0, np.float32)),
        H.init("fill", np.array(fill, np.float32)),
        H.init("padding", padding),
    ]
    m = H.model(
        nodes,
        [H.tensor("q", H.F32, [1, 2, 6, 8]), H.tensor("causal", TensorProto.BOOL, [1, 1, 6, 6])],
        outputs,
        inits,
    )
    causal = ~np.tril(np.ones((6, 6), bool))[None, None]
    return m, {"q": rng.standard_normal((1, 2, 6, 8)).astype(np.float32), "causal": causal}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("fill", FILLS, ids=lambda f: f"{f:g}")
def test_masks_lint_clean_after_a_default_conversion(fill, precision):
    m, _ = masked_scores(fill)
    H.check(m)
    assert errors_after_default_conversion(m, precision) == []


def test_a_mask_with_no_headroom_that_is_more_than_a_mask_keeps_its_addition_fp32():
    # -65504 is exact in fp16, but -65504 + -65504 is -inf there: where the padding mask is more
    # than a mask (also a model output) its addition stays fp32. The causal fill, now the one
    # sentinel on the way to the softmax, takes -49152 and its addition runs fp16.
    # -inf is -inf in fp16 as well, so its additions may run in fp16.
    edge = H.convert(masked_scores(-65504.0, shared=True)[0])
    assert H.planned(edge, "add_causal") == "fp16" and H.planned(edge, "add_padding") == "fp32"
    assert edge.plan.mask_sentinels == {"fill": -49152.0}
    reasons = " ".join(r.message for e in edge.plan.nodes if e.name == "add_padding" for r in e.reasons)
    assert "land on the largest finite fp16 value" in reasons
    infinite = H.convert(masked_scores(float("-inf"))[0])
    assert H.planned(infinite, "add_padding") == "fp16"


def test_a_mask_with_no_headroom_that_only_masks_takes_the_halved_sentinel():
    # The same -65504 masks, read only on the way to the softmax: both are sentinels reaching it
    # by two paths, so each takes -49152 / 2 and their sum (-49152) stays finite in fp16.
    result = H.convert(masked_scores(-65504.0)[0])
    assert H.planned(result, "add_causal") == "fp16" and H.planned(result, "add_padding") == "fp16"
    assert result.plan.mask_sentinels == {"fill": -24576.0, "padding": -24576.0}
    padding = next(i for i in result.model.graph.initializer if i.name == "padding")
    assert sorted(set(numpy_helper.to_array(padding).astype(np.float32).ravel())) == [-24576.0, 0.0]
    # the fill's one value and the padding's two; with --precise the causal Where stays fp32 and its
    # fill is the lower bound of a Clip instead, so only the padding's two are stored as sentinels
    assert result.stats.sentinel_values == 3
    assert H.convert(masked_scores(-65504.0)[0], precise=True).stats.sentinel_values == 2


def test_the_linter_reports_what_the_converter_protects():
    # The same judgement from the other side: forced into fp16 against the rules, the -65504 mask is
    # reported by the lint, and the default conversion of the same model is clean.
    forced = autocast_onnx.convert(masked_scores(-65504.0, shared=True)[0], include_nodes=["^add_"]).model
    codes = {d.code for d in lint(forced, LintOptions()).diagnostics if d.severity == "error"}
    assert "AC203" in codes


@pytest.mark.parametrize("elem_type", [FLOAT16, TensorProto.BFLOAT16])
def test_thresholds_are_where_rounding_changes(elem_type):
    # edge_at is the last value that rounds below the largest finite value; overflow_at the first
    # that rounds to inf: checked against the actual rounding one float32 step either side.
    edge_at, overflow_at = thresholds(elem_type)
    largest = {FLOAT16: 65504.0, TensorProto.BFLOAT16: 3.3895313892515355e38}[elem_type]
    up = np.float32(np.inf)
    below_edge = np.float32(edge_at)
    above_edge = np.nextafter(below_edge, up)
    below_overflow = np.nextafter(np.float32(overflow_at), np.float32(0))
    values = np.array([below_edge, above_edge, below_overflow, np.float32(overflow_at)], np.float32)
    with np.errstate(over="ignore"):
        rounded = round_trip(values, elem_type)
    assert rounded[0] < largest and rounded[1] == largest and rounded[2] == largest and np.isinf(rounded[3])
    facts = range_facts(np.concatenate([values, -values, [np.inf, -np.inf, np.nan]]).astype(np.float32), elem_type)
    assert (facts.edge, facts.overflow) == (4, 2)  # infinities and NaN convert exactly: not counted
