"""lint and ONNX Runtime say the same thing of the same graphs.

Masks (AC203): for each way a mask fill reaches an fp16 softmax (lint_helpers.attention), lint's
finding says whether a fully masked row becomes NaN, and ONNX Runtime runs the same graph on a
fully masked row. A fill that is -inf in fp16 (-1e9, float32's lowest) gives NaN there, where fp32
gives a uniform row; a fill on the lowest finite value (-65504) does not, unless the scores added
to it are -16 or below (its sentence says so); a fill with headroom (-1e4), or the fp32 softmax of
the default conversion, is not reported and gives no NaN. lint once said "a fully masked row gives
NaN" of the -65504 fill too, while `validate` found none: ONNX Runtime sides with validate.

BatchNormalization (AC102): autocast-onnx computes it with fp16 data and fp32 scale, bias, mean and
variance, which lint does not report; with those stored in fp16 (another tool's conversion) the
finding names them as what is wrong."""

from __future__ import annotations

import helpers as H
import lint_helpers as L
import numpy as np
import pytest
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx.validate.emulate import emulation_model

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT


def _fully_masked_nan(model, score: float) -> bool:
    """Run the attention graph with every score equal to `score` and row 0 of the mask fully
    masked (row 1 half masked); whether ONNX Runtime gives NaN in the fully masked row, and in
    no other row (a fully masked row of a fp32 softmax is uniform). It runs what `validate` runs
    on a CPU: the graph's emulation (validate/emulate.py), each fp16 tensor rounded as a GPU's
    fp16 kernels leave it. The CPU provider's own fp16 path would not do: it computes Add and
    Softmax in fp32 behind casts it inserts, and drops an fp16 -> fp32 round trip it made,
    so a -3.4e38 fill cast to fp16 by the graph reaches its fp32 Softmax finite."""
    model = emulation_model(model)
    q = np.ones((1, 4, 8), np.float16)
    k = np.full((1, 8, 4), score / 8, np.float16)  # q @ k = score everywhere
    v = H.randn([1, 4, 8], 5).astype(np.float16)
    cond = np.ones((1, 4, 4), bool)
    cond[0, 0, :] = False
    cond[0, 1, :2] = False
    (y,) = H.run(model, {"q": q, "k": k, "v": v, "cond": cond})
    assert not np.isnan(y[0, 1:]).any()  # partly masked and unmasked rows stay finite
    return bool(np.isnan(y[0, 0]).any())


MASKS = [
    # (fill, how it reaches the fp16 Add)
    (-3.4028235e38, "fp32-cast"),
    (-1e9, "fp32-cast"),
    (-3.4028235e38, "fp32-where-cast"),
    (-65504.0, "fp32-cast"),
    (-65490.0, "fp32-cast"),  # rounds to -65504
    (-65504.0, "fp16-constant"),  # onnxruntime.transformers.float16 clamps -3.4e38 to this
    (-65504.0, "fp16-initializer"),
    (-1e4, "fp16-constant"),  # onnxconverter-common clamps to 1e4 by default
    (-3.4028235e38, "fp32-softmax"),  # autocast-onnx's own plan: mask arithmetic and softmax fp32
]


@pytest.mark.parametrize("fill,storage", MASKS, ids=[f"{m:g}-{s}" for m, s in MASKS])
@pytest.mark.parametrize("score", [0.0, -8.0, -24.0])
def test_ac203_says_nan_exactly_where_onnx_runtime_finds_it(fill, storage, score):
    model = L.attention(fill, storage)
    findings = L.findings(model, "AC203")
    nan = _fully_masked_nan(model, score)
    if not findings:
        assert not nan, "lint is silent but ONNX Runtime finds NaN in the fully masked row"
        return
    (finding,) = findings
    text = finding.message
    if "is -inf there" in text:  # the sentence: a fully masked row is NaN, whatever its scores
        assert "a fully masked row is -inf everywhere and its softmax NaN" in text
        assert nan
    else:  # the edge: NaN only where the scores added to it are -16 or below
        assert "a score of -16 or below" in text and "a fully masked row of higher scores stays finite" in text
        assert nan == (score <= -16)


def _batch_norm(parameters: int):
    """x (fp16) -> BatchNormalization -> Cast(fp32), its scale, bias, mean and variance of type
    `parameters` (opset 15: they may differ from the data's)."""
    # a variance that flushed to 0 in fp16 beside an epsilon of 1e-9: in fp32 the rows divide by
    # sqrt(1e-9 + var), in fp16 by sqrt(1e-9) (plan/batchnorm.py keeps such parameters fp32)
    arrays = {"scale": np.ones(8), "bias": np.zeros(8), "mean": np.zeros(8), "var": np.zeros(8)}
    dtype = np.float16 if parameters == F16 else np.float32
    inits = [H.init(name, a.astype(dtype)) for name, a in arrays.items()]
    nodes = [
        helper.make_node("BatchNormalization", ["x", *arrays], ["h"], name="bn", epsilon=1e-9),
        helper.make_node("Cast", ["h"], ["y"], name="to_output", to=F32),
    ]
    return H.model(nodes, [H.tensor("x", F16, [2, 8, 4, 4])], [H.tensor("y", F32, [2, 8, 4, 4])], inits, opset=15)


def test_ac102_names_batchnorm_statistics_stored_in_fp16_and_not_what_the_converter_does():
    ours = _batch_norm(F32)  # what autocast-onnx writes: fp16 data, fp32 statistics
    H.check(ours)
    assert L.findings(ours, "AC102") == []
    theirs = _batch_norm(F16)
    H.check(theirs)
    (finding,) = L.findings(theirs, "AC102")
    text = finding.message
    assert "scale, bias, mean and variance ('scale', 'bias', 'mean', 'var') stored in fp16" in text
    assert "statistics are what is wrong" in text and "as autocast-onnx convert keeps them" in text
    # parameters that survive fp16 are what the converter writes: no finding
    survive = _batch_norm(F16)
    var = next(t for t in survive.graph.initializer if t.name == "var")
    var.CopyFrom(H.init("var", np.ones(8, np.float16)))
    assert L.findings(survive, "AC102") == []
    # and the converter's own output of an fp32 model with a BatchNormalization: no finding
    fp32 = H.model(
        [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], name="bn")],
        [H.tensor("x", F32, [2, 8, 4, 4])],
        [H.tensor("y", F32, [2, 8, 4, 4])],
        [
            H.init(n, a)
            for n, a in (
                ("scale", np.ones(8, np.float32)),
                ("bias", np.zeros(8, np.float32)),
                ("mean", np.zeros(8, np.float32)),
                ("var", np.ones(8, np.float32)),
            )
        ],
        opset=15,
    )
    converted = autocast_onnx.convert(fp32, include_nodes=["^bn$"]).model
    assert autocast_onnx.lint(converted, select=["AC102"]).findings == []
