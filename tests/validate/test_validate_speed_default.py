"""Speed is timed by default only where it means something (issue 28, item 5): on CUDA, not on
CPU, where the report itself says an fp16 speed-up says nothing about a GPU. --speed forces it,
--no-speed turns it off, and speed, iterations, warmup and batches can come from the
configuration file (flags win). check's summary prints no CPU speed-up unless asked."""

from __future__ import annotations

import json

import onnx
import pytest
from bad_input_helpers import assert_ok, invoke, isolated_cwd
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.validate.core import SPEED_LEFT_OUT, ValidateOptions, timed
from autocast_onnx.validate.options import validate_options

isolated = pytest.fixture(autouse=True)(isolated_cwd)


def small_model() -> onnx.ModelProto:
    return parse(
        """
        g (float[batch,8] x) => (float[batch,8] y) {
            h = MatMul(x, w)
            y = Relu(h)
        }""",
        w=randn([8, 8], 1),
    )


@pytest.fixture
def pair(tmp_path):
    ref, conv = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(small_model(), ref)
    autocast_onnx.convert_file(ref, conv)
    return ref, conv


def test_the_default_times_on_cuda_only():
    assert timed(ValidateOptions(), "cuda") and not timed(ValidateOptions(), "cpu")
    assert timed(ValidateOptions(speed=True), "cpu") and not timed(ValidateOptions(speed=False), "cuda")


def test_validate_on_cpu_leaves_speed_out_by_default_and_says_so(pair):
    ref, conv = pair
    report = autocast_onnx.validate(ref, conv, device="cpu")
    assert report.speed is None and report["speed_skipped"] == SPEED_LEFT_OUT
    assert SPEED_LEFT_OUT in report.text() and "speed-up" not in report.text()
    forced = autocast_onnx.validate(ref, conv, device="cpu", speed=True, iterations=2, warmup=0)
    assert forced.speed["reference"]["iterations"] == 2 and forced["speed_skipped"] is None
    off = autocast_onnx.validate(ref, conv, device="cpu", speed=False)
    assert off.speed is None and off["speed_skipped"] is None


def test_the_cli_default_and_flags(pair, tmp_path):
    ref, conv = pair
    report = tmp_path / "r.json"
    assert_ok(invoke(["validate", ref, conv, "--device", "cpu", "--report-json", report]))
    assert json.loads(report.read_text())["speed"] is None
    assert_ok(
        invoke(["validate", ref, conv, "--device", "cpu", "--speed", "--iterations", "2", "--report-json", report])
    )
    assert json.loads(report.read_text())["speed"]["reference"]["iterations"] == 2


def test_speed_iterations_warmup_and_batches_come_from_the_configuration(pair, tmp_path, isolated):
    ref, conv = pair
    (isolated / "autocast-onnx.toml").write_text("speed = true\niterations = 3\nwarmup = 0\nbatches = 2\n")
    report = tmp_path / "r.json"
    assert_ok(invoke(["validate", ref, conv, "--device", "cpu", "--report-json", report]))
    data = json.loads(report.read_text())
    assert data["speed"]["reference"]["iterations"] == 3 and data["speed"]["reference"]["warmup"] == 0
    assert data["inputs"]["batches"] == 2
    # the flags win over the configuration
    args = ["--no-speed", "--batches", "1", "--report-json", report]
    assert_ok(invoke(["validate", ref, conv, "--device", "cpu", *args]))
    data = json.loads(report.read_text())
    assert data["speed"] is None and data["inputs"]["batches"] == 1


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('speed = "yes"', "speed must be true or false"),
        ("iterations = 0", "iterations must be a whole number from 1 to 1000000"),
        ("batches = 2.5", "batches must be a whole number from 1 to 10000"),
        ("warmup = true", "warmup must be a whole number from 0 to 100000"),
    ],
)
def test_bad_speed_settings_are_one_line_errors(pair, isolated, line, fragment):
    from bad_input_helpers import assert_one_error

    ref, conv = pair
    (isolated / "autocast-onnx.toml").write_text(line + "\n")
    assert_one_error(invoke(["validate", ref, conv]), fragment, "autocast-onnx.toml")


def test_the_builder_reads_the_settings_and_lets_flags_win():
    settings = {"speed": False, "iterations": 7, "warmup": 1, "batches": 4}
    built = validate_options(settings)
    assert (built.speed, built.iterations, built.warmup, built.batches) == (False, 7, 1, 4)
    flagged = validate_options(settings, speed=True, iterations=2, warmup=0, batches=1)
    assert (flagged.speed, flagged.iterations, flagged.warmup, flagged.batches) == (True, 2, 0, 1)
    assert validate_options().speed is None


def test_check_prints_no_cpu_speed_up_unless_asked(pair):
    ref, _ = pair
    result = autocast_onnx.check(ref, device="cpu")
    assert result.report["validation"]["speed"] is None and "speed-up" not in result.text()
    asked = autocast_onnx.check(ref, device="cpu", speed=True, iterations=2, warmup=0)
    assert "speed-up" in asked.text() and "on cpu" in asked.text()
