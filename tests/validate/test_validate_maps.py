"""Probability maps and near-zero outputs (issue 28, item 2), and thresholds of one output's own
(item 6): a map is judged by the IoU of its thresholded masks, not by the raw error of a few
boundary pixels; an output far below the low-precision type's resolution is not failed by the
relative error of noise; `--rtol NAME=X` and the like set one output's limits on the command
line, in the configuration file and as API keywords."""

import json

import numpy as np
import onnx
import pytest
from helpers import parse
from validate_helpers import ROOT, cli

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.metrics import OutputStats, Thresholds, verdict
from autocast_onnx.validate.options import validate_options

FP16_EPS, BF16_EPS = 2.0**-10, 2.0**-7  # the types' resolution at 1 (metrics.RELATIVE_FLOOR)

NO_SPEED = ValidateOptions(speed=False)
SCHEMA = "validate-report.schema.json"


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Settings come from the nearest pyproject.toml: run every test from a folder without one."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def sigmoid_map(shift: float, name: str = "prob_map"):
    """x [1, 1, 64, 64] -> Sigmoid(50 x + shift): a steep map whose boundary pixels move by up to
    shift / 4 when the logits shift, while few of them cross 0.5."""
    return parse(
        f"""
        g (float[1,1,64,64] x) => (float[1,1,64,64] {name}) {{
            a = Mul(x, k)
            b = Add(a, s)
            {name} = Sigmoid(b)
        }}""",
        k=np.array(50.0, np.float32),
        s=np.array(shift, np.float32),
    )


def masks_iou(shift: float, threshold: float, seed: int = 0):
    """The IoU of the two maps' masks and the flipped pixels, computed here from the inputs that
    validation generates (standard normal, seed 0)."""
    x = np.random.default_rng(seed).standard_normal((1, 1, 64, 64)).astype(np.float32)
    ref = 1 / (1 + np.exp(-50.0 * x.astype(np.float64))) > threshold
    out = 1 / (1 + np.exp(-(50.0 * x.astype(np.float64) + shift))) > threshold
    return (ref & out).sum() / (ref | out).sum(), int((ref ^ out).sum())


def only(report):
    (output,) = report["outputs"]
    return output


# ---------------------------------------------------------------------------------------------- maps


def test_a_map_is_judged_by_the_iou_of_its_masks_not_by_its_raw_error():
    report = validate(sigmoid_map(0.0), sigmoid_map(0.2), NO_SPEED)
    out = only(report)
    iou, flipped = masks_iou(0.2, 0.5)
    assert out["map"]["kind"] == "shape" and out["map"]["threshold"] == 0.5
    assert out["map"]["iou"] == pytest.approx(iou) and out["map"]["flipped"] == flipped > 0
    assert out["relative_error"] > 0.01  # the raw error would fail rtol 0.01 ...
    assert iou >= 0.99 and out["passed"] and report["passed"]  # ... the masks agree
    text = autocast_onnx.validate(sigmoid_map(0.0), sigmoid_map(0.2), speed=False).text()
    assert f"IoU {iou:.4f} of the masks at > 0.5, {flipped} of 4096 pixels flip" in text
    # the report carries it as the schema says, and the HTML page does not colour the raw error
    import jsonschema

    from autocast_onnx.report.html import failed_metrics
    from autocast_onnx.report.validation import validation_json

    jsonschema.validate(json.loads(validation_json(report)), json.loads((ROOT / "docs" / SCHEMA).read_text()))
    assert failed_metrics(out, report["thresholds"]) == set()
    assert failed_metrics(out, {**report["thresholds"], "min_iou": 0.9999}) == {"iou"}


def test_min_iou_fails_a_map_whose_masks_differ():
    report = validate(sigmoid_map(0.0), sigmoid_map(3.0), NO_SPEED)
    iou, _ = masks_iou(3.0, 0.5)
    out = only(report)
    assert iou < 0.99 and not out["passed"]
    assert len(out["failures"]) == 1 and out["failures"][0].startswith(f"IoU {iou:.6g} of the masks at > 0.5 < min-iou")


def test_the_map_threshold_is_an_option_and_a_configuration_key(isolated_cwd, tmp_path):
    iou, flipped = masks_iou(0.2, 0.3)
    api = autocast_onnx.validate(sigmoid_map(0.0), sigmoid_map(0.2), speed=False, map_threshold=0.3)
    assert api.outputs[0].iou == pytest.approx(iou) and api["outputs"][0]["map"]["flipped"] == flipped
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(sigmoid_map(0.0), ref)
    onnx.save(sigmoid_map(0.2), conv)
    (isolated_cwd / "autocast-onnx.toml").write_text("map-threshold = 0.3\nmin-iou = 0.999\n")
    result = cli("validate", ref, conv, "--no-speed", "--report-json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["thresholds"]["map_threshold"] == 0.3 and only(report)["map"]["iou"] == pytest.approx(iou)
    assert result.code == (0 if iou >= 0.999 else 1)
    flag = cli("validate", ref, conv, "--no-speed", "--map-threshold", "0.5", "--min-iou", "0.5")
    assert flag.code == 0 and "at > 0.5" in flag.stdout


def test_what_counts_as_a_map():
    from autocast_onnx.validate.maps import map_kind

    rng = np.random.default_rng(0)
    unit = rng.random((2, 1, 8, 8)).astype(np.float32)
    assert map_kind("out", unit, by_name=True) == "shape"
    assert map_kind("out", unit[:, 0], by_name=True) == "shape"  # [N, H, W]
    assert map_kind("out", unit * 3 - 1, by_name=True) is None  # logits, not probabilities
    assert map_kind("heatmap", rng.random((2, 5)).astype(np.float32), by_name=True) == "name"
    assert map_kind("features", rng.random((2, 5)).astype(np.float32), by_name=True) is None
    assert map_kind("out", rng.random((2, 3, 8, 8)).astype(np.float32), by_name=True) is None  # three channels
    # a softmax over the last axis is class scores, whatever its shape; a map named "prob" is a map
    soft = np.exp(unit) / np.exp(unit).sum(-1, keepdims=True)
    stats = OutputStats("out")
    stats.add(soft, soft)
    assert stats.summary()["class_scores"] == "probabilities" and stats.summary()["map"] is None
    named = OutputStats("prob")
    named.add(unit[:, 0], unit[:, 0])
    assert named.summary()["class_scores"] is None and named.summary()["map"]["kind"] == "shape"


def test_an_output_threshold_of_its_own_applies_to_a_map_beside_its_iou():
    stats = OutputStats("prob_map")
    ref = np.linspace(0, 1, 400, dtype=np.float32).reshape(1, 1, 20, 20)
    out = ref.copy()
    out[0, 0, 0, :3] += 0.3  # three dark pixels brighten, none crosses 0.5
    stats.add(ref, out)
    summary = stats.summary()
    assert summary["map"]["iou"] == 1.0 and verdict(summary, Thresholds()) == (True, [])
    own = Thresholds(per_output={"prob_map": {"rtol": 0.1}})
    passed, failures = verdict(summary, own)
    assert not passed and failures[0].startswith("relative error 0.3 > rtol 0.1")


# ---------------------------------------------------------------------------------------------- near zero


def test_the_relative_error_of_a_near_zero_output_is_measured_against_the_types_resolution():
    """The case of the issue: a map far in its sigmoid tail (max 6.5e-5) off by 6e-6 on random
    inputs is 9 % off relative to its own maximum, but 0.6 % of fp16's resolution at 1."""
    ref = np.array([[6.5e-5, -1e-5, 3e-5]], np.float32)
    out = ref + np.array([[6e-6, 0.0, 0.0]], np.float32)
    stats = OutputStats("y")
    stats.add(ref, out)
    summary = stats.summary()
    assert summary["relative_scale"] == FP16_EPS
    assert summary["relative_error"] == pytest.approx(6e-6 / 2.0**-10, rel=1e-3)
    assert verdict(summary, Thresholds()) == (True, [])
    # rtol then bounds the absolute error at rtol x 2^-10, and says so
    worse = OutputStats("y")
    worse.add(ref, ref + np.array([[2e-5, 0.0, 0.0]], np.float32))
    passed, failures = verdict(worse.summary(), Thresholds())
    assert not passed and "the low-precision resolution at 1: max |reference| 6.5e-05 is below it" in failures[0]
    # above the floor the relative error is relative to the reference, as before
    big = OutputStats("y")
    big.add(ref * 1e3, (ref + np.array([[6e-6, 0, 0]], np.float32)) * 1e3)
    assert big.summary()["relative_error"] == pytest.approx(6e-6 / 6.5e-5, rel=1e-3)


def test_bf16_conversions_measure_against_bf16s_resolution():
    near_zero = parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            a = MatMul(x, w)
            y = Mul(a, tiny)
        }""",
        w=np.eye(8, dtype=np.float32) * 3,
        tiny=np.array(1e-6, np.float32),
    )
    converted = autocast_onnx.convert(near_zero, precision="bf16").model
    report = validate(near_zero, converted, NO_SPEED)
    out = only(report)
    assert out["relative_scale"] == BF16_EPS and out["max_abs_reference"] < BF16_EPS
    from autocast_onnx.report.validation import validation_text

    assert "rel is max abs / 0.00781, the low-precision resolution at 1: max |reference|" in validation_text(report)


# ------------------------------------------------------------------------------- one output's own thresholds


def two_outputs(noise: float):
    """Two outputs x * (1 + noise): a relative error of `noise`, a cosine of exactly 1."""
    return parse(
        """
        g (float[2,8] x) => (float[2,8] a, float[2,8] b) {
            a = Mul(x, n)
            b = Mul(x, n)
        }""",
        n=np.array(1.0 + noise, np.float32),
    )


def test_rtol_for_one_output_on_the_command_line_the_configuration_and_the_api(isolated_cwd, tmp_path):
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(two_outputs(0.0), ref)
    onnx.save(two_outputs(0.05), conv)
    failing = cli("validate", ref, conv, "--no-speed", "--report-json", tmp_path / "r.json")
    assert failing.code == 1
    report = {o["name"]: o for o in json.loads((tmp_path / "r.json").read_text())["outputs"]}
    assert not report["a"]["passed"] and not report["b"]["passed"]
    one = cli("validate", ref, conv, "--no-speed", "--rtol", "a=0.5", "--report-json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    by_name = {o["name"]: o for o in report["outputs"]}
    assert one.code == 1 and by_name["a"]["passed"] and not by_name["b"]["passed"]
    assert report["thresholds"]["outputs"] == {"a": {"rtol": 0.5}} and report["thresholds"]["rtol"] == 0.01
    both = cli("validate", ref, conv, "--no-speed", "--rtol", "a=0.5", "--rtol", "0.5", "--min-cosine", "b=0.9")
    assert both.code == 0, both.stdout
    (isolated_cwd / "autocast-onnx.toml").write_text("rtol = 0.5\n[outputs.a]\nrtol = 0.001\n")
    configured = {o["name"]: o["passed"] for o in validate_report(ref, conv)}
    assert configured == {"a": False, "b": True}
    api = autocast_onnx.validate(ref, conv, speed=False, rtol={"a": 0.5, "b": 0.5})
    assert api.passed
    mixed = autocast_onnx.validate(ref, conv, speed=False, rtol=["0.5", "a=0.001"])
    assert [o.passed for o in mixed.outputs] == [False, True]


def validate_report(ref, conv):
    result = cli("validate", ref, conv, "--no-speed", "--report-json", "-")
    return json.loads(result.stdout)["outputs"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--rtol", "nope=0.1"), "--rtol nope=... (or [outputs.nope] in the configuration) names no output"),
        (("--rtol", "a=abc"), "--rtol takes a number, or NAME=NUMBER for one output, not 'a=abc'"),
        (("--rtol", "=0.1"), "names no output"),
        (("--min-iou", "a=2"), "--min-iou a= must be a finite number from 0 to 1, not 2.0"),
        (("--rtol", "0.1", "--rtol", "0.2"), "--rtol is given twice without an output name"),
        (("--atol", "a=0.1", "--atol", "a=0.2"), "--atol is given twice for output 'a'"),
    ],
)
def test_bad_per_output_thresholds_are_one_error_line(tmp_path, args, message):
    ref = tmp_path / "ref.onnx"
    onnx.save(two_outputs(0.0), ref)
    result = cli("validate", ref, ref, "--no-speed", *args)
    assert result.code == 2 and message in result.error_line()


def test_bad_configuration_of_outputs_is_refused(isolated_cwd, tmp_path):
    ref = tmp_path / "ref.onnx"
    onnx.save(two_outputs(0.0), ref)
    for text, message in [
        ("[outputs.a]\ncolour = 1\n", "unknown key 'colour' in outputs.a"),
        ("[outputs.a]\nrtol = -1\n", "outputs.a.rtol must be a finite number >= 0"),
        ("outputs = 3\n", "outputs must hold one table per output name"),
        ("compare-padded = 1\n", "compare-padded must be true or false"),
    ]:
        (isolated_cwd / "autocast-onnx.toml").write_text(text)
        result = cli("validate", ref, ref, "--no-speed")
        assert result.code == 2 and message in result.error_line(), text


def test_the_builder_reads_numbers_mappings_and_text_alike():
    for given in (0.05, "0.05", ["0.05"], ("0.05",)):
        assert validate_options(rtol=given).thresholds.rtol == 0.05
    built = validate_options(rtol={"a": 0.2}, min_iou=("b=0.9", "0.95"), map_threshold="b=0.3").thresholds
    assert built.rtol == 0.01 and built.min_iou == 0.95 and built.map_threshold == 0.5
    assert built.per_output == {"a": {"rtol": 0.2}, "b": {"min_iou": 0.9, "map_threshold": 0.3}}
    assert built.for_output("b").map_threshold == 0.3 and built.for_output("a").map_threshold == 0.5
    with pytest.raises(AutocastError, match="rtol= must be a finite number"):
        autocast_onnx.validate(sigmoid_map(0.0), sigmoid_map(0.0), rtol=-1)
