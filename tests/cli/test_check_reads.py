"""`check` reads and checks its input once and hands it down: the gate's screen, the
validation's precheck, the lint and the comparison share that one read (the conversion streams
the file itself), and the converted model is read back once for its lint and its comparison. A
model with external data is read by each run instead, so no weights stay in memory beside the
conversion; its report is the one its inline copy gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from work_helpers import files_loaded

from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "models" / "resnet_tiny.onnx"


def run_check(*args) -> int:
    result = CliRunner().invoke(cli, ["check", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.exit_code


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty folder to run from (no configuration file is found) holding a copy of the model."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(RESNET, tmp_path / "m.onnx")
    return tmp_path


@pytest.mark.parametrize("extra", [("--no-speed",), ("--no-validate",)], ids=["validate", "no-validate"])
def test_check_reads_the_model_once_beside_the_conversion_and_the_result_once(work, extra):
    """It used to read the model 5 times (the precheck, the screen, the lint, the conversion, the
    comparison) and the converted model twice (its lint, the comparison)."""
    model, out = work / "m.onnx", work / "m.c.onnx"
    loads = files_loaded(run_check, model, "-o", out, *extra)
    assert loads == [str(model), str(model), str(out)]  # the gate's read, the conversion's, the read-back


def external_copy(folder: Path) -> Path:
    """The example model saved with every weight in one external-data file."""
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save_model(onnx.load(RESNET), path, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    return path


def without_paths(report: dict) -> dict:
    """The check report without what names the files checked or times them."""
    lint = [
        {k: v for k, v in d.items() if k not in ("model", "location")}
        for part in ("lint_original", "lint_converted")
        for d in report[part]["diagnostics"]
    ]
    outputs = report["validation"]["outputs"]
    return {"lint": lint, "conversion": report["conversion"], "gate": report["gate"], "outputs": outputs}


def test_a_model_with_external_data_is_read_by_each_run_and_reports_as_its_inline_copy(work):
    inline, external = work / "m.onnx", external_copy(work / "ext")
    stored = onnx.load(external, load_external_data=False).graph.initializer
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)
    run_check(inline, "--no-speed", "--report-json", work / "inline.json")
    args = (external, "-o", work / "ext.c.onnx", "--no-speed", "--report-json", work / "ext.json")
    loads = files_loaded(run_check, *args)
    # the gate's read (no weights), then the lint, the conversion and the comparison each read
    # the weights they need, and so do the converted model's (written with external data too)
    out = str(work / "ext.c.onnx")
    assert loads == [str(external)] * 3 + [out, str(external), out]
    inline_report = json.loads((work / "inline.json").read_text())
    external_report = json.loads((work / "ext.json").read_text())
    assert external_report["validation"]["reference"]["path"] == str(external)
    assert without_paths(external_report) == without_paths(inline_report)
