"""`--target` takes the verdict's task metrics (issue 28, item 3): iou= for probability maps, top1=
and cosine= on the positions validation compares (padding left out), and the accuracy search
drives down the error in those terms, so the nodes it keeps fp32 are the ones the verdict needs."""

import numpy as np
import onnx
import pytest
from helpers import parse
from validate_helpers import cli

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.metrics import OutputStats, Thresholds
from autocast_onnx.validate.options import parse_targets, validate_options


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Settings come from the nearest pyproject.toml: run every test from a folder without one."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)


def weights(seed: int, shape, scale: float = 30.0):
    """W1 and W2 = W1 + 0.01 R: x W1 - x W2 cancels to a few hundredths, which fp16 weights and
    products (off by about 0.01 at this scale) cannot hold."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal(shape) * scale).astype(np.float32)
    return w1, (w1 + 0.01 * rng.standard_normal(shape)).astype(np.float32)


def cancelling_map():
    """x [1, 1, 16, 16] -> prob_map = Sigmoid(x W1 - x W2): in fp16 the sign of many logits flips."""
    w1, w2 = weights(0, (16, 16))
    return parse(
        """
        g (float[1,1,16,16] x) => (float[1,1,16,16] prob_map) {
            [mm1] a = MatMul(x, w1)
            [mm2] b = MatMul(x, w2)
            [sub] d = Sub(a, b)
            [sig] prob_map = Sigmoid(d)
        }""",
        w1=w1,
        w2=w2,
    )


def padded_token_scores():
    """A token classifier whose fp16 damage sits only at padded positions: logits = x Wg + (1 -
    mask) 1000 (x W1 - x W2). At real positions the second term is exactly zero."""
    w1, w2 = weights(1, (16, 4))
    good = (np.random.default_rng(2).standard_normal((16, 4)) * 3).astype(np.float32)
    return parse(
        """
        g (float[batch,sequence,16] x, int64[batch,sequence] attention_mask) => (float[batch,sequence,4] logits) {
            [good] g = MatMul(x, wg)
            [mm1] a = MatMul(x, w1)
            [mm2] b = MatMul(x, w2)
            [sub] d = Sub(a, b)
            [scale] big = Mul(d, thousand)
            m = Cast<to = 1>(attention_mask)
            pad = Sub(one, m)
            u = Unsqueeze(pad, axes)
            [gate] noise = Mul(big, u)
            [sum] logits = Add(g, noise)
        }""",
        wg=good,
        w1=w1,
        w2=w2,
        thousand=np.array(1000.0, np.float32),
        one=np.array(1.0, np.float32),
        axes=np.array([2], np.int64),
    )


def test_the_target_keys_are_the_verdicts_metrics():
    goal = parse_targets(["iou=0.99,top1=1", "cosine=0.9999"])
    assert (goal.min_iou, goal.min_top1, goal.min_cosine, goal.rtol, goal.atol) == (0.99, 1.0, 0.9999, None, None)
    with pytest.raises(AutocastError, match="use atol=, rtol=, cosine=, top1= or iou="):
        parse_targets(["dice=0.9"])
    with pytest.raises(AutocastError, match="iou= must be a finite number from 0 to 1"):
        parse_targets(["iou=1.5"])
    measured = goal.measured_as(validate_options(map_threshold=["0.3", "prob_map=0.4"]).thresholds)
    assert measured.map_threshold == 0.3 and measured.for_output("prob_map").map_threshold == 0.4
    assert measured.for_output("prob_map").min_iou == 0.99


def test_the_search_error_of_a_map_judged_by_iou_is_one_minus_its_iou():
    from autocast_onnx.validate.metrics import search_error

    ref = np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 1, 10, 10)
    out = ref.copy()
    out[0, 0, 4, 9] = 0.9  # 0.4949... crosses 0.5
    stats = OutputStats("prob_map")
    stats.add(ref, out)
    iou = stats.summary()["map"]["iou"]
    assert iou == pytest.approx(50 / 51)
    assert search_error(stats, Thresholds(min_iou=0.99)) == pytest.approx(1 - iou)
    # without an IoU target the map is judged, and searched, by its errors
    assert search_error(stats, Thresholds(min_iou=None)) == pytest.approx(stats.relative_l2())


def test_an_iou_target_keeps_fp32_what_the_maps_masks_need():
    model = cancelling_map()
    plain = autocast_onnx.validate(model, autocast_onnx.convert(model).model, speed=False)
    assert plain.outputs[0].iou < 0.99 and not plain.passed
    result = autocast_onnx.convert(model, target="iou=0.99")
    log = result.plan.search
    assert log["kept"] and set(log["kept"]) & {"mm1", "mm2"}
    assert any("iou" in failure.lower() for failure in log["initial_failures"])
    after = autocast_onnx.validate(model, result.model, speed=False)
    assert after.outputs[0].iou >= 0.99


def test_a_top1_target_is_measured_on_the_unpadded_positions():
    model = padded_token_scores()
    masked = autocast_onnx.convert(model, target="top1=1.0").plan.search
    assert masked["kept"] == [] and masked["evaluations"] == 1
    whole = autocast_onnx.convert(model, target="top1=1.0", compare_padded=True).plan.search
    assert whole["kept"] and whole["initial_failures"]


def test_the_command_line_searches_for_an_iou_target_and_refuses_measure_options_without_one(tmp_path):
    source, out = tmp_path / "map.onnx", tmp_path / "map.fp16.onnx"
    onnx.save(cancelling_map(), source)
    result = cli("convert", source, "-o", out, "--target", "iou=0.99", "--map-threshold", "0.5", "--validate")
    assert result.code == 0, result.stdout + result.stderr
    assert "probability map (shape): IoU" in result.stdout and "--target search" in result.stdout + result.stderr
    refused = cli("convert", source, "-o", out, "--map-threshold", "0.3")
    assert refused.code == 2 and "--map-threshold has no effect without --validate or --target" in refused.error_line()
    refused = cli("convert", source, "-o", out, "--min-iou", "0.9")
    assert refused.code == 2 and "--min-iou has no effect without --validate" in refused.error_line()
