"""The pipeline (autocast_onnx/pipeline.py) end to end: `convert()` on a ModelProto or a path,
`convert_file()` writing the converted model (and the plan) beside the input or to -o, the
options they take (precision, keep_io_types, check) and the input they refuse (an opset too old
for the target type, unknown option values, the output path being the input). The last section
drives the same pipeline through `autocast-onnx convert` with bad input: a broken model file or
a broken rule file gives exit code 2 and one error line, writes nothing and leaves the inputs
byte-identical."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import case_helpers as C
import helpers as H
import onnx
import pytest
from helpers import BF16, F16, F32, convert, mlp, parse, planned, randn

from autocast_onnx import AutocastError, PrecisionPlan, convert_file


# =========================================================================================
# 1. convert(): options
# =========================================================================================
@pytest.mark.parametrize("target,elem", [("fp16", F16), ("bf16", BF16)])
def test_precision_option(target, elem):
    r = convert(mlp(), precision=target)
    assert planned(r, "enc/fc1") == target
    assert {i.data_type for i in r.model.graph.initializer} == {elem}
    H.check(r.model)


def test_keep_io_types_option(precision, keep_io):
    r = convert(mlp(), precision=precision, keep_io_types=keep_io)
    edge = F32 if keep_io else C.TARGET[precision]
    assert C.input_types(r.model) == {"x": edge} and C.output_types(r.model) == {"y": edge}
    assert r.plan.keep_io_types is keep_io
    assert r.stats.casts_added == (2 if keep_io else 0)


def test_bf16_needs_opset_13():
    m = mlp()
    m.opset_import[0].version = 12
    with pytest.raises(AutocastError, match="opset 12 cannot express bf16"):
        convert(m, precision="bf16")


@pytest.mark.parametrize(
    "option,value,message", [("precision", "fp8", "unknown precision"), ("check", "thorough", "unknown check level")]
)
def test_unknown_option_value_is_refused(option, value, message):
    with pytest.raises(AutocastError, match=message):
        convert(mlp(), **{option: value})


def test_convert_copies_its_input_and_reads_paths(tmp_path):
    m = mlp()
    before = m.SerializeToString()
    from_proto = convert(m)
    assert m.SerializeToString() == before  # copy=True (the default): input untouched
    path = tmp_path / "m.onnx"
    path.write_bytes(before)
    from_path = convert(path)
    assert from_path.plan == from_proto.plan
    assert from_path.model.SerializeToString() == from_proto.model.SerializeToString()


# =========================================================================================
# 2. convert_file()
# =========================================================================================
def test_convert_file_writes_beside_the_input_by_default(tmp_path, precision):
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp().SerializeToString())
    before = sha(path)
    result = convert_file(path, precision=precision)
    out = tmp_path / f"m.{precision}.onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", out.name])
    assert sha(path) == before
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    assert written.SerializeToString() == result.model.SerializeToString()
    assert {t.data_type for t in written.graph.initializer} == {C.TARGET[precision]}


def test_convert_file_plan_out(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp().SerializeToString())
    plan = tmp_path / "plan.json"
    result = convert_file(path, tmp_path / "o.onnx", plan_out=plan, exclude_nodes=["^head/"])
    again = PrecisionPlan.from_json(plan.read_text())
    assert again == result.plan
    assert [n.precision for n in again.by_name("head/fc2")] == ["fp32"]


def test_convert_file_refuses_output_equal_to_input(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp().SerializeToString())
    before = sha(path)
    with pytest.raises(AutocastError, match="output path is the input"):
        convert_file(path, path)
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


# =========================================================================================
# 3. Bad input on the command line (`autocast-onnx convert`)
# =========================================================================================
def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def good_model_file(path):
    m = parse(
        """
        good (float[2,64] x) => (float[2,64] y) {
            [mm] y = MatMul(x, W)
        }""",
        W=randn([64, 64], 120),
    )
    path.write_bytes(m.SerializeToString())
    return path


def cli_run(args):
    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli

    result = CliRunner().invoke(cli, ["convert", *map(str, args)], catch_exceptions=True)
    return result.exit_code, result.stdout, result.stderr, result.exception


def assert_one_line_error(code, stderr, exception=None):
    assert code == 2, (code, stderr, exception)
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("autocast-onnx: error:")


def bad_model_cases(tmp_path):
    cases = {}
    p = tmp_path / "text.onnx"
    p.write_text("this is not an onnx model\n" * 10)
    cases["not_onnx"] = p
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    cases["empty"] = p
    good = good_model_file(tmp_path / "good.onnx")
    data = good.read_bytes()
    p = tmp_path / "truncated.onnx"
    p.write_bytes(data[: len(data) // 2])
    cases["truncated"] = p
    d = tmp_path / "adir.onnx"
    d.mkdir()
    cases["directory"] = d
    cases["missing"] = tmp_path / "missing.onnx"
    return cases


BAD_RULES = {
    "unknown_key": '[settings]\nunknown_op = "keep_fp32"\nfavourite_colour = "blue"\n',
    "unknown_table": '[oops]\nMatMul = "x"\n',
    "two_categories": '[ops.keep_fp32]\nMatMul = "keep"\n\n[ops.follow]\nMatMul = "follow"\n',
    "bad_regex": '[[nodes]]\nmatch = "attn_("\nprecision = "fp32"\n',
}
# what the one error line must mention (rule file and line come first)
RULE_ERRORS = {
    "unknown_key": ("rules.toml:3", "favourite_colour"),
    "unknown_table": ("rules.toml:1", "oops"),
    "two_categories": ("rules.toml:5", "two categories"),
    "bad_regex": ("rules.toml:1", "regex"),
}


MODEL_ERRORS = {
    "not_onnx": "not an ONNX model",
    "empty": "empty",
    "truncated": "not an ONNX model",
    "directory": "directory",
    "missing": "not found",
}


@pytest.mark.parametrize("case", sorted(MODEL_ERRORS))
def test_cli_bad_model_input(tmp_path, case):
    path = bad_model_cases(tmp_path)[case]
    out = tmp_path / "out.onnx"
    before = sha(path)
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, _, stderr, exc = cli_run([path, "-o", out])
    assert_one_line_error(code, stderr, exc)
    assert MODEL_ERRORS[case] in stderr and path.name in stderr
    assert not out.exists()
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no temp files left behind


@pytest.mark.parametrize("case", sorted(BAD_RULES))
def test_cli_bad_rule_file(tmp_path, case):
    model_path = good_model_file(tmp_path / "good.onnx")
    rules = tmp_path / "rules.toml"
    rules.write_text(BAD_RULES[case])
    out = tmp_path / "out.onnx"
    before, rules_before = sha(model_path), sha(rules)
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, _, stderr, exc = cli_run([model_path, "--rules", rules, "-o", out])
    assert_one_line_error(code, stderr, exc)
    for part in RULE_ERRORS[case]:
        assert part in stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == listing
    assert sha(model_path) == before and sha(rules) == rules_before


def test_cli_output_is_input(tmp_path):
    model_path = good_model_file(tmp_path / "good.onnx")
    before = sha(model_path)
    code, _, stderr, exc = cli_run([model_path, "-o", model_path])
    assert_one_line_error(code, stderr, exc)
    assert "output path is the input" in stderr
    assert sha(model_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.onnx"]


@pytest.mark.slow
def test_cli_bad_input_in_a_real_process(tmp_path):
    """The same contract end to end through `python -m autocast_onnx` (real stderr, real exit)."""
    path = bad_model_cases(tmp_path)["truncated"]
    before = sha(path)
    out = tmp_path / "out.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "convert", str(path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(proc.returncode, proc.stderr)
    assert not out.exists() and sha(path) == before


def test_cli_good_model_still_converts(tmp_path):
    """Control for the bad-input tests: the same invocation on a good model succeeds."""
    model_path = good_model_file(tmp_path / "good.onnx")
    out = tmp_path / "out.onnx"
    code, _, stderr, exc = cli_run([model_path, "-o", out, "-q"])
    assert code == 0, (stderr, exc)
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    assert C.initializer(converted.graph, "W").data_type == F16
