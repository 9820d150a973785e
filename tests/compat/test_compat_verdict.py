"""Issue 39, the drop-in cases that onnxconverter-common's own tests found (tests/compat/test_compat_upstream.py
runs those files against the drop-ins where the peer is installed):

- auto_convert_mixed_precision(model, feed_dict, validate_fn, ...): the caller's verdict judges
  the accuracy search, alone or beside rtol/atol (autocast_onnx.convert(verdict=...) underneath),
  and the search's log names what judged it;
- auto_convert_mixed_precision_model_path(...): the peer's file-to-file search, its output written
  with external data;
- a model whose graph outputs (main graph and If branches) are declared without a type is typed
  by ONNX type inference on load, as ONNX Runtime types it, and said in the plan's warnings; one
  that inference cannot type either is still refused;
- diagnose (the search's attribution) feeds a converted model's float16 inputs in their own type.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx import compat
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate import runner
from autocast_onnx.validate.diagnose import diagnose
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(ROOT / "examples" / "models" / f"{name}.onnx"))


def batch_of(m: onnx.ModelProto, seed: int = 0) -> dict:
    return generate(plan_inputs(describe_inputs(m)), seed=seed)


def quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def fp32_compute(m: onnx.ModelProto) -> int:
    """The number of Conv/Gemm/MatMul nodes whose first input is float32 in the converted model."""
    types = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.input) + list(m.graph.value_info)}
    types.update({t.name: t.data_type for t in m.graph.initializer})
    for node in m.graph.node:
        if node.op_type == "Cast":
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    heavy = [n for n in m.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    return sum(1 for n in heavy if types.get(n.input[0]) == TensorProto.FLOAT or n.input[0] not in types)


def largest_error(source: onnx.ModelProto, converted: onnx.ModelProto, feeds: dict) -> float:
    from autocast_onnx.validate.emulate import emulation_model

    ref = runner.run(runner.session(source.SerializeToString(), "cpu"), feeds)
    emu = runner.session(emulation_model(converted).SerializeToString(), "cpu", optimize=False)
    got = runner.run(emu, runner.feeds_for(emu, feeds))
    return max(float(np.abs(g.astype(np.float64) - r).max() / np.abs(r).max()) for r, g in zip(ref, got))


# ---- validate_fn ----------------------------------------------------------------------------


def test_validate_fn_is_called_with_the_reference_then_the_converted_outputs_in_their_types():
    """As in the peer: validate_fn(res1, res2), two lists in the model's output order; first the fp32
    outputs against themselves, then each try, whose outputs have the converted model's types
    (float16 with keep_io_types=False)."""
    source = load("digits_cnn")
    calls = []

    def validate_fn(res1, res2):
        calls.append(([r.dtype for r in res1], [r.dtype for r in res2], res1 is res2))
        return True

    out = quiet(compat.auto_convert_mixed_precision, source, batch_of(source), validate_fn, keep_io_types=False)
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert calls[0][:2] == ([np.float32], [np.float32])
    assert len(calls) >= 2 and all(c[0] == [np.float32] and c[1] == [np.float16] for c in calls[1:])


def test_a_stricter_validate_fn_keeps_more_fp32_and_the_result_meets_it():
    """The verdict drives the search: one that accepts anything keeps only the rules' fp32 nodes;
    one that asks for 1/20 of the plain conversion's error keeps Conv/Gemm nodes fp32 until the
    result meets it."""
    source = load("digits_cnn")
    feeds = batch_of(source, seed=2)
    loose = quiet(compat.auto_convert_mixed_precision, source, feeds, lambda a, b: True, keep_io_types=True)
    plain_error = largest_error(source, loose, feeds)
    bound = plain_error / 20

    def strict(res1, res2):
        return bool(np.abs(res2[0].astype(np.float64) - res1[0]).max() <= bound * np.abs(res1[0]).max())

    tight = quiet(compat.auto_convert_mixed_precision, source, feeds, strict, keep_io_types=True)
    assert largest_error(source, tight, feeds) <= bound
    assert fp32_compute(tight) > fp32_compute(loose)


def test_validate_fn_and_rtol_must_both_hold():
    """Given together, as in the peer, both judge: a validate_fn that accepts anything does not
    loosen rtol."""
    source = load("digits_cnn")
    feeds = batch_of(source, seed=2)
    rtol = largest_error(source, quiet(compat.convert_float_to_float16, source, keep_io_types=True), feeds) / 10
    both = quiet(compat.auto_convert_mixed_precision, source, feeds, lambda a, b: True, rtol=rtol, keep_io_types=True)
    assert largest_error(source, both, feeds) <= rtol


def test_the_search_log_names_what_judged_it():
    source = load("digits_cnn")
    result = autocast_onnx.convert(source, verdict=lambda a, b: True)
    assert result.plan.search["judged_by"] == ["the verdict callback"]
    result = autocast_onnx.convert(source, verdict=lambda a, b: True, target="rtol=0.5")
    assert result.plan.search["judged_by"] == ["rtol=0.5", "the verdict callback"]
    result = autocast_onnx.convert(source, target="cosine=0.99")
    assert result.plan.search["judged_by"] == ["cosine=0.99"]


def _raises(a, b):
    raise RuntimeError("boom")


VERDICT_REFUSED = [
    ("not callable", 42, "not callable"),
    ("rejects the reference", lambda a, b: False, "compared with themselves"),
    ("raises", _raises, "raised RuntimeError: boom"),
    ("returns an array", lambda a, b: np.array([True, False]), "not True or False"),
    ("returns None", lambda a, b: None, "not True or False"),
]


@pytest.mark.parametrize("callback,fragment", [c[1:] for c in VERDICT_REFUSED], ids=[c[0] for c in VERDICT_REFUSED])
def test_a_validate_fn_that_cannot_judge_is_refused_naming_it(callback, fragment):
    source = load("digits_cnn")
    with pytest.raises(AutocastError) as err:
        quiet(compat.auto_convert_mixed_precision, source, batch_of(source), callback, keep_io_types=True)
    assert err.value.where == "validate_fn" and fragment in err.value.line() and "\n" not in err.value.line()


def test_a_validate_fn_no_plan_meets_names_it():
    """A verdict that only fp32 outputs could meet, and that every plan misses (it rejects any
    difference, and the casts at the kept float32 inputs round), is refused naming validate_fn."""
    source = load("digits_cnn")

    def exact(res1, res2):
        return bool(all(np.array_equal(a, b) for a, b in zip(res1, res2)))

    with pytest.raises(AutocastError) as err:
        quiet(compat.auto_convert_mixed_precision, source, batch_of(source), exact, keep_io_types=False)
    assert err.value.where == "validate_fn" and "cannot be met" in err.value.line()


def test_the_api_refuses_a_verdict_that_is_not_callable():
    with pytest.raises(AutocastError) as err:
        autocast_onnx.convert(load("digits_cnn"), verdict="rtol=0.1")
    assert err.value.where == "verdict"


# ---- auto_convert_mixed_precision_model_path ----------------------------------------------------


def test_model_path_writes_the_model_with_its_data_and_returns_none(tmp_path):
    source_path = ROOT / "examples" / "models" / "digits_cnn.onnx"
    source = onnx.load(str(source_path))
    feeds = batch_of(source)
    target = tmp_path / "out" / "digits16.onnx"
    said = quiet(
        compat.auto_convert_mixed_precision_model_path,
        str(source_path), feeds, str(target), ["CPUExecutionProvider"], rtol=0.05, atol=0.05,
    )  # fmt: skip
    assert said is None
    assert target.exists() and (target.parent / "fp16_tensor.data").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["digits16.onnx", "fp16_tensor.data"]
    written = onnx.load(str(target))
    onnx.checker.check_model(written, full_check=True)
    assert largest_error(source, written, feeds) <= 0.05
    # run again: the output is replaced, and a CompatWarning says so
    with pytest.warns(compat.CompatWarning, match="replacing"):
        compat.auto_convert_mixed_precision_model_path(
            source_path, feeds, target, ["CPUExecutionProvider"], location="w.data", rtol=0.05, atol=0.05
        )
    assert (target.parent / "w.data").exists()


def test_model_path_with_a_callback_warns_that_rtol_does_nothing_beside_it(tmp_path):
    source_path = ROOT / "examples" / "models" / "digits_cnn.onnx"
    feeds = batch_of(onnx.load(str(source_path)))
    with pytest.warns(compat.CompatWarning, match="rtol do nothing beside customized_validate_func"):
        compat.auto_convert_mixed_precision_model_path(
            source_path, feeds, tmp_path / "m.onnx", ["CPUExecutionProvider"],
            customized_validate_func=lambda a, b: True, rtol=1e-9,
        )  # fmt: skip


MODEL_PATH_REFUSED = [
    ({"source_model_path": load}, "source_model_path"),
    ({"provider": ["NoSuchExecutionProvider"]}, "provider"),
    ({"provider": "CPU"}, "provider"),
    ({"location": "../escape.data"}, "location"),
    ({"customized_validate_func": 3}, "customized_validate_func"),
    ({"rtol": -1.0}, "rtol"),
]


@pytest.mark.parametrize(
    "change,where", MODEL_PATH_REFUSED, ids=[w + str(i) for i, (_, w) in enumerate(MODEL_PATH_REFUSED)]
)
def test_model_path_refusals_name_the_keyword_and_write_nothing(tmp_path, change, where):
    source_path = ROOT / "examples" / "models" / "digits_cnn.onnx"
    call = {
        "source_model_path": str(source_path),
        "input_feed": batch_of(onnx.load(str(source_path))),
        "target_model_path": str(tmp_path / "m.onnx"),
        "provider": ["CPUExecutionProvider"],
        **change,
    }
    with pytest.raises(AutocastError) as err:
        quiet(compat.auto_convert_mixed_precision_model_path, **call)
    assert err.value.where == where
    assert list(tmp_path.iterdir()) == []


def test_model_path_plans_for_the_providers_runtime():
    assert [compat._provider_runtime([p]) for p in compat._PROVIDER_RUNTIMES] == [None, "cuda", "tensorrt", "dml"]


# ---- outputs declared without a type --------------------------------------------------------


def untyped_if_model(custom_branch: bool = False) -> onnx.ModelProto:
    """y = If(sum(x) > 0, then: MatMul(x, w), else: Identity(x)), every graph output declared by
    name alone (as exporters leave If branches). custom_branch: the then-branch's output comes
    from an op of an unknown domain, which type inference cannot type."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel().tolist())
    if custom_branch:
        then_node = helper.make_node("Mystery", ["x"], ["t"], domain="com.example")
    else:
        then_node = helper.make_node("MatMul", ["x", "w"], ["t"])
    then_g = helper.make_graph([then_node], "then", [], [onnx.ValueInfoProto(name="t")])
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [onnx.ValueInfoProto(name="e")]
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [onnx.ValueInfoProto(name="y")],
        [w],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.example", 1)] if custom_branch else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_untyped_graph_outputs_are_typed_by_inference_and_said():
    source = untyped_if_model()
    before = source.SerializeToString()
    result = autocast_onnx.convert(source)
    assert source.SerializeToString() == before  # the caller's model is not typed in place
    said = [w.message for w in result.plan.warnings if w.code == "untyped-output"]
    assert len(said) == 3 and any("graph output 'y'" in m and "float" in m for m in said)
    assert result.model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.array([[1, -2, 3, 4], [0.5, 0.25, -1, 2]], np.float32)
    sess = runner.session(result.model.SerializeToString(), "cpu")
    np.testing.assert_allclose(runner.run(sess, {"x": x})[0], x, rtol=1e-3)


def test_untyped_body_outputs_under_a_typed_main_graph_need_no_inference():
    """The index types a body's outputs from their producers: with the main graph's outputs typed,
    nothing is inferred (the load only looks at the main graph's outputs) and nothing is said."""
    source = untyped_if_model()
    source.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    result = autocast_onnx.convert(source)
    assert not [w for w in result.plan.warnings if w.code == "untyped-output"]
    x = np.array([[1, -2, 3, 4], [0.5, 0.25, -1, 2]], np.float32)
    np.testing.assert_allclose(
        runner.run(runner.session(result.model.SerializeToString(), "cpu"), {"x": x})[0], x, rtol=1e-3
    )


def test_the_drop_in_lowers_an_untyped_float_output_as_the_peer_does():
    out = quiet(compat.convert_float_to_float16, untyped_if_model(), keep_io_types=False)
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_an_output_inference_cannot_type_is_still_refused():
    with pytest.raises(AutocastError, match="graph output 'y' has no type"):
        autocast_onnx.convert(untyped_if_model(custom_branch=True))


# ---- diagnose with float16 inputs ------------------------------------------------------------


def test_diagnose_feeds_a_converted_models_float16_inputs_in_their_type():
    """The search's attribution diagnosed a model converted with keep_io_types=False by feeding its
    float16 input the fp32 batch, which ONNX Runtime refuses."""
    source = load("digits_cnn")
    converted = quiet(compat.convert_float_to_float16, source, keep_io_types=False)
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    report = diagnose(source, converted, batch=batch_of(source), top=3)
    assert report["nodes"] and all(np.isfinite(n["introduced"]) for n in report["nodes"])
