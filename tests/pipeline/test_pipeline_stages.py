"""The conversion runs as named stages (pipeline.py): an unexpected exception inside one is named
by its stage in the command line's one-line internal error (exit 3), bad input passes through
unchanged (exit 2), -v logs each stage's start and end, and the summary's stage times keep
their names and order."""

from __future__ import annotations

import logging

import pytest
from bad_input_helpers import PREFIX, assert_one_error, invoke, small_model, write_model

from autocast_onnx import pipeline
from autocast_onnx.errors import AutocastError, InternalCheckError


@pytest.fixture
def m(tmp_path):
    return write_model(small_model(), tmp_path / "m.onnx")


@pytest.fixture
def out(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


@pytest.fixture(autouse=True)
def _quiet_logs():
    """-v points the package's logger at the runner's stderr: put it back afterwards."""
    logger = logging.getLogger("autocast_onnx")
    handlers, level = logger.handlers[:], logger.level
    yield
    logger.handlers[:], logger.level = handlers, level


def _fail(*args, **kwargs):
    raise RuntimeError("stage broke\nsecond line")


# the pipeline's name for the work a stage does -> the stage named in the error
STAGES = {
    "_load_checked": "load",
    "_choose_output": "choose output",
    "_check_opset": "check opset",
    "_read_selection": "read options",
    "_index": "index",
    "_training_setup": "prepare training",
    "_sizes_before": "measure",
    "_fresh_plan": "plan",
    "apply_plan": "apply",
    "_record_training": "record training",
    "_read_back": "read back kept weights",
    "_serialize": "serialize",
    "check_result": "check",
    "save_model": "save",
    "_write_plan": "write plan",
}


@pytest.mark.parametrize("function", sorted(STAGES))
def test_an_unexpected_failure_names_its_stage(m, out, monkeypatch, function):
    monkeypatch.setattr(pipeline, function, _fail)
    outcome = invoke(["convert", m, "-o", out / "x.onnx"])
    assert outcome.code == 3, (outcome.code, outcome.stderr)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    (line,) = outcome.lines()
    assert line.startswith(PREFIX + "internal error while converting "), line
    assert f"in stage {STAGES[function]}: RuntimeError: stage broke second line" in line, line
    assert "this is a bug" in line, line
    assert list(out.iterdir()) == []


def test_bad_input_inside_a_stage_passes_through_unchanged(m, out, monkeypatch):
    def refuse(*args, **kwargs):
        raise AutocastError("the plan cannot be made", "m.onnx", "do something else")

    monkeypatch.setattr(pipeline, "_fresh_plan", refuse)
    line = assert_one_error(invoke(["convert", m, "-o", out / "x.onnx"]), "the plan cannot be made")
    assert "in stage" not in line
    assert list(out.iterdir()) == []


def test_the_python_api_raises_a_stage_error_caused_by_the_original(monkeypatch):
    monkeypatch.setattr(pipeline, "_record_training", _fail)
    with pytest.raises(pipeline.StageError, match="in stage record training: RuntimeError: stage broke") as info:
        pipeline.convert(small_model())
    assert isinstance(info.value, InternalCheckError)  # a bug, not bad input
    assert info.value.stage == "record training"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_inner_stage_error_is_not_named_twice(m, out, monkeypatch):
    """The check runs inside the save (while the bytes are written): the check is named, once."""
    monkeypatch.setattr(pipeline, "check_result", _fail)
    (line,) = invoke(["convert", m, "-o", out / "x.onnx"]).lines()
    assert line.count("in stage") == 1 and "in stage check:" in line, line


def test_verbose_logs_each_stage_start_and_end(m, out):
    outcome = invoke(["convert", m, "-o", out / "x.onnx", "-v"])
    assert outcome.code == 0, outcome.stderr
    for stage in ("load", "resolve target", "check opset", "index", "plan", "apply", "save", "check"):
        assert f"autocast_onnx.pipeline: stage {stage}: start" in outcome.stderr, stage
        assert f"autocast_onnx.pipeline: stage {stage}: done in " in outcome.stderr, stage


def test_the_stage_times_keep_their_names_and_order(m, out):
    assert list(pipeline.convert(small_model()).seconds) == ["load", "index", "plan", "apply", "check"]
    result = pipeline.convert_file(m, out / "x.onnx")
    assert list(result.seconds) == ["load", "index", "plan", "apply", "check", "save", "total"]
    assert all(seconds >= 0 for seconds in result.seconds.values())
