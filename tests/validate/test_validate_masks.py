"""Validation compares what a user reads (issue 28, item 1): positions an attention mask marks as
padding are left out of an output whose leading dimensions are the mask's, the report counts
them, and --compare-padded compares everything. Generated inputs hold padding, so this shows on
generated data too."""

import json

import numpy as np
import onnx
import pytest
from helpers import parse
from validate_helpers import ROOT, cli

import autocast_onnx
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

NO_SPEED = ValidateOptions(speed=False)
# generated batch 3 x sequence 16: row 0 full, row 1 padded from position 10, row 2 fully masked
PADDED = 6 + 16


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Settings come from the nearest pyproject.toml: run every test from a folder without one."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)


def encoder(noise_on_padding: bool, mask_type: str = "int64", mask_name: str = "attention_mask"):
    """x [batch, sequence, 4] and a mask -> y [batch, sequence, 4] and a pooled p [batch, 16].
    With `noise_on_padding`, y gains 0.5 at every padded position (as a conversion's noise would
    sit there) and nowhere else; p is the same in both."""
    padding = "pad = Cast<to = 1>(mask)" if "pad" in mask_name else "m = Cast<to = 1>(mask)\n pad = Sub(one, m)"
    noise = (
        f"""{padding}
            u = Unsqueeze(pad, axes)
            n = Mul(u, half)
            y = Add(x, n)"""
        if noise_on_padding
        else "y = Identity(x)"
    )
    text = f"""
        g (float[batch,sequence,4] x, {mask_type}[batch,sequence] {mask_name}, float[batch,sequence,16] h)
            => (float[batch,sequence,4] y, float[batch,16] p) {{
            mask = Identity({mask_name})
            {noise}
            p = ReduceMean<axes = [1], keepdims = 0>(h)
        }}"""
    return parse(text, one=np.array(1.0, np.float32), half=np.array(0.5, np.float32), axes=np.array([2], np.int64))


def outputs(report):
    return {o["name"]: o for o in report["outputs"]}


def test_padded_positions_are_left_out_and_counted():
    report = validate(encoder(False), encoder(True), NO_SPEED)
    y = outputs(report)["y"]
    assert report["passed"] and y["passed"] and y["max_abs_error"] == 0.0
    assert y["padding"] == {"mask": "attention_mask", "positions": PADDED, "elements": 4 * PADDED}
    assert y["elements"] == 3 * 16 * 4 - 4 * PADDED
    text = autocast_onnx.validate(encoder(False), encoder(True), speed=False).text()
    assert f"padded positions not compared: {PADDED} (attention_mask" in text


def test_compare_padded_compares_every_position():
    report = validate(encoder(False), encoder(True), ValidateOptions(speed=False, compare_padded=True))
    y = outputs(report)["y"]
    assert not report["passed"] and y["padding"] is None and y["max_abs_error"] == pytest.approx(0.5)
    assert report["compare_padded"] is True
    api = autocast_onnx.validate(encoder(False), encoder(True), speed=False, compare_padded=True)
    assert not api.passed


def test_the_command_line_flag_and_the_json_report(tmp_path):
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(encoder(False), ref)
    onnx.save(encoder(True), conv)
    masked = cli("validate", ref, conv, "--no-speed", "--report-json", tmp_path / "r.json")
    assert masked.code == 0, masked.stdout + masked.stderr
    assert outputs(json.loads((tmp_path / "r.json").read_text()))["y"]["padding"]["positions"] == PADDED
    everything = cli("validate", ref, conv, "--no-speed", "--compare-padded")
    assert everything.code == 1 and "relative error" in everything.stdout


def test_a_fixed_axis_that_matches_the_mask_by_chance_is_not_masked():
    """p [batch, 16] meets a mask [batch, sequence] of 16 positions: the 16 is the model's
    hidden size (declared fixed), so p is compared whole."""
    report = validate(encoder(False), encoder(True), NO_SPEED)
    assert outputs(report)["p"]["padding"] is None and outputs(report)["p"]["elements"] == 3 * 16


def test_a_padding_mask_marks_padding_with_one_and_is_generated_so():
    """PyTorch's key_padding_mask (bool, True = padding): generated with padding in its own
    convention, and the positions it marks are the ones left out."""
    ref, conv = encoder(False, "bool", "key_padding_mask"), encoder(True, "bool", "key_padding_mask")
    batch = generate(plan_inputs(describe_inputs(ref)))
    assert batch["key_padding_mask"].dtype == np.bool_ and batch["key_padding_mask"].sum() == PADDED
    report = validate(ref, conv, NO_SPEED)
    assert report["passed"] and outputs(report)["y"]["padding"]["positions"] == PADDED


def test_a_mask_input_that_is_not_zeros_and_ones_masks_nothing(tmp_path):
    report = validate(
        encoder(False), encoder(True), ValidateOptions(speed=False, ranges={"attention_mask": (0, 3)}, seed=1)
    )
    assert outputs(report)["y"]["padding"] is None


def test_token_scores_the_size_of_the_mask_rank_only_real_positions():
    """start_logits [batch, sequence] (a QA head) has the mask's own shape: its argmax runs over
    the real positions (padded ones out of the running in both models)."""
    text = """
        g (float[batch,sequence] x, int64[batch,sequence] attention_mask) => (float[batch,sequence] start_logits) {{
            m = Cast<to = 1>(attention_mask)
            pad = Sub(one, m)
            {body}
        }}"""
    ref = parse(text.format(body="start_logits = Identity(x)"), one=np.array(1.0, np.float32))
    conv = parse(
        text.format(body="big = Mul(pad, hundred)\n start_logits = Add(x, big)"),
        one=np.array(1.0, np.float32),
        hundred=np.array(100.0, np.float32),
    )
    masked = outputs(validate(ref, conv, NO_SPEED))["start_logits"]
    assert masked["class_scores"] == "name" and masked["top1"] == 1.0 and masked["passed"]
    whole = outputs(validate(ref, conv, ValidateOptions(speed=False, compare_padded=True)))["start_logits"]
    assert whole["top1"] < 1.0


def test_padding_keep_needs_the_leading_shape():
    from autocast_onnx.validate.masks import Padding

    pad = Padding(encoder(False))
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.int64)
    name, keep = pad.keep({"attention_mask": mask}, "y", np.zeros((2, 3, 4), np.float32))
    assert name == "attention_mask" and keep.tolist() == mask.astype(bool).tolist()
    assert pad.keep({"attention_mask": mask}, "y", np.zeros((3, 2, 4), np.float32)) is None
    assert Padding(encoder(False), compare_padded=True).keep({"attention_mask": mask}, "y", np.zeros((2, 3, 4))) is None


def test_an_output_that_is_all_padding_warns_and_strict_fails(tmp_path):
    batch = generate(plan_inputs(describe_inputs(encoder(False))))
    batch["attention_mask"][:] = 0
    np.savez(tmp_path / "b.npz", **batch)
    report = validate(encoder(False), encoder(True), ValidateOptions(speed=False, inputs=str(tmp_path / "b.npz")))
    assert outputs(report)["y"]["elements"] == 0
    assert "output y: every position is padding (attention_mask): nothing is compared" in report["warnings"][0]
    strict = ValidateOptions(speed=False, inputs=str(tmp_path / "b.npz"), strict=True)
    assert not validate(encoder(False), encoder(True), strict)["passed"]


def test_a_report_with_padding_matches_the_schema():
    import jsonschema

    from autocast_onnx.report.validation import validation_json

    schema = json.loads((ROOT / "docs" / "validate-report.schema.json").read_text())
    report = json.loads(validation_json(validate(encoder(False), encoder(True), NO_SPEED)))
    jsonschema.validate(report, schema)
    assert outputs(report)["y"]["padding"]["positions"] == PADDED
