"""convert --validate keeps a good conversion (issue 28, item 7): when the validation cannot run
(generated inputs the model refuses), the converted model and its plan stay on disk, and the one
error line says it was written but not validated and how to validate it (exit 2). A validation
that runs and fails its thresholds keeps the model too (exit 1), as before."""

from __future__ import annotations

import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, isolated_cwd
from helpers import reshaped_to_fixed_rows

isolated = pytest.fixture(autouse=True)(isolated_cwd)


def test_a_validation_that_cannot_run_keeps_the_converted_model(tmp_path):
    model, out, plan = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx", tmp_path / "plan.json"
    onnx.save(reshaped_to_fixed_rows(4), model)
    outcome = invoke(["convert", model, "-o", out, "--plan-out", plan, "--validate"])
    line = assert_one_error(outcome, "ONNX Runtime failed to run the reference model")
    assert f"the converted model was written to {out} but not validated" in line
    assert f"then validate it with `autocast-onnx validate {model} {out}`" in line
    assert out.is_file() and plan.is_file()
    onnx.checker.check_model(onnx.load(out))
    # the hint works: with inputs the model takes, the kept model validates
    assert_ok(invoke(["validate", model, out, "--dim", "x:0=2"]))


def test_a_failed_threshold_keeps_the_model_and_exits_1(tmp_path):
    model, out = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(reshaped_to_fixed_rows(4), model)
    outcome = invoke(["convert", model, "-o", out, "--validate", "--dim", "x:0=2", "--atol", "1e-12"])
    assert_ok(outcome, code=1)
    assert "result: FAIL" in outcome.stdout and out.is_file()


def test_bad_validation_options_still_write_nothing(tmp_path):
    model, out = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(reshaped_to_fixed_rows(4), model)
    assert_one_error(invoke(["convert", model, "-o", out, "--validate", "--dim", "x:1=4"]), "fixed size 8")
    assert not out.exists()
