"""pipeline.plan_model plans a model without converting it (no rewrite, no apply, no check): its
plan must be the one convert gives with the same options, for every shipped model and the
training graphs (whose plan records the loss scaling the rewrite adds), and the callers that read
only the plan (lint's protected findings, diagnose's reasons, explain) must not convert."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import parse

import autocast_onnx
from autocast_onnx import pipeline
from autocast_onnx.errors import AutocastError
from autocast_onnx.pipeline import convert, plan_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "models").glob("*.onnx"))
TRAINING = sorted((ROOT / "tests" / "data" / "training").glob("*/training_model.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_equals_converts_plan(path, precision):
    assert EXAMPLES
    planned = plan_model(path, precision=precision)
    assert planned.plan.to_dict() == convert(path, precision=precision, check="none").plan.to_dict()
    assert len(planned.index.nodes) == len(planned.plan.precisions)


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.parent.name)
def test_training_plan_records_the_loss_scaling_as_convert_does(path):
    assert TRAINING
    planned = plan_model(path)
    assert planned.training is not None
    assert planned.plan.to_dict() == convert(path, check="none").plan.to_dict()


def _small():
    return parse(
        """
        <ir_version: 8, opset_import: ["": 17]>
        g (float[2,4] x) => (float[2,4] y) {
            m = MatMul(x, w)
            s = Softmax(m)
            y = Relu(s)
        }
        """,
        w=np.eye(4, dtype=np.float32),
    )


def test_options_travel_and_the_input_is_left_alone():
    model = _small()
    before = model.SerializeToString()
    options = {"precision": "bf16", "exclude_ops": ["Relu"], "keep_io_types": False}
    planned = plan_model(model, **options)
    assert planned.plan.to_dict() == convert(model, check="none", **options).plan.to_dict()
    assert model.SerializeToString() == before


def test_bad_input_is_refused_as_convert_refuses_it():
    model = _small()
    model.opset_import[0].version = 11
    with pytest.raises(AutocastError, match="cannot express bf16"):
        plan_model(model, precision="bf16")
    with pytest.raises(AutocastError, match="unknown precision"):
        plan_model(_small(), precision="fp8")


def _refuse_conversion(monkeypatch) -> None:
    """From here on, any full conversion fails the test: callers that read only the plan must plan only."""

    def refuse(*args, **kwargs):
        raise AssertionError("a full conversion was run only to read its plan")

    monkeypatch.setattr(pipeline, "_convert_loaded", refuse)


def test_explain_plans_only(monkeypatch):
    expected = [e.explain() for e in convert(_small()).plan.find(op="Softmax")]
    _refuse_conversion(monkeypatch)
    assert [e.explain() for e in autocast_onnx.explain(_small(), op="Softmax")] == expected


def test_lint_protected_plans_only(monkeypatch):
    model = EXAMPLES[0]
    expected = autocast_onnx.lint(model).text()
    _refuse_conversion(monkeypatch)
    assert autocast_onnx.lint(model).text() == expected


def test_diagnose_plans_only(monkeypatch, tmp_path):
    from autocast_onnx.validate.diagnose import diagnose_files

    reference, converted = ROOT / "examples" / "models" / "digits_cnn.onnx", tmp_path / "conv.onnx"
    converted.write_bytes(convert(reference).model.SerializeToString())
    expected = diagnose_files(reference, converted)
    _refuse_conversion(monkeypatch)
    assert diagnose_files(reference, converted) == expected
