"""`autocast-onnx validate` and `convert --validate`: metrics and verdicts, input generation and
.npz inputs, exit codes, pyproject settings, JSON/HTML reports, devices, and the example models."""

import html
import json
import math
import re
import sys

import numpy as np
import onnx
import pytest
from helpers import F32, init, model, tensor
from onnx import helper
from validate_helpers import DATA, MODELS, ROOT, cli, cli_proc

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.inputs import DEFAULT_BATCH, attention_mask, describe_inputs, generate, plan_inputs
from autocast_onnx.validate.metrics import OutputStats, Thresholds, verdict

RESNET = MODELS / "resnet_tiny.onnx"
BERT = MODELS / "bert_tiny.onnx"
DIGITS = MODELS / "digits_cnn.onnx"
FAST = ("--speed", "--iterations", "2", "--warmup", "0")  # timed (on CPU only when asked), briefly
NO_THRESHOLDS = Thresholds(atol=None, rtol=None, min_cosine=None, min_top1=None)


def has_cuda():
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.fixture(scope="module")
def resnet16(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "resnet_tiny.fp16.onnx"
    onnx.save(autocast_onnx.convert(RESNET).model, out)
    return out


@pytest.fixture(scope="module")
def bert16(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "bert_tiny.fp16.onnx"
    onnx.save(autocast_onnx.convert(BERT).model, out)
    return out


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Settings come from the nearest pyproject.toml: run every test from a folder without one."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def stats_of(ref, out, name="out", **kw):
    s = OutputStats(name, **kw)
    s.add(np.asarray(ref, np.float32), np.asarray(out, np.float32))
    return s.summary()


# ---------------------------------------------------------------------------------------------- metrics


def test_errors_on_hand_made_arrays():
    ref = np.array([[1.0, -2.0, 3.0], [0.0, 4.0, -1.0]])
    out = np.array([[1.0, -2.5, 2.0], [0.0, 4.0, -1.25]])
    s = stats_of(ref, out)
    assert s["elements"] == 6 and s["shape"] == [2, 3]
    assert s["max_abs_error"] == pytest.approx(1.0)
    assert s["mean_abs_error"] == pytest.approx((0.5 + 1.0 + 0.25) / 6)
    assert s["max_abs_reference"] == pytest.approx(4.0)
    assert s["relative_error"] == pytest.approx(1.0 / 4.0)
    r, o = ref.ravel(), out.ravel()
    assert s["cosine"] == pytest.approx(r @ o / np.linalg.norm(r) / np.linalg.norm(o))
    assert s["new_nan"] == s["new_inf"] == s["reference_nonfinite"] == 0


def test_relative_error_is_relative_to_the_largest_reference_value():
    """Near zero an elementwise relative error explodes; the metric divides by max |reference|."""
    ref = np.array([1e-3, -2e-3, 0.0, 1e-9])
    out = ref + np.array([1e-5, 0.0, 1e-5, 1e-5])
    s = stats_of(ref, out)
    assert s["relative_error"] == pytest.approx(1e-5 / 2e-3, rel=1e-3)
    assert math.isfinite(s["relative_error"])
    # scale invariant
    assert stats_of(ref * 1e4, out * 1e4)["relative_error"] == pytest.approx(s["relative_error"], rel=1e-3)


def test_cosine():
    assert stats_of([1, 2, 3], [2, 4, 6])["cosine"] == pytest.approx(1.0)
    assert stats_of([1, 0], [0, 1])["cosine"] == pytest.approx(0.0)
    assert stats_of([1, 1], [-1, -1])["cosine"] == pytest.approx(-1.0)
    assert stats_of([0, 0], [0, 0])["cosine"] == pytest.approx(1.0)
    assert stats_of([1, 2], [0, 0])["cosine"] == pytest.approx(0.0)


def test_new_nan_and_inf_counted_where_the_reference_is_finite():
    ref = np.array([1.0, np.nan, 2.0, 3.0, -np.inf, 5.0])
    out = np.array([np.nan, np.nan, np.inf, -np.inf, -np.inf, 6.0])
    s = stats_of(ref, out)
    assert s["new_nan"] == 1  # index 0 (index 1 was NaN already)
    assert s["new_inf"] == 2  # indexes 2 and 3 (index 4 was -inf already)
    assert s["reference_nonfinite"] == 2
    # the error statistics cover the positions where both are finite
    assert s["max_abs_error"] == pytest.approx(1.0) and s["elements"] == 6
    passed, failures = verdict(s, NO_THRESHOLDS)
    assert not passed and "1 NaN and 2 inf" in failures[0]


def test_nan_where_the_reference_is_inf_is_new():
    """A NaN is new wherever the reference has no NaN, even where it holds inf (inf - inf
    style NaN is a failure the reference does not show); an inf where the reference has inf
    is not new."""
    s = stats_of([np.inf, -np.inf, 1.0, np.inf], [np.nan, np.nan, 1.0, np.inf])
    assert s["reference_nonfinite"] == 3
    assert s["new_nan"] == 2 and s["new_inf"] == 0
    assert not verdict(s, NO_THRESHOLDS)[0]


def test_statistics_accumulate_over_batches():
    s = OutputStats("out")
    s.add(np.array([1.0, 2.0], np.float32), np.array([1.5, 2.0], np.float32))
    s.add(np.array([10.0, -4.0, 0.0], np.float32), np.array([10.0, -4.0, 0.25], np.float32))
    out = s.summary()
    assert out["elements"] == 5
    assert out["max_abs_error"] == pytest.approx(0.5)
    assert out["mean_abs_error"] == pytest.approx(0.75 / 5)
    assert out["relative_error"] == pytest.approx(0.5 / 10.0)


def test_integer_outputs_must_match_exactly():
    same = OutputStats("ids")
    same.add(np.array([1, 2, 3]), np.array([1, 2, 3]))
    assert verdict(same.summary(), Thresholds())[0]
    diff = OutputStats("ids")
    diff.add(np.array([1, 2, 3]), np.array([1, 2, 4]))
    assert not verdict(diff.summary(), Thresholds())[0]


def class_rows():
    """4 rows of 6 distinct scores. Row 0: the top-5 set loses one class, top-1 unchanged; row 3:
    top-1 changes, the top-5 set does not; rows 1-2 unchanged."""
    ref = np.array([[6.0, 5, 4, 3, 2, 1], [1.0, 6, 2, 3, 4, 5], [2.0, 1, 6, 3, 4, 5], [1.0, 2, 3, 6, 5, 4]], np.float32)
    out = ref.copy()
    out[0, 4], out[0, 5] = 0.0, 3.5
    out[3, 3], out[3, 4] = 5.0, 6.0
    return ref, out


@pytest.mark.parametrize("name", ["logits", "probs", "class_scores", "Prediction"])
def test_top1_and_topk_for_outputs_named_like_class_scores(name):
    ref, out = class_rows()
    s = stats_of(ref, out, name=name)
    assert s["top1"] == pytest.approx(3 / 4)
    assert s["k"] == 5
    assert s["topk"] == pytest.approx((4 / 5 + 1 + 1 + 1) / 4)


def test_top1_only_for_class_outputs():
    ref, out = class_rows()
    hidden = stats_of(ref, out, name="last_hidden_state")
    assert hidden["top1"] is None and hidden["topk"] is None
    assert verdict(hidden, Thresholds(rtol=None, min_cosine=None, min_top1=0.99))[0]
    forced = stats_of(ref, out, name="last_hidden_state", class_scores=True)
    assert forced["top1"] == pytest.approx(3 / 4)
    refused = stats_of(ref, out, name="logits", class_scores=False)
    assert refused["top1"] is None


def test_top1_treats_nan_as_lowest():
    ref = np.array([[1.0, 2.0, 0.0]], np.float32)
    out = np.array([[np.nan, 2.0, 0.0]], np.float32)
    assert stats_of(ref, out, name="logits")["top1"] == 1.0


BASE = {"max_abs_error": 0.5, "relative_error": 0.05, "cosine": 0.99, "top1": 0.9, "new_nan": 0, "new_inf": 0}


@pytest.mark.parametrize(
    "key, failing, passing, message",
    [
        ("atol", 0.1, 1.0, "max abs error"),
        ("rtol", 0.01, 0.1, "relative error"),
        ("min_cosine", 0.999, 0.9, "cosine"),
        ("min_top1", 0.95, 0.5, "top-1"),
    ],
)
def test_each_threshold_fails_on_its_own(key, failing, passing, message):
    only = {"atol": None, "rtol": None, "min_cosine": None, "min_top1": None}
    passed, failures = verdict(BASE, Thresholds(**{**only, key: failing}))
    assert not passed and len(failures) == 1 and message in failures[0]
    assert verdict(BASE, Thresholds(**{**only, key: passing})) == (True, [])
    # every other threshold at a passing value does not hide it
    loose = {"atol": 1.0, "rtol": 0.1, "min_cosine": 0.9, "min_top1": 0.5}
    passed, failures = verdict(BASE, Thresholds(**{**loose, key: failing}))
    assert not passed and len(failures) == 1


def test_top1_threshold_ignored_without_top1():
    assert verdict({**BASE, "top1": None}, Thresholds(min_top1=0.99, rtol=None, min_cosine=None))[0]


def test_default_thresholds():
    t = Thresholds()
    assert t.as_dict() == {
        "atol": None,
        "rtol": 0.01,
        "min_cosine": 0.999,
        "min_top1": 0.99,
        "min_iou": 0.99,
        "map_threshold": 0.5,
        "outputs": {},
    }


def test_class_output_option_scores_a_named_output(bert16):
    report = validate(BERT, bert16, ValidateOptions(speed=False, class_outputs=["pooler_output"]))
    by_name = {o["name"]: o for o in report["outputs"]}
    assert by_name["pooler_output"]["top1"] is not None and by_name["pooler_output"]["k"] == 5
    assert by_name["last_hidden_state"]["top1"] is None


# ----------------------------------------------------------------------------------------------- inputs


def test_generated_inputs_respect_dims_and_report_defaults(bert16):
    report = validate(BERT, bert16, ValidateOptions(speed=False, dims={"sequence": 8}))
    inputs = report["inputs"]
    assert inputs["source"] == "generated"
    assert inputs["dims"] == {"sequence": 8, "batch": DEFAULT_BATCH}
    assert inputs["dim_defaults"] == ["batch"]
    assert {s["name"]: s["shape"] for s in inputs["specs"]} == {
        "input_ids": [DEFAULT_BATCH, 8],
        "attention_mask": [DEFAULT_BATCH, 8],
        "token_type_ids": [DEFAULT_BATCH, 8],
    }
    assert {s["dtype"] for s in inputs["specs"]} == {"int64"}
    assert {o["name"]: o["shape"] for o in report["outputs"]} == {
        "last_hidden_state": [DEFAULT_BATCH, 8, 64],
        "pooler_output": [DEFAULT_BATCH, 64],
    }

    report = validate(BERT, bert16, ValidateOptions(speed=False, dims={"batch": 3, "sequence": 5}))
    assert report["inputs"]["dim_defaults"] == []
    assert report["outputs"][0]["shape"] == [3, 5, 64]


def test_cli_prints_dims_and_defaults(bert16):
    r = cli("validate", BERT, bert16, "--no-speed", "--dim", "sequence=8")
    assert r.code == 0, r.stdout + r.stderr
    assert f"batch={DEFAULT_BATCH} (default)" in r.stdout and "sequence=8" in r.stdout
    assert "sequence=8 (default)" not in r.stdout


def test_token_ids_stay_within_the_embedding_tables():
    specs = {s.name: s for s in describe_inputs(onnx.load(BERT))}
    assert specs["input_ids"].vocab == 1000
    assert specs["token_type_ids"].vocab == 2
    plan = plan_inputs(list(specs.values()), {"batch": 4, "sequence": 64})
    for seed in range(3):
        feeds = generate(plan, seed=seed)
        ids, types = feeds["input_ids"], feeds["token_type_ids"]
        assert ids.shape == (4, 64) and ids.dtype == np.int64
        assert ids.min() >= 0 and ids.max() < 1000
        assert ids.max() >= 500  # uses the table, not a small default range
        assert set(np.unique(types)) == {0, 1}


def test_attention_mask_has_padded_and_fully_masked_rows():
    specs = describe_inputs(onnx.load(BERT))
    mask = generate(plan_inputs(specs, {"batch": 4, "sequence": 12}))["attention_mask"]
    assert mask.dtype == np.int64 and set(np.unique(mask)) == {0, 1}
    assert mask[0].all()  # a full row
    assert mask[1, 0] == 1 and not mask[1].all()  # a padded row: ones then zeros
    assert np.all(np.diff(mask[1]) <= 0)
    assert not mask[-1].any()  # a fully masked row
    two = attention_mask((2, 12))
    assert two[0].all() and two[1, 0] == 1 and not two[1].all()  # batch 2: no fully masked row


def test_bert_validates_with_padded_and_fully_masked_rows(bert16):
    report = validate(BERT, bert16, ValidateOptions(speed=False, dims={"batch": 3, "sequence": 8}))
    assert report["passed"], report["outputs"]
    assert all(o["new_nan"] == 0 and o["new_inf"] == 0 for o in report["outputs"])


def test_input_range_for_ints_and_floats():
    specs = describe_inputs(onnx.load(BERT))
    feeds = generate(
        plan_inputs(specs, {"batch": 4, "sequence": 16}, {"input_ids": (5.0, 10.0), "attention_mask": (1.0, 2.0)})
    )
    assert feeds["input_ids"].min() >= 5 and feeds["input_ids"].max() < 10
    assert len(np.unique(feeds["input_ids"])) > 1
    assert np.all(feeds["attention_mask"] == 1)  # a range given for a mask replaces the pattern
    pix = generate(plan_inputs(describe_inputs(onnx.load(RESNET)), {}, {"pixel_values": (-3.0, -2.5)}))
    values = pix["pixel_values"]
    assert values.dtype == np.float32 and values.shape == (DEFAULT_BATCH, 3, 32, 32)
    assert values.min() >= -3.0 and values.max() <= -2.5


def test_input_range_through_validate(resnet16):
    report = validate(RESNET, resnet16, ValidateOptions(speed=False, ranges={"pixel_values": (0.0, 1.0)}))
    assert report["inputs"]["ranges"] == {"pixel_values": [0.0, 1.0]}
    assert report["passed"]


def test_npz_file_as_inputs(resnet16, tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32))  # float64: cast to the input type
    np.savez(tmp_path / "batch.npz", pixel_values=x, unrelated=np.zeros(2))
    report = validate(RESNET, resnet16, ValidateOptions(speed=False, inputs=str(tmp_path / "batch.npz")))
    assert report["inputs"]["source"] == str(tmp_path / "batch.npz")
    assert report["inputs"]["batches"] == 1
    assert report["inputs"]["specs"] == [{"name": "pixel_values", "dtype": "fp32", "shape": [3, 3, 32, 32]}]
    assert report["outputs"][0]["elements"] == 30 and report["passed"]


def test_npz_folder_aggregates_batches(resnet16, tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "batches"
    folder.mkdir()
    singles = []
    for k, batch in enumerate((2, 3)):
        path = folder / f"b{k}.npz"
        np.savez(path, pixel_values=rng.standard_normal((batch, 3, 32, 32)).astype(np.float32))
        singles.append(validate(RESNET, resnet16, ValidateOptions(speed=False, inputs=str(path)))["outputs"][0])
    (folder / "notes.txt").write_text("ignored")
    report = validate(RESNET, resnet16, ValidateOptions(speed=False, inputs=str(folder)))
    out = report["outputs"][0]
    assert report["inputs"]["batches"] == 2 and report["inputs"]["source"] == str(folder)
    assert out["elements"] == 50
    assert out["max_abs_error"] == pytest.approx(max(s["max_abs_error"] for s in singles))
    assert out["mean_abs_error"] == pytest.approx(
        (singles[0]["mean_abs_error"] * 20 + singles[1]["mean_abs_error"] * 30) / 50
    )
    assert out["top1"] == pytest.approx((singles[0]["top1"] * 2 + singles[1]["top1"] * 3) / 5)


def test_npz_missing_input_is_an_input_error(resnet16, tmp_path):
    np.savez(tmp_path / "wrong.npz", pixels=np.zeros((2, 3, 32, 32), np.float32))
    with pytest.raises(AutocastError, match=r"missing input.*pixel_values"):
        validate(RESNET, resnet16, ValidateOptions(speed=False, inputs=str(tmp_path / "wrong.npz")))
    r = cli("validate", RESNET, resnet16, "--no-speed", "--inputs", tmp_path / "wrong.npz")
    assert r.code == 2 and "pixel_values" in r.error_line()


@pytest.mark.parametrize("kind", ["empty folder", "missing path", "not an npz"])
def test_bad_inputs_path_is_an_input_error(resnet16, tmp_path, kind):
    path = tmp_path / "in"
    if kind == "empty folder":
        path.mkdir()
    elif kind == "not an npz":
        path = tmp_path / "in.npz"
        path.write_text("not a zip")
    with pytest.raises(AutocastError):
        validate(RESNET, resnet16, ValidateOptions(speed=False, inputs=str(path)))
    r = cli("validate", RESNET, resnet16, "--no-speed", "--inputs", path)
    assert r.code == 2
    r.error_line()


@pytest.mark.parametrize(
    "args",
    [
        ("--dim", "batch"),
        ("--dim", "batch=x"),
        ("--dim", "batch=2.5"),
        ("--dim", "=3"),
        ("--dim", "batch=0"),
        ("--dim", "batch=-1"),
        ("--input-range", "pixel_values"),
        ("--input-range", "pixel_values=1"),
        ("--input-range", "pixel_values=1:"),
        ("--input-range", "pixel_values=a:b"),
        ("--input-range", "pixel_values=2:1"),
        ("--input-range", "pixel_values=1e:2"),
        ("--input-range", "pixel_values=.:1"),
        ("--input-range", "nope=0:1"),
    ],
    ids=lambda a: f"{a[0][2:]}:{a[1]}",
)
def test_bad_dim_and_input_range_exit_2_with_one_line(resnet16, args):
    r = cli("validate", RESNET, resnet16, "--no-speed", *args)
    line = r.error_line()
    assert r.code == 2
    assert args[0].lstrip("-").split("-")[0] in line  # names the option (dim / input)


def test_dim_naming_no_input_dimension_is_an_error(resnet16):
    """--input-range for an unknown input is refused; a --dim for no input dimension (a typo) should
    be too, rather than silently validating with the default."""
    r = cli("validate", RESNET, resnet16, "--no-speed", "--dim", "btach=4")
    assert r.code == 2
    assert "btach" in r.error_line()


# -------------------------------------------------------------------------------------- CLI exit codes


def test_validate_own_conversion_passes(resnet16):
    r = cli("validate", RESNET, resnet16, *FAST)
    assert r.code == 0, r.stdout + r.stderr
    assert "result: PASS" in r.stdout
    assert re.search(r"^\s+logits\s.*\bpass$", r.stdout, re.MULTILINE)
    assert r.stderr == ""


@pytest.mark.slow
def test_validate_as_a_process(resnet16, isolated_cwd):
    ok = cli_proc("validate", RESNET, resnet16, "--no-speed", "-q", cwd=isolated_cwd)
    assert ok.code == 0 and ok.stdout == "" and ok.stderr == ""
    fail = cli_proc("validate", RESNET, resnet16, "--no-speed", "--atol", "1e-9", cwd=isolated_cwd)
    assert fail.code == 1 and "result: FAIL" in fail.stdout and "Traceback" not in fail.stderr
    missing = cli_proc("validate", RESNET, isolated_cwd / "nope.onnx", cwd=isolated_cwd)
    assert missing.code == 2 and "nope.onnx" in missing.error_line()


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--atol", "1e-9", "max abs error"),
        ("--rtol", "1e-9", "relative error"),
        ("--min-cosine", "1", "cosine"),  # fp16 rounding leaves the cosine just below 1
    ],
)
def test_threshold_failure_exits_1(resnet16, flag, value, message):
    r = cli("validate", RESNET, resnet16, "--no-speed", flag, value)
    assert r.code == 1, r.stdout + r.stderr
    assert "result: FAIL" in r.stdout and message in r.stdout
    assert r.stderr == ""


def test_top1_threshold_failure_exits_1(tmp_path):
    """The conversion keeps resnet's top-1 (so --min-top1 1 passes there); a 'converted' model
    with negated class scores fails --min-top1 alone (the other thresholds are switched off)."""
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    paths = []
    for name, weights in (("ref", w), ("flipped", -w)):
        m = model(
            [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc")],
            [tensor("x", F32, [2, 4])],
            [tensor("logits", F32, [2, 4])],
            [init("w", weights)],
        )
        paths.append(tmp_path / f"{name}.onnx")
        onnx.save(m, paths[-1])
    loose = ("--rtol", "1e9", "--min-cosine", "-1")
    assert cli("validate", *paths, "--no-speed", *loose, "--min-top1", "0").code == 0
    r = cli("validate", *paths, "--no-speed", *loose, "--min-top1", "1")
    assert r.code == 1, r.stdout + r.stderr
    assert "result: FAIL" in r.stdout and "top-1" in r.stdout
    assert r.stderr == ""


def two_models(tmp_path, in_name="x", out_name="y"):
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    m = model(
        [helper.make_node("MatMul", [in_name, "w"], [out_name], name="fc")],
        [tensor(in_name, F32, [2, 4])],
        [tensor(out_name, F32, [2, 4])],
        [init("w", w)],
    )
    path = tmp_path / f"{in_name}_{out_name}.onnx"
    onnx.save(m, path)
    return path


@pytest.mark.parametrize(
    "case",
    [
        "missing reference",
        "missing converted",
        "not onnx",
        "different inputs",
        "different outputs",
        "unknown class output",
        "missing report folder",
    ],
)
def test_usage_and_input_errors_exit_2(tmp_path, case):
    ref = two_models(tmp_path)
    conv = autocast_onnx.convert(str(ref)).model
    conv_path = tmp_path / "conv.onnx"
    onnx.save(conv, conv_path)
    extra = []
    if case == "missing reference":
        ref = tmp_path / "absent.onnx"
    elif case == "missing converted":
        conv_path = tmp_path / "absent.onnx"
    elif case == "not onnx":
        conv_path = tmp_path / "text.onnx"
        conv_path.write_text("this is not a model")
    elif case == "different inputs":
        conv_path = two_models(tmp_path, in_name="z")
    elif case == "different outputs":
        conv_path = two_models(tmp_path, out_name="w_out")
    elif case == "unknown class output":
        extra = ["--class-output", "nope"]
    elif case == "missing report folder":
        extra = ["--report-json", tmp_path / "absent" / "r.json"]
    r = cli("validate", ref, conv_path, "--no-speed", *extra)
    assert r.code == 2, r.stdout + r.stderr
    line = r.error_line()
    if case == "unknown class output":
        assert "nope" in line
    if case in ("missing reference", "missing converted"):
        assert "absent.onnx" in line
    assert not (tmp_path / "absent").exists()


# ------------------------------------------------------------------------------------ pyproject settings


def write_pyproject(folder, body):
    (folder / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.autocast-onnx]\n' + body)


@pytest.mark.slow
def test_pyproject_threshold_applies_and_flag_overrides(resnet16, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    write_pyproject(project, "atol = 1e-9\n")
    r = cli_proc("validate", RESNET, resnet16, "--no-speed", cwd=project)
    assert r.code == 1, r.stdout + r.stderr
    assert "atol 1e-09" in r.stdout and "max abs error" in r.stdout
    r = cli_proc("validate", RESNET, resnet16, "--no-speed", "--atol", "1", cwd=project)
    assert r.code == 0, r.stdout + r.stderr
    assert "atol 1," in r.stdout


def test_pyproject_in_a_parent_folder_with_hyphenated_keys(resnet16, tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "sub" / "deeper").mkdir(parents=True)
    write_pyproject(project, "min-cosine = 1.0\nrtol = 0.5\n")
    monkeypatch.chdir(project / "sub" / "deeper")
    report_path = tmp_path / "r.json"
    r = cli("validate", RESNET, resnet16, "--no-speed", "--report-json", report_path)
    assert r.code == 1
    thresholds = json.loads(report_path.read_text())["thresholds"]
    assert thresholds == {
        "atol": None,
        "rtol": 0.5,
        "min_cosine": 1.0,
        "min_top1": 0.99,
        "min_iou": 0.99,
        "map_threshold": 0.5,
        "outputs": {},
    }
    assert cli("validate", RESNET, resnet16, "--no-speed", "--min-cosine", "0.9").code == 0


@pytest.mark.parametrize(
    "body, word",
    [
        ("tolerance = 1\n", "tolerance"),
        ('atol = "small"\n', "atol"),
        ("atol = true\n", "atol"),
        ("atol = [1\n", "TOML"),
    ],
)
def test_bad_pyproject_settings_exit_2(resnet16, tmp_path, monkeypatch, body, word):
    project = tmp_path / "project"
    project.mkdir()
    write_pyproject(project, body)
    monkeypatch.chdir(project)
    r = cli("validate", RESNET, resnet16, "--no-speed")
    assert r.code == 2
    line = r.error_line()
    assert word in line and "pyproject.toml" in line


def test_pyproject_without_the_section_changes_nothing(resnet16, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    monkeypatch.chdir(tmp_path)
    assert cli("validate", RESNET, resnet16, "--no-speed").code == 0


# ------------------------------------------------------------------------------------ convert --validate


def test_convert_then_validate_on_digits(tmp_path):
    data = np.load(DATA / "digits_test.npz")
    np.savez(tmp_path / "digits.npz", pixels=data["x"][:64])
    out = tmp_path / "digits.fp16.onnx"
    r = cli("convert", DIGITS, "-o", out, "--validate", "--inputs", tmp_path / "digits.npz", *FAST)
    assert r.code == 0, r.stdout + r.stderr
    assert out.is_file()
    onnx.checker.check_model(onnx.load(out), full_check=True)
    text = r.stdout
    # the conversion summary, then the validation table
    assert "converted to fp16" in text and "casts added" in text
    assert text.index("casts added") < text.index("validate:")
    assert f"inputs: {tmp_path / 'digits.npz'}, 1 batch(es)" in text
    assert re.search(r"^\s+probs\s.*\s1\.000\s.*\bpass$", text, re.MULTILINE)
    assert "speed (cpu, batch 64" in text
    assert text.rstrip().endswith("result: PASS")


def test_convert_validate_failure_exits_1_and_keeps_the_file(tmp_path):
    out = tmp_path / "digits.fp16.onnx"
    r = cli("convert", DIGITS, "-o", out, "--validate", "--no-speed", "--atol", "1e-12")
    assert r.code == 1 and out.is_file() and "result: FAIL" in r.stdout


def test_convert_validate_refuses_bad_flags_before_writing(tmp_path):
    out = tmp_path / "digits.fp16.onnx"
    r = cli("convert", DIGITS, "-o", out, "--validate", "--dim", "batch")
    assert r.code == 2 and "--dim" in r.error_line()
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ reports

TOP_LEVEL = {
    "schema_version",
    "reference",
    "converted",
    "device",
    "numerics",
    "inputs",
    "thresholds",
    "outputs",
    "passed",
    "speed",
    "precision_by_op",
}


def strict_json(text):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_report_json(resnet16, tmp_path):
    path = tmp_path / "report.json"
    r = cli("validate", RESNET, resnet16, *FAST, "--report-json", path)
    assert r.code == 0
    report = strict_json(path.read_text())
    assert TOP_LEVEL <= set(report)
    assert report["schema_version"] == 1
    assert report["passed"] is True and "result: PASS" in r.stdout
    assert report["reference"]["path"] == str(RESNET) and report["converted"]["path"] == str(resnet16)
    assert report["reference"]["bytes"] == RESNET.stat().st_size
    assert report["converted"]["bytes"] == resnet16.stat().st_size
    assert report["device"] == "cpu" and report["numerics"] == "emulate"
    assert report["thresholds"] == {
        "atol": None,
        "rtol": 0.01,
        "min_cosine": 0.999,
        "min_top1": 0.99,
        "min_iou": 0.99,
        "map_threshold": 0.5,
        "outputs": {},
    }
    [out] = report["outputs"]
    assert out["name"] == "logits" and out["passed"] is True and out["failures"] == []
    assert out["shape"] == [DEFAULT_BATCH, 10] and out["top1"] == 1.0
    assert f"{out['max_abs_error']:.3g}" in r.stdout
    # precision by op type, read from the converted model
    conv_ops = {}
    for n in onnx.load(resnet16).graph.node:
        conv_ops[n.op_type] = conv_ops.get(n.op_type, 0) + 1
    assert {op: sum(v.values()) for op, v in report["precision_by_op"].items()} == conv_ops
    assert report["precision_by_op"]["Conv"] == {"fp16": 9}
    speed = report["speed"]
    for side in ("reference", "converted"):
        assert {"p50_ms", "p90_ms", "min_ms", "iterations", "warmup", "throughput_per_s"} <= set(speed[side])
        assert speed[side]["iterations"] == 2 and speed[side]["warmup"] == 0
        assert 0 < speed[side]["min_ms"] <= speed[side]["p50_ms"] <= speed[side]["p90_ms"]
    assert speed["speedup_p50"] == pytest.approx(speed["reference"]["p50_ms"] / speed["converted"]["p50_ms"])
    assert speed["batch_size"] == DEFAULT_BATCH and speed["device"] == "cpu"
    assert "CPU" in speed["note"]


def test_report_json_for_a_failure_matches_the_verdict(resnet16, tmp_path):
    path = tmp_path / "report.json"
    r = cli("validate", RESNET, resnet16, "--no-speed", "--atol", "1e-9", "--report-json", path)
    assert r.code == 1
    report = strict_json(path.read_text())
    assert report["passed"] is False and report["speed"] is None
    assert report["thresholds"]["atol"] == 1e-9
    assert report["outputs"][0]["passed"] is False
    assert any("atol" in f for f in report["outputs"][0]["failures"])


def latency_section(page):
    start = page.index("<h2>Latency</h2>")
    end = page.index("<h2>", start + 1)
    return html.unescape(page[start:end])


def test_report_html_is_self_contained(bert16, tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    path = folder / "report.html"
    r = cli("validate", BERT, bert16, *FAST, "--report-html", path)
    assert r.code == 0, r.stdout + r.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["report.html"]  # one file
    page = path.read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html>")
    # nothing fetched: the only URL allowed is the SVG namespace name, which is not a reference
    no_namespace = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in no_namespace and "https://" not in no_namespace
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE)
    assert not re.search(r"<link\b|<img\b|@import|url\(", page, re.IGNORECASE)
    assert page.count("<svg") >= 3
    for name in ("last_hidden_state", "pooler_output"):
        assert name in page
    assert "PASS" in page


def test_report_html_speed_section(resnet16, tmp_path):
    path = tmp_path / "report.html"
    assert cli("validate", RESNET, resnet16, *FAST, "--report-html", path).code == 0
    section = latency_section(path.read_text(encoding="utf-8"))
    assert "<svg" in section
    assert "p50" in section and "p90" in section
    assert "min" in section, "the HTML latency section does not show the min latency"
    assert re.search(r"Speed-up \(p50\): <b>[0-9.]+×</b>", section)
    assert "measured on CPU" in section


def test_report_html_without_speed_and_for_a_failure(resnet16, tmp_path):
    path = tmp_path / "report.html"
    r = cli("validate", RESNET, resnet16, "--no-speed", "--atol", "1e-9", "--report-html", path)
    assert r.code == 1
    page = path.read_text(encoding="utf-8")
    assert "not measured" in latency_section(page)
    assert "FAIL" in page and "atol" in page


def test_text_speed_section(resnet16):
    r = cli("validate", RESNET, resnet16, *FAST)
    assert re.search(
        rf"speed \(cpu, batch {DEFAULT_BATCH}, 2 runs after 0 warm-up\): reference p50 [0-9.]+ ms, "
        r"converted p50 [0-9.]+ ms -> speed-up [0-9.]+x",
        r.stdout,
    )
    assert re.search(r"p90 [0-9.]+ / [0-9.]+ ms, min [0-9.]+ / [0-9.]+ ms", r.stdout)
    assert "note: measured on CPU" in r.stdout
    assert "speed" not in cli("validate", RESNET, resnet16, "--no-speed").stdout


def test_report_for_in_memory_models():
    m = autocast_onnx.convert(str(RESNET)).model
    report = validate(onnx.load(RESNET), m, ValidateOptions(speed=False))
    assert report["reference"]["path"] is None and report["converted"]["path"] is None
    assert report["passed"]
    from autocast_onnx.report.html import validation_html
    from autocast_onnx.report.validation import validation_json, validation_text

    assert "result: PASS" in validation_text(report)
    strict_json(validation_json(report))
    assert "in memory" in validation_html(report)


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.onnx")), ids=lambda p: p.stem)
def test_example_models_pass_with_emulation(path):
    result = autocast_onnx.convert(str(path))
    report = validate(str(path), result.model, ValidateOptions(numerics="emulate", speed=False, batches=2))
    assert report["numerics"] == "emulate"
    assert report["passed"], [(o["name"], o["failures"]) for o in report["outputs"]]
    assert report["inputs"]["batches"] == 2
    assert all(o["new_nan"] == 0 and o["new_inf"] == 0 for o in report["outputs"])
    lowered = sum(v.get("fp16", 0) for v in report["precision_by_op"].values())
    assert lowered > 0


def test_example_models_are_all_covered():
    assert {p.stem for p in MODELS.glob("*.onnx")} >= {
        "bert_tiny",
        "gpt2_tiny",
        "resnet_tiny",
        "vit_tiny",
        "digits_cnn",
    }


# --------------------------------------------------------------------------------------------------- device


def test_device_cpu(resnet16):
    report = validate(RESNET, resnet16, ValidateOptions(device="cpu", speed=False))
    assert report["device"] == "cpu" and report["device_note"] is None and report["numerics"] == "emulate"
    r = cli("validate", RESNET, resnet16, "--no-speed", "--device", "cpu")
    assert r.code == 0 and "device: cpu" in r.stdout and "note:" not in r.stdout.split("inputs:")[0]


@pytest.mark.skipif(has_cuda(), reason="this onnxruntime has a CUDA provider")
def test_device_cuda_without_the_provider_exits_2(resnet16):
    r = cli("validate", RESNET, resnet16, "--no-speed", "--device", "cuda")
    assert r.code == 2
    assert "onnxruntime-gpu" in r.error_line()
    with pytest.raises(AutocastError, match="CUDA"):
        validate(RESNET, resnet16, ValidateOptions(device="cuda", speed=False))


@pytest.mark.skipif(has_cuda(), reason="this onnxruntime has a CUDA provider")
def test_device_auto_falls_back_to_cpu_and_says_so(resnet16, tmp_path):
    path = tmp_path / "r.json"
    r = cli("validate", RESNET, resnet16, "--no-speed", "--report-json", path)
    assert r.code == 0
    report = json.loads(path.read_text())
    assert report["device"] == "cpu" and report["numerics"] == "emulate"
    note = report["device_note"]
    assert note and "CUDA" in note and "CPU" in note
    assert f"note: {note}" in r.stdout


def test_numerics_plain_and_bad_numerics(resnet16):
    report = validate(RESNET, resnet16, ValidateOptions(numerics="plain", speed=False))
    assert report["numerics"] == "plain" and report["passed"]
    with pytest.raises(AutocastError, match="numerics"):
        validate(RESNET, resnet16, ValidateOptions(numerics="exact", speed=False))


# -------------------------------------------------------------------------------------------------- package


def test_validate_package_is_shipped():
    """Every subpackage of autocast_onnx must be listed in pyproject's [tool.setuptools] packages, or
    an installed (non-editable) autocast-onnx lacks it: `autocast-onnx validate` would fail to import."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "autocast_onnx").rglob("__init__.py")}
    assert found - listed == set()
