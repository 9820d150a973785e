"""The conversion runs as named stages (pipeline.py): an unexpected exception inside one is named
by its stage in the command line's one-line internal error (exit 3), bad input passes through
unchanged (exit 2), -v logs each stage's start and end, and the summary's stage times keep
their names and order. The stage lists are declared once (pipeline.ENTRY_POINTS, FILE_OPENING,
FILE_END): each entry point runs the shared opening and then its own end, in the declared order,
and no stage runs under a name the lists do not declare."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import onnx
import pytest
from bad_input_helpers import PREFIX, assert_one_error, invoke, small_model, write_model

import autocast_onnx
from autocast_onnx import pipeline
from autocast_onnx.errors import AutocastError, InternalCheckError
from autocast_onnx.pipeline import ENTRY_POINTS, FILE_END, FILE_OPENING, INDEXING, OPENING

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "digits_cnn.onnx"
TRAINING = sorted((ROOT / "tests" / "data" / "training").glob("*/training_model.onnx"))


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


# ---- the declared stage lists ---------------------------------------------------------------------


def stages_run(caplog, fn, *args, **kwargs) -> list[str]:
    """The stages `fn` runs, in order, read from the pipeline's -v log."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=pipeline.__name__):
        fn(*args, **kwargs)
    return [m.group(1) for r in caplog.records if (m := re.fullmatch(r"stage (.+): start", r.getMessage()))]


def test_every_entry_point_opens_alike_and_goes_on_to_its_own_end():
    opening = (*OPENING, *INDEXING)
    for name, stages in ENTRY_POINTS.items():
        assert stages[: len(opening)] == opening, name
    ends = {name: stages[len(opening) :] for name, stages in ENTRY_POINTS.items()}
    assert len(set(ends.values())) == len(ends)  # each its own end


@pytest.mark.parametrize("model", [MODEL, *TRAINING[:1]], ids=lambda p: p.parent.name)
def test_convert_plan_model_and_replay_model_run_their_declared_stages(caplog, model):
    proto = onnx.load(model)
    assert stages_run(caplog, autocast_onnx.convert, proto) == list(ENTRY_POINTS["convert"])
    assert stages_run(caplog, pipeline.plan_model, proto) == list(ENTRY_POINTS["plan_model"])
    plan = autocast_onnx.convert(proto).plan
    assert stages_run(caplog, pipeline.replay_model, proto, plan) == list(ENTRY_POINTS["replay_model"])


def test_convert_file_wraps_convert_in_its_file_stages(caplog, tmp_path):
    run = stages_run(caplog, pipeline.convert_file, MODEL, tmp_path / "m.onnx", plan_out=tmp_path / "m.plan.json")
    # a model written in one piece is checked inside the save, and has no weights on disk to check again
    in_one_piece = [s for s in FILE_END if s != "check written files"]
    expected = [*FILE_OPENING, *ENTRY_POINTS["convert"], *in_one_piece]
    expected.insert(expected.index("save") + 1, "check")
    assert run == expected


def test_no_stage_runs_under_a_name_the_lists_do_not_declare():
    """Every `_stage("...")` the pipeline opens is declared, branches not taken above included;
    one that is not is refused when it runs."""
    source = Path(pipeline.__file__).read_text(encoding="utf-8")
    opened = set(re.findall(r'_stage\("([^"]+)"', source))
    assert opened and opened <= pipeline._DECLARED, opened - pipeline._DECLARED
    with pytest.raises(AssertionError, match="not declared"), pipeline._stage("rewrite everything"):
        pass
