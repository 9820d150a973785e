"""Warnings that count: a constant whose few flushing values are under max_flush_fraction is
converted and needs no action, so convert's summary and lint count such notes in one line (how
many, the worst fraction) and list each only under -v (and in the plan file, or lint's JSON);
a warning that needs action keeps its own line. A BERT-base printed 'warnings: 42', each '1 of
589,824 values flush to zero in fp16 (0.000%, under max_flush_fraction); converted'."""

from __future__ import annotations

import onnx
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.cli.main import cli
from autocast_onnx.report import conversion_summary


def flushing_mlp():
    """Two MatMuls whose 32x32 weights each hold one or two values that flush in fp16 (1 and 2 of
    1024: under the default max_flush_fraction of 1%)."""
    w1, w2 = randn([32, 32]), randn([32, 32], seed=1)
    w1[0, 0] = 1e-9
    w2[0, 0] = w2[1, 1] = -2e-9
    return parse(
        """
        mlp (float[4, 32] x) => (float[4, 32] y) {
            [fc1] h = MatMul(x, w1)
            [fc2] y = MatMul(h, w2)
        }""",
        w1=w1,
        w2=w2,
    )


def test_flush_notes_are_one_line_and_warnings_that_need_action_keep_theirs():
    result = autocast_onnx.convert(flushing_mlp(), exclude_nodes=["^no_such_node$"])
    codes = sorted(w.code for w in result.plan.warnings)
    assert codes == ["flush-note", "flush-note", "unmatched-selector"]  # the plan file keeps each
    text = conversion_summary(result)
    assert "warnings: 1\n  [unmatched-selector] --exclude-node '^no_such_node$' matches no node" in text
    notes = [line for line in text.splitlines() if line.startswith("notes:")]
    assert notes == [
        "notes: 2 constant(s) with a few values that flush to zero in fp16, converted as the rules allow; "
        "worst 0.2% of a tensor's nonzero values (-v lists them; --plan-out keeps them)"
    ]
    assert "flush to zero in fp16 (0.098%" not in text  # no note listed one by one
    verbose = conversion_summary(result, verbose=True)
    assert verbose.count("[flush-note]") == 2 and "1 of 1024 nonzero values of 'w1'" in verbose


def test_only_notes_print_no_warnings_count():
    text = conversion_summary(autocast_onnx.convert(flushing_mlp()))
    assert "warnings:" not in text and "notes: 2 constant(s)" in text


def test_lint_counts_the_same_flush_findings_in_one_line(tmp_path):
    # lint the fp32 model prospectively: it judges what converting it would do
    fp32 = tmp_path / "mlp.onnx"
    onnx.save(flushing_mlp(), fp32)
    out = CliRunner().invoke(cli, ["lint", str(fp32), "--show-protected"])
    assert "AC202 weights-flush-to-zero" in out.stdout, out.stdout
    lines = [x for x in out.stdout.splitlines() if "flush" in x and not x.startswith(("AC202", "  fix:"))]
    assert lines == [
        "  2 constant(s) with a few values that flush to zero, each under max_flush_fraction (0.01), worst 0.2% "
        "of a tensor's nonzero values: the converter converts them (-v or --format json lists them)"
    ], out.stdout
    listed = CliRunner().invoke(cli, ["lint", str(fp32), "--show-protected", "-v"]).stdout
    assert listed.count("nonzero values (") == 2  # one line each under -v


def test_a_large_flushing_fraction_stays_a_finding_of_its_own(tmp_path):
    """Over max_flush_fraction the converter keeps the consumer fp32: the finding needs a look."""
    w = randn([32, 32])
    w[:4] = 1e-9  # 128 of 1024 values: 12.5%
    m = parse("g (float[4, 32] x) => (float[4, 32] y) { [fc] y = MatMul(x, w) }", w=w)
    path = tmp_path / "big.onnx"
    onnx.save(m, path)
    out = CliRunner().invoke(cli, ["lint", str(path), "--show-protected"]).stdout
    assert "128 of 1024 nonzero values (12.500%) of 'w' flush to zero" in out
    assert "constant(s) with a few values" not in out


def test_check_counts_the_notes_apart_from_the_warnings(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(flushing_mlp(), path)
    out = CliRunner().invoke(cli, ["check", str(path), "--no-validate"]).stdout
    assert "convert to fp16: fp16 2; 2 casts; 0 warning(s), 2 note(s)" in out, out
