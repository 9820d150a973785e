"""Error attribution (`autocast-onnx diagnose`): on graphs where the offending node is known by
construction, it is ranked first; a model against itself has no error; the CLI writes its
reports and refuses options that would do nothing."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, invoke
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.validate.diagnose import diagnose, relative_error


def offset_model() -> onnx.ModelProto:
    """A MatMul whose small result is shifted by +1000 and back (Add, Sub: follow ops that run in
    fp16 after the MatMul): fp16 values near 1000 are 0.5 apart, so the Sub's inputs lose the
    result's low bits and its output is badly wrong. Relu and Mul around it are harmless."""
    return parse(
        """
        offset (float[8,16] x) => (float[8,16] y) {
            [mm] h = MatMul(x, w)
            [relu] r = Relu(h)
            [shift] a = Add(r, big)
            [unshift] b = Sub(a, big)
            [scale] y = Mul(b, two)
        }""",
        w=randn([16, 16], scale=0.02),
        big=np.array(1000.0, np.float32),
        two=np.array(2.0, np.float32),
    )


def batch(seed: int = 0) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((8, 16)).astype(np.float32)}


def test_the_large_offset_subtraction_is_ranked_first():
    ref = offset_model()
    result = autocast_onnx.convert(ref)
    report = diagnose(ref, result.model, batch=batch(), plan=result.plan)
    nodes = {n["name"]: n for n in report["nodes"]}
    assert report["outputs"]["y"]["ranking"][0] == "unshift"
    assert nodes["unshift"]["introduced"] > 0.05  # its fp16 inputs near 1000 cannot hold h's bits
    for harmless in ("mm", "relu", "scale"):
        assert nodes[harmless]["introduced"] < 1e-3, harmless
    # what it passes on: the Mul after it receives the error and does not add to it
    assert nodes["scale"]["received"] == pytest.approx(nodes["unshift"]["produced"])
    assert report["outputs"]["y"]["error"] > 0.05
    assert nodes["unshift"]["category"] == "follow" and "low-precision" in nodes["unshift"]["reason"]


def test_a_model_against_itself_has_no_error():
    ref = offset_model()
    report = diagnose(ref, ref, batch=batch())
    assert report["outputs"]["y"]["error"] == 0.0
    assert all(n["introduced"] == n["received"] == n["produced"] == 0.0 for n in report["nodes"])
    assert all(n["precision"] == "fp32" for n in report["nodes"])


def test_an_fp32_node_introduces_nothing_but_shows_the_error_it_amplifies(tmp_path):
    ref = offset_model()
    rules = tmp_path / "keep.toml"
    rules.write_text('[[nodes]]\nmatch = "^unshift$"\nprecision = "fp32"\nwhy = "test"\n')
    fixed = autocast_onnx.convert(ref, rules=[rules])
    report = diagnose(ref, fixed.model, batch=batch())
    nodes = {n["name"]: n for n in report["nodes"]}
    assert nodes["unshift"]["precision"] == "fp32" and nodes["unshift"]["introduced"] == 0.0
    # kept fp32, the Sub still receives the Add's fp16 rounding near 1000 (small relative to 1000)
    # and turns it into a large relative error: the amplification points at the offset itself
    assert nodes["unshift"]["received"] < 1e-3
    assert nodes["unshift"]["amplification"] > 100
    profile = dict(map(tuple, report["profiles"]["y"]))
    assert max(profile.values()) == pytest.approx(report["outputs"]["y"]["error"], rel=1e-6)


def test_relative_error_is_zero_for_equal_and_infinite_for_new_nonfinite_values():
    a = np.array([1.0, -2.0, 3.0], np.float32)
    assert relative_error(a, a) == 0.0
    assert relative_error(np.array([1.0, np.inf, 3.0]), a) == float("inf")
    assert relative_error(a * 1.01, a) == pytest.approx(0.01, rel=1e-4)
    assert relative_error(np.array([np.nan]), np.array([np.nan])) == 0.0


def test_cli_and_api_write_text_json_and_html(tmp_path):
    ref_path, conv_path = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(offset_model(), str(ref_path))
    autocast_onnx.convert_file(ref_path, conv_path)
    np.savez(tmp_path / "b.npz", **batch())
    outcome = invoke(
        [
            "diagnose",
            str(ref_path),
            str(conv_path),
            "--inputs",
            str(tmp_path / "b.npz"),
            "--top",
            "3",
            "--report-json",
            str(tmp_path / "d.json"),
            "--report-html",
            str(tmp_path / "d.html"),
        ]
    )
    assert_ok(outcome)
    assert "output y: relative error" in outcome.stdout and "unshift" in outcome.stdout.splitlines()[3]
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["outputs"]["y"]["ranking"][0] == "unshift" and len(data["outputs"]["y"]["ranking"]) == 3
    assert data["reasons_from"] == "default rules"
    page = (tmp_path / "d.html").read_text()
    assert "<svg" in page and "unshift" in page
    api = autocast_onnx.diagnose(ref_path, conv_path, inputs=tmp_path / "b.npz", top=2)
    assert api["outputs"]["y"]["ranking"][:1] == ["unshift"]
    refused = invoke(["diagnose", str(ref_path), str(conv_path), "--inputs", str(tmp_path / "b.npz"), "--seed", "3"])
    assert refused.code == 2 and "--seed" in refused.lines()[0]


def test_target_search_keeps_the_offender_not_its_harmless_neighbours():
    from autocast_onnx.validate.options import parse_target
    from autocast_onnx.validate.search import search

    ref = offset_model()
    forced, log = search(ref, [batch(0), batch(1)], {"precision": "fp16"}, parse_target(["rtol=0.01"]))
    assert "unshift" in log["kept"] or "shift" in log["kept"]
    assert not {"mm", "relu", "scale"} & set(log["kept"])
    assert log["evaluations"] <= 3 + 5 + 2 * 3 and log["seconds"] >= 0
    assert all(v >= 0 for v in log["attribution"].values())
    result = autocast_onnx.convert(ref, force_fp32=forced)
    reasons = [r for n in result.plan.nodes for r in n.reasons if r.code == "accuracy-search"]
    assert reasons and all("attributed error" in r.message for r in reasons)


def test_target_search_prints_one_line_per_step_without_a_terminal(tmp_path):
    ref_path = tmp_path / "ref.onnx"
    onnx.save(offset_model(), str(ref_path))
    np.savez(tmp_path / "b.npz", **batch())
    args = ["convert", str(ref_path), "-o", str(tmp_path / "o.onnx"), "--target", "rtol=0.01"]
    outcome = invoke([*args, "--inputs", str(tmp_path / "b.npz")])
    assert_ok(outcome)
    steps = [line for line in outcome.stderr.splitlines() if line.startswith("--target search: evaluation")]
    assert len(steps) >= 3 and "evaluation 1: nothing kept fp32 -> fail: y:" in steps[0]
    assert "kept fp32 (attributed error):" in outcome.stdout


def test_the_plan_records_the_target_search(tmp_path):
    ref_path = tmp_path / "ref.onnx"
    onnx.save(offset_model(), str(ref_path))
    np.savez(tmp_path / "b.npz", **batch())
    plan = tmp_path / "plan.json"
    args = ["convert", str(ref_path), "-o", str(tmp_path / "o.onnx"), "--target", "rtol=0.01"]
    assert_ok(invoke([*args, "--inputs", str(tmp_path / "b.npz"), "--plan-out", str(plan)]))
    search = json.loads(plan.read_text())["search"]
    assert search["kept"] == ["shift"] and search["evaluations"] >= 3 and search["seconds"] >= 0
    assert set(search["attribution"]) == {"shift"}
    # a plan with a search log replays like any other
    assert_ok(invoke(["convert", str(ref_path), "-o", str(tmp_path / "p.onnx"), "--plan", str(plan)]))


def test_the_search_bar_shows_the_best_passing_set_so_far():
    from autocast_onnx.validate.options import parse_target
    from autocast_onnx.validate.search import search

    labels, updates = [], []

    class Bar:
        def update(self, n):
            updates.append(n)

        def describe(self, text):
            labels.append(text)

        def finish(self):
            updates.append("done")

    def progress(label, total):
        labels.append(label)
        return Bar()

    search(offset_model(), [batch(0)], {"precision": "fp16"}, parse_target(["rtol=0.01"]), progress=progress)
    assert labels[0].startswith("--target search (at most")
    assert any(re.search(r"best so far: \d+ nodes? kept fp32", t) for t in labels[1:]), labels
    assert updates[-1] == "done" and updates.count(1) >= 3


def test_unrelated_models_are_refused():
    from autocast_onnx.errors import AutocastError

    other = parse(
        """
        other (float[8,16] x) => (float[8,16] y) {
            [elsewhere] y = MatMul(x, w)
        }""",
        w=randn([16, 16]),
    )
    with pytest.raises(AutocastError, match="no node of the converted model matches"):
        diagnose(offset_model(), autocast_onnx.convert(other).model, batch=batch())
