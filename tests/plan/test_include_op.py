"""--include-op OP beside --exclude-op: every node of an op type forced low, as --include-node
forces nodes by name; an exclude (by op or by node) beats it. One PlanOptions field (plan/options.py)
gives the flag, the configuration key `include-op` and the API keyword `include_ops`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import convert, parse, planned, randn

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.cli.main import cli
from autocast_onnx.plan.model import PrecisionPlan


def _softmax_model():
    return parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            [fc1] h = MatMul(x, w1)
            [sm1] p = Softmax(h)
            [fc2] h2 = MatMul(p, w2)
            ["head/sm2"] y = Softmax(h2)
        }""",
        w1=randn([8, 8], 1, 0.3),
        w2=randn([8, 8], 2, 0.3),
    )


def test_include_op_forces_every_node_of_the_op_low_with_its_reason():
    result = convert(_softmax_model(), include_ops=["Softmax"])
    assert planned(result, "sm1") == "fp16" and planned(result, "head/sm2") == "fp16"
    reason = result.plan.by_name("sm1")[0].reasons[-1]
    assert reason.code == "cli-include" and "--include-op Softmax" in reason.message
    # without it, the default rules keep softmax fp32 (for no particular runtime: planned for ONNX
    # Runtime's CUDA provider, sm1, between fp16 MatMuls, runs at fp16 with reason kernel-fp32)
    assert planned(convert(_softmax_model(), runtime="any"), "sm1") == "fp32"


def test_an_exclude_beats_include_op():
    result = convert(_softmax_model(), include_ops=["Softmax"], exclude_nodes=["^head/"])
    assert planned(result, "sm1") == "fp16" and planned(result, "head/sm2") == "fp32"
    result = convert(_softmax_model(), include_ops=["Softmax"], exclude_ops=["Softmax"])
    assert planned(result, "sm1") == "fp32" and planned(result, "head/sm2") == "fp32"


def test_include_op_that_matches_nothing_warns_and_strict_refuses():
    result = convert(_softmax_model(), include_ops=["Erf"])
    assert any(w.code == "unmatched-selector" and "--include-op Erf" in w.message for w in result.plan.warnings)
    with pytest.raises(AutocastError, match="--include-op Erf matches no node"):
        convert(_softmax_model(), include_ops=["Erf"], strict=True)


def test_include_op_naming_no_op_type_is_refused():
    with pytest.raises(AutocastError, match="--include-op"):
        convert(_softmax_model(), include_ops=["Soft-max"])


def test_include_op_on_the_command_line_and_in_the_configuration(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    path.write_bytes(_softmax_model().SerializeToString())
    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke(
        cli, ["convert", str(path), "-o", "a.onnx", "--plan-out", "a.json", "--include-op", "Softmax", "-q"]
    )
    assert run.exit_code == 0, run.output
    plan = PrecisionPlan.load(tmp_path / "a.json")
    assert {n.name: n.precision for n in plan.nodes}["sm1"] == "fp16"
    (tmp_path / "autocast-onnx.toml").write_text('include-op = ["Softmax"]\nexclude-node = ["^head/"]\n')
    run = CliRunner().invoke(cli, ["convert", str(path), "-o", "b.onnx", "--plan-out", "b.json", "-q"])
    assert run.exit_code == 0, run.output
    precisions = {n.name: n.precision for n in PrecisionPlan.load(tmp_path / "b.json").nodes}
    assert precisions["sm1"] == "fp16" and precisions["head/sm2"] == "fp32"
    # a planning option: refused beside a replayed plan, which decides every node already
    run = CliRunner().invoke(
        cli,
        [
            "convert",
            str(path),
            "-o",
            "c.onnx",
            "--plan",
            "a.json",
            "--include-op",
            "Softmax",
            "--config",
            str(tmp_path / "none.toml"),
        ],
    )
    assert run.exit_code == 2


def test_include_op_is_a_keyword_of_the_api_and_lint():
    model = _softmax_model()
    options = autocast_onnx.PlanOptions(include_ops=("Softmax",))
    assert planned(autocast_onnx.convert(model, options=options), "sm1") == "fp16"
    # lint judges what the conversion protects with the same options: forced low, no longer protected
    # (for no particular runtime: for CUDA's, whose Softmax kernel computes in fp32, AC101 is not reported)
    plain = autocast_onnx.lint(model, select=["AC101"], runtime="any")
    forced = autocast_onnx.lint(model, select=["AC101"], include_ops=["Softmax"], runtime="any")
    assert all(d.severity == "info" for d in plain.findings) and plain.findings
    assert all(d.severity == "error" for d in forced.findings) and forced.findings
