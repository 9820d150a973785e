"""Attention-mask sentinels (plan/masks.py, issue 37 item 4): a constant beyond the low type's
range that only masks scores before a Softmax is retargeted (fp16 -49152, bf16 -2**126), so the
mask Add/Where and the Softmax run low; fully and partly masked rows give fp32's answer."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import F32, convert, model, randn, tensor
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx.validate.emulate import emulation_model

LOWEST = float(np.finfo(np.float32).min)
S, H = 6, 8  # sequence, hidden


def init(name, array, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(array, dtype=dtype), name)


def attention(pattern: str, fill: float = LOWEST, masks: int = 1) -> onnx.ModelProto:
    """x [S, H] -> q, k projections -> scores [S, S] + mask -> Softmax -> @ v -> y. `pattern`:
    "where": Where(keep, 0, fill), as transformers' dynamo exports build it; "mul": (1 - keep) * fill,
    as torch.onnx's TorchScript exports do. `keep` [S, S] is a bool (where) or 0/1 float (mul) input.
    With masks=2 a second mask of the same kind (a causal one, constant) is added too."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
    ]
    inits = [init("wq", randn([H, H], seed=1, scale=0.3)), init("wk", randn([H, H], seed=2, scale=0.3))]
    inits += [init("wv", randn([H, H], seed=3)), init("fill", fill), init("zero", 0.0), init("one", 1.0)]
    keep_type = TensorProto.BOOL if pattern == "where" else TensorProto.FLOAT
    sources = ["keep"] + (["causal"] if masks == 2 else [])
    if masks == 2:
        causal = np.tril(np.ones((S, S))) > 0
        inits.append(
            init(
                "causal",
                causal if pattern == "where" else causal.astype(np.float32),
                causal.dtype if pattern == "where" else np.float32,
            )
        )
    added = "scores"
    for k, src in enumerate(sources):
        if pattern == "where":
            nodes.append(helper.make_node("Where", [src, "zero", "fill"], [f"mask{k}"], name=f"where{k}"))
        else:
            nodes.append(helper.make_node("Sub", ["one", src], [f"inv{k}"], name=f"inv{k}"))
            nodes.append(helper.make_node("Mul", [f"inv{k}", "fill"], [f"mask{k}"], name=f"mul{k}"))
        nodes.append(helper.make_node("Add", [added, f"mask{k}"], [f"masked{k}"], name=f"add{k}"))
        added = f"masked{k}"
    nodes += [
        helper.make_node("Softmax", [added], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="out"),
    ]
    inputs = [tensor("x", F32, [S, H]), helper.make_tensor_value_info("keep", keep_type, [S, S])]
    return model(nodes, inputs, [tensor("y", F32, [S, H])], inits)


def keep_rows(pattern: str, full_rows=(1,)) -> np.ndarray:
    """A padding-style mask: the last two keys masked in every row, every key in `full_rows`."""
    keep = np.ones((S, S), dtype=bool)
    keep[:, -2:] = False
    for r in full_rows:
        keep[r, :] = False
    return keep if pattern == "where" else keep.astype(np.float32)


def run(m: onnx.ModelProto, feeds: dict, emulate: bool) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    data = (emulation_model(m) if emulate else m).SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def precisions(result) -> dict[str, str]:
    return {n.name: n.precision for n in result.plan.nodes if n.name}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pattern", ["where", "mul"])
@pytest.mark.parametrize("fill", [LOWEST, -1e9])
def test_a_mask_sentinel_runs_the_mask_add_and_softmax_low(precision, pattern, fill):
    m = attention(pattern, fill)
    result = convert(m, precision=precision)
    planned = precisions(result)
    assert (planned["add0"], planned["softmax"]) == (precision, precision), planned
    sentinel = -49152.0 if precision == "fp16" else -(2.0**126)
    beyond = fill < -65504 if precision == "fp16" else fill < -3.3895e38  # -1e9 is a bf16 value
    assert result.plan.mask_sentinels == ({"fill": sentinel} if beyond else {})
    feeds = {"x": randn([S, H], seed=4).astype(np.float32), "keep": keep_rows(pattern)}
    want, got = run(m, feeds, emulate=False), run(result.model, feeds, emulate=True)
    assert np.isfinite(got).all(), "a fully masked row stays finite"
    tol = 2e-2 if precision == "bf16" else 3e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    # the fully masked row is fp32's: the mean of v over every key (a uniform softmax)
    assert np.allclose(got[1], want[1], rtol=tol, atol=tol * np.abs(want[1]).max())


def test_without_the_retarget_the_fully_masked_row_would_be_nan():
    """The hazard the sentinel removes: the converted model with float32's lowest put back where
    the sentinel went (with --precise the Where stays fp32, so the sentinel is the lower bound of
    the Clip before the Cast into the fp16 Add)."""
    m = attention("where")
    feeds = {"x": randn([S, H], seed=4).astype(np.float32), "keep": keep_rows("where")}
    converted = convert(m, precise=True).model
    [clip] = [n for n in converted.graph.node if n.op_type == "Clip"]
    [low] = [t for t in converted.graph.initializer if t.name == clip.input[1]]
    assert float(numpy_helper.to_array(low)) == -49152.0
    assert np.isfinite(run(converted, feeds, emulate=True)).all()
    low.CopyFrom(init(low.name, LOWEST))
    assert np.isnan(run(converted, feeds, emulate=True)[1]).all()


def test_the_fast_plan_runs_the_mask_where_low_with_the_sentinel_stored_in_fp16():
    """By default the mask's Where (fp32 only because nothing low fed it) runs fp16 with the Add it
    feeds: the fill is stored as the fp16 sentinel, no Clip and no Cast sit between them (ONNX
    Runtime's Attention fusion matches the mask path), and the output is what --precise gives."""
    m = attention("where")
    feeds = {"x": randn([S, H], seed=4).astype(np.float32), "keep": keep_rows("where")}
    result = convert(m)
    assert not [n for n in result.model.graph.node if n.op_type == "Clip"]
    [fill] = [t for t in result.model.graph.initializer if t.name == "fill"]
    assert fill.data_type == 10 and float(numpy_helper.to_array(fill)) == -49152.0
    got, precise = run(result.model, feeds, emulate=True), run(convert(m, precise=True).model, feeds, emulate=True)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, precise)


def test_two_masks_summed_take_half_the_sentinel_each():
    m = attention("where", masks=2)
    result = convert(m)
    assert result.plan.mask_sentinels == {"fill": -24576.0}
    feeds = {"x": randn([S, H], seed=4).astype(np.float32), "keep": keep_rows("where")}
    got, want = run(result.model, feeds, emulate=True), run(m, feeds, emulate=False)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3 * np.abs(want).max())


def test_a_constant_that_reaches_more_than_a_softmax_keeps_its_reader_fp32():
    """-3.4e38 added to a tensor that is also a graph output is no mask: data-range as before."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "fill"], ["y"], name="add"),
    ]
    m = model(
        nodes, [tensor("x", F32, [S, H])], [tensor("y", F32, [S, H])], [init("w", randn([H, H])), init("fill", LOWEST)]
    )
    result = convert(m)
    assert precisions(result)["add"] == "fp32" and not result.plan.mask_sentinels


def test_a_positive_constant_beyond_the_range_is_no_sentinel():
    m = attention("where", fill=1e9)
    result = convert(m)
    assert not result.plan.mask_sentinels and precisions(result)["add0"] == "fp32"


def test_an_inf_mask_is_left_as_it_is():
    m = attention("where", fill=-np.inf)
    result = convert(m)
    assert not result.plan.mask_sentinels and precisions(result)["add0"] == "fp16"


def test_the_plan_file_carries_the_sentinels_and_replays_them(tmp_path):
    from autocast_onnx.plan.model import PrecisionPlan

    m = attention("where")
    result = convert(m)
    path = tmp_path / "plan.json"
    path.write_text(result.plan.to_json())
    replayed = PrecisionPlan.from_dict(__import__("json").loads(path.read_text()))
    assert replayed.mask_sentinels == {"fill": -49152.0}
    again = convert(m, plan=str(path))
    assert again.model.SerializeToString() == result.model.SerializeToString()


@pytest.mark.parametrize("bad", [-1e30, 5.0, float("nan")])
def test_a_plan_file_with_a_sentinel_out_of_range_is_refused(tmp_path, bad):
    import json

    from autocast_onnx import AutocastError

    m = attention("where")
    data = json.loads(convert(m).plan.to_json())
    data["mask_sentinels"]["fill"] = bad
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AutocastError, match="mask_sentinels"):
        convert(m, plan=str(path))
