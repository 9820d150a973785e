"""The Python API mirrors the CLI: convert (with calibration data and targets), validate, lint,
explain and diagnose, with typed results and readable reprs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
RESNET, BERT = MODELS / "resnet_tiny.onnx", MODELS / "bert_tiny.onnx"
DETECTOR = ROOT / "tests" / "data" / "evidence" / "text_detector.onnx"


def test_the_top_level_names():
    for name in ("convert", "convert_file", "validate", "lint", "explain", "diagnose", "check", "plan_on_data"):
        assert callable(getattr(autocast_onnx, name)), name
    # the packages behind two of them stay importable
    from importlib import import_module

    assert import_module("autocast_onnx.validate.core").ValidateOptions
    assert import_module("autocast_onnx.lint.engine").LintOptions
    assert autocast_onnx.validate.core.validate and autocast_onnx.lint.engine.lint


def test_convert_result_and_plan_have_readable_reprs():
    result = autocast_onnx.convert(RESNET)
    # no warning: its nine BatchNormalization store their parameters in fp16 (plan/batchnorm.py), which CUDA runs
    assert repr(result.plan) == "PrecisionPlan(fp16, 31 nodes: fp16 28, fp32 3; 0 warning(s))"
    assert repr(result).startswith("ConversionResult(PrecisionPlan(fp16, 31 nodes") and "2 casts added" in repr(result)
    assert "object at 0x" not in repr(result) + repr(result.plan) + repr(result.plan.nodes[0])
    assert result.summary().startswith("converted to fp16")


@pytest.mark.slow
def test_convert_with_a_target_runs_the_search(tmp_path):
    images = np.load(DETECTOR.with_suffix(".npz"))["image"]
    folder = tmp_path / "batches"
    folder.mkdir()
    for k in range(len(images)):
        np.savez(folder / f"b{k}.npz", image=images[k : k + 1])
    result = autocast_onnx.convert(DETECTOR, target="rtol=0.005", inputs=folder)
    search = result.plan.search
    assert search is not None and search["evaluations"] >= 2 and search["kept"]
    searched = {n.name for n in result.plan.nodes if n.reasons and n.reasons[-1].code == "accuracy-search"}
    assert searched and searched <= set(search["kept"])
    report = autocast_onnx.validate(DETECTOR, result.model, inputs=folder, rtol=0.005, speed=False)
    assert report.passed
    with pytest.raises(AutocastError, match="inputs= has no effect without target="):
        autocast_onnx.convert(RESNET, inputs=folder)


def test_convert_with_calibration_data(tmp_path):
    data = tmp_path / "calib.npz"
    np.savez(data, pixel_values=np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32))
    result = autocast_onnx.convert(RESNET, calibration_data=data)
    assert result.plan.counts()["fp16"] > 0  # the ranges of this model fit fp16: nothing forced


def test_validate_returns_a_typed_report_like_the_cli(tmp_path):
    conv = tmp_path / "r16.onnx"
    autocast_onnx.convert_file(RESNET, conv)
    report = autocast_onnx.validate(RESNET, conv, speed=False, rtol=1e-9)
    assert not report.passed and report["passed"] is False
    [out] = report.outputs
    assert out.name == "logits" and not out.passed and out.class_scores == "name"
    assert out.failures and "relative error" in out.failures[0]
    assert repr(report).startswith("ValidationReport(FAIL: logits: FAIL, max abs ")
    assert "result: FAIL" in report.text()
    cli_json = tmp_path / "cli.json"
    CliRunner().invoke(cli, ["validate", str(RESNET), str(conv), "--no-speed", "--rtol", "1e-9", "--report-json",
                             str(cli_json)])  # fmt: skip
    assert json.loads(cli_json.read_text())["outputs"] == report.to_dict()["outputs"]
    with pytest.raises(AutocastError, match="with inputs="):
        autocast_onnx.validate(RESNET, conv, inputs=tmp_path / "x.npz", batches=2)
    with pytest.raises(AutocastError, match="rtol"):
        autocast_onnx.validate(RESNET, conv, rtol=-1)


def test_lint_and_explain_mirror_the_cli():
    report = autocast_onnx.lint(BERT)
    assert report.passed and len(report.findings) == sum(report.counts().values()) > 0
    assert repr(report).startswith("LintReport(1 model(s), ")
    # runtime="any", as --runtime any: counting on no runtime's kernels the Softmax findings are
    # there (for CUDA, the default, its Softmax kernel computes in fp32 and AC101 is not reported)
    assert autocast_onnx.lint(BERT, select=["AC101"]).findings == []
    only = autocast_onnx.lint(BERT, select=["AC101"], runtime="any")
    assert {d.code for d in only.findings} == {"AC101"}
    # planned for CUDA (the default) the keep_fp32 Softmax between fp16 neighbours runs at fp16
    entries = autocast_onnx.explain(BERT, op="Softmax")
    assert [e.precision for e in entries] == ["fp16", "fp16"]
    assert repr(entries[0]) == "<NodePlan #49 /encoder/layer.0/attention/self/Softmax (Softmax) fp16: kernel-fp32>"
    entries = autocast_onnx.explain(BERT, op="Softmax", runtime="any")
    assert [e.precision for e in entries] == ["fp32", "fp32"]
    assert repr(entries[0]) == "<NodePlan #49 /encoder/layer.0/attention/self/Softmax (Softmax) fp32: op-category>"
    text = entries[0].explain()
    assert text.startswith("/encoder/layer.0/attention/self/Softmax (Softmax), node #49")
    assert "Softmax always stays fp32" in text
    assert [e.name for e in autocast_onnx.explain(BERT, r"layer\.1/.*Softmax")] == [
        "/encoder/layer.1/attention/self/Softmax"
    ]
    with pytest.raises(AutocastError, match="no node matches"):
        autocast_onnx.explain(BERT, "/Wher")


def test_the_notebook_runs(tmp_path, monkeypatch):
    """docs/api.ipynb: its code cells run in order and print what the notebook shows."""
    notebook = json.loads((ROOT / "docs" / "api.ipynb").read_text(encoding="utf-8"))
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert len(cells) >= 4
    for cell in cells:
        exec(compile("".join(cell["source"]), "<notebook>", "exec"), scope)
    assert scope["report"].passed and scope["entries"]
