"""The lint side of the command line: `lint` (text, JSON and SARIF reports, select/ignore,
configuration discovery and suppressions, exit codes), `rules` and `explain`.

Golden reports: the test_golden_* tests lint a small fp16 model built here (masked_softmax_model)
and compare the output of `lint --format text|json|sarif` with tests/golden/lint.txt, lint.json and
lint.sarif, after replacing the model's temporary path with <MODEL> and the tool version with
<VERSION>. After an intended change of the output, refresh them with

    AUTOCAST_ONNX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/lint/test_lint_cli.py -k golden

which rewrites the golden files and then compares against what it wrote; review
the diff of tests/golden/ before committing it.

The SARIF output is validated against the official SARIF 2.1.0 schema, vendored in
reference/; the JSON output against docs/lint-report.schema.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import F16, F32, init, model, sarif_location_path, tensor
from helpers import cli_process as cli_proc
from onnx import helper
from schema_helpers import assert_schema_documented_and_closed

import autocast_onnx
from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
MODELS = ROOT / "examples" / "models"
BERT = MODELS / "bert_tiny.onnx"
GPT2 = MODELS / "gpt2_tiny.onnx"
RESNET = MODELS / "resnet_tiny.onnx"
DEFAULT_RULES = ROOT / "rules" / "default.toml"
LINT_SCHEMA = ROOT / "docs" / "lint-report.schema.json"
SARIF_SCHEMA = Path(__file__).resolve().parents[2] / "reference" / "sarif-schema-2.1.0.json"
UPDATE_GOLDEN = os.environ.get("AUTOCAST_ONNX_UPDATE_GOLDEN") == "1"
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


# ---- models -------------------------------------------------------------------------------


def masked_softmax_model():
    """An fp16 attention-score block with one finding of each kind the golden files show:
    Softmax in fp16 (AC101), a -3.4e38 mask constant cast to fp16 (AC201, AC203), an fp16
    model output (AC302) and a MatMul with K = N = 12 (AC402)."""
    weight = (np.arange(144, dtype=np.float32).reshape(12, 12) / 144.0 - 0.5).astype(np.float16)
    mask = np.zeros((1, 12), dtype=np.float32)
    mask[0, 8:] = np.finfo(np.float32).min
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("Cast", ["mask"], ["mask16"], name="mask_cast", to=F16),
        helper.make_node("Add", ["h", "mask16"], ["scores"], name="add_mask"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
    ]
    return model(
        nodes, [tensor("x", F16, [2, 12])], [tensor("probs", F16, [2, 12])], [init("w", weight), init("mask", mask)]
    )


def save(m, path) -> Path:
    onnx.save(m, path)
    return Path(path)


def mlp_with_huge_activations():
    """x (fp32) -> fc1 (weights 100) -> relu -> fc2: with x = 100 the hidden values are 8e4."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    return model(
        nodes,
        [tensor("x", F32, [4, 8])],
        [tensor("y", F32, [4, 8])],
        [
            init("w1", np.full((8, 16), 100.0, dtype=np.float32)),
            init("w2", (rng.standard_normal((16, 8)) * 0.01).astype(np.float32)),
        ],
    )


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def masked(models_dir):
    return save(masked_softmax_model(), models_dir / "masked_softmax.onnx")


@pytest.fixture(scope="module")
def resnet16(models_dir):
    """An example model converted by autocast-onnx: only info findings (two unaligned dims)."""
    return save(autocast_onnx.convert(RESNET, precision="fp16").model, models_dir / "resnet_tiny.fp16.onnx")


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Run every in-process command from an empty folder, so no configuration file is found."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


# ---- running the command line ---------------------------------------------------------------


def invoke(*args):
    """In process; result.stdout and result.stderr are separate."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@contextlib.contextmanager
def working_dir(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def cli_in(*args, cwd):
    """In process but from `cwd`, with the same result fields as cli_proc (faster)."""
    with working_dir(cwd):
        result = invoke(*args)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def lint_json(*args, cwd=None, expect=None, process=False):
    """The JSON report of `lint`; from `cwd` when given, as a process when `process`."""
    runner = cli_proc if process else cli_in
    result = runner("lint", "--format", "json", *args, cwd=cwd or os.getcwd())
    assert result.returncode in (0, 1), result.stderr
    if expect is not None:
        assert result.returncode == expect, result.stdout
    return json.loads(result.stdout)


def codes(report) -> list[str]:
    return [d["code"] for d in report["diagnostics"]]


def assert_one_error_line(stderr: str, *fragments) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("autocast-onnx: error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- golden reports ---------------------------------------------------------------------------


def normalize(text: str, model_path: Path) -> str:
    text = text.replace(str(model_path), "<MODEL>")
    # a SARIF fingerprint hashes the model's path, here a temporary one outside any repository
    # (tests/lint/test_sarif_mapping.py pins the fingerprints of a model in a repository)
    text = re.sub(r'("autocastFinding/v1": )"[0-9a-f]{64}"', r'\1"<FINGERPRINT>"', text)
    # the tool's version follows its name in both the JSON report ("tool") and SARIF ("driver")
    return re.sub(r'("name": "autocast-onnx",\s*"version": )"[^"]*"', r'\1"<VERSION>"', text)


@pytest.mark.parametrize("fmt, golden", [("text", "lint.txt"), ("json", "lint.json"), ("sarif", "lint.sarif")])
def test_golden_report(fmt, golden, masked):
    result = invoke("lint", masked, "--format", fmt)
    assert result.exit_code == 1, result.output
    assert result.stderr == ""
    text = normalize(result.stdout, masked)
    assert str(masked.parent) not in text
    path = GOLDEN / golden
    if UPDATE_GOLDEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")  # refresh mode: rewrite, then compare as usual
    assert path.is_file(), f"{path} is missing: run with AUTOCAST_ONNX_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8")


def test_golden_files_name_the_placeholders_and_the_expected_findings():
    text = (GOLDEN / "lint.txt").read_text(encoding="utf-8")
    report = json.loads((GOLDEN / "lint.json").read_text(encoding="utf-8"))
    sarif = json.loads((GOLDEN / "lint.sarif").read_text(encoding="utf-8"))
    assert "<MODEL>: 5 finding(s) (as converted)" in text
    assert report["tool"]["version"] == "<VERSION>" == sarif["runs"][0]["tool"]["driver"]["version"]
    assert codes(report) == ["AC101", "AC201", "AC203", "AC302", "AC402"]
    assert {d["model"] for d in report["diagnostics"]} == {"<MODEL>"}
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == codes(report)


def test_reports_carry_the_real_version(masked):
    report = lint_json(masked)
    sarif = json.loads(invoke("lint", masked, "--format", "sarif").stdout)
    assert report["tool"] == {"name": "autocast-onnx", "version": autocast_onnx.__version__}
    assert sarif["runs"][0]["tool"]["driver"]["version"] == autocast_onnx.__version__


def test_output_file_holds_the_same_report(masked, tmp_path):
    out = tmp_path / "lint.json"
    result = invoke("lint", masked, "--format", "json", "-o", out)
    assert result.exit_code == 1 and result.stdout == ""
    assert json.loads(out.read_text()) == lint_json(masked)


# ---- SARIF ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sarif_validator():
    assert SARIF_SCHEMA.is_file(), f"the SARIF 2.1.0 schema is expected at {SARIF_SCHEMA}"
    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    assert schema["$schema"].startswith("http://json-schema.org/draft-07/schema")
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def check_sarif(sarif: dict, validator, diagnostics: list[dict]) -> None:
    """Valid SARIF 2.1.0 whose results are `diagnostics` (the JSON report's), in order."""
    validator.validate(sarif)
    assert sarif["version"] == "2.1.0"
    [run] = sarif["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "autocast-onnx"
    catalog = json.loads(invoke("rules", "--format", "json").stdout)
    assert [r["id"] for r in driver["rules"]] == [c["code"] for c in catalog]
    for rule, check in zip(driver["rules"], catalog):
        assert rule["name"] == check["name"]
        assert rule["defaultConfiguration"]["level"] == SARIF_LEVEL[check["severity"]]
    assert len(run["results"]) == len(diagnostics)
    for result, diag in zip(run["results"], diagnostics):
        assert result["ruleId"] == diag["code"]
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note")
        assert result["level"] == SARIF_LEVEL[diag["severity"]]
        assert result["message"]["text"] == diag["message"]
        [location] = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        assert sarif_location_path(run, artifact) == Path(diag["model"]).absolute()
        assert run["artifacts"][artifact["index"]]["location"] == {
            k: artifact[k] for k in ("uri", "uriBaseId") if k in artifact
        }
        if diag["node"] is None:
            assert "logicalLocations" not in location
        else:
            logical = location["logicalLocations"][0]
            assert logical["name"] == diag["node"]
            assert logical["fullyQualifiedName"] == f"{diag['graph']}::{diag['node']}"


def test_sarif_of_an_fp16_model_is_valid_and_locates_findings(masked, sarif_validator):
    result = invoke("lint", masked, "--format", "sarif")
    assert result.exit_code == 1
    sarif = json.loads(result.stdout)
    report = lint_json(masked)
    check_sarif(sarif, sarif_validator, report["diagnostics"])
    run = sarif["runs"][0]
    assert run["artifacts"] == [{"location": {"uri": masked.as_uri()}}]  # outside any repository and the cwd
    assert [r["level"] for r in run["results"]] == ["error", "error", "error", "warning", "note"]
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert by_rule["AC101"]["locations"][0]["logicalLocations"][0] == {
        "name": "softmax",
        "fullyQualifiedName": "main::softmax",
        "kind": "object",
    }
    assert by_rule["AC203"]["properties"]["tensor"] == "mask"
    assert by_rule["AC203"]["properties"]["value"] == pytest.approx(float(np.finfo(np.float32).min))


def test_sarif_of_an_fp32_example_model(sarif_validator):
    result = invoke("lint", GPT2, "--format", "sarif")
    assert result.exit_code == 0, result.output
    sarif = json.loads(result.stdout)
    report = lint_json(GPT2)
    check_sarif(sarif, sarif_validator, report["diagnostics"])
    results = sarif["runs"][0]["results"]
    assert results and {r["level"] for r in results} == {"note"}  # protected by the default rules
    # relative to the repository the model is in
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results} == {
        GPT2.relative_to(ROOT).as_posix()
    }
    assert all(r["properties"]["protected"] is True for r in results)


def test_sarif_of_several_models_lists_each_artifact(masked, sarif_validator):
    sarif = json.loads(invoke("lint", masked, GPT2, "--format", "sarif").stdout)
    check_sarif(sarif, sarif_validator, lint_json(masked, GPT2)["diagnostics"])
    # the root is the repository of the first model in one (GPT2's); masked is outside it
    assert [a["location"]["uri"] for a in sarif["runs"][0]["artifacts"]] == [
        masked.as_uri(),
        GPT2.relative_to(ROOT).as_posix(),
    ]


def test_sarif_without_findings_is_valid(resnet16, sarif_validator):
    sarif = json.loads(invoke("lint", resnet16, "--format", "sarif", "--select", "AC1").stdout)
    sarif_validator.validate(sarif)
    assert sarif["runs"][0]["results"] == []


# ---- JSON report schema ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lint_schema():
    return json.loads(LINT_SCHEMA.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lint_validator(lint_schema):
    return jsonschema.Draft202012Validator(lint_schema)


def test_lint_schema_is_a_documented_draft_2020_12_schema(lint_schema):
    assert lint_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(lint_schema)

    assert_schema_documented_and_closed(lint_schema)


def test_lint_schema_lists_exactly_the_keys_the_code_writes(lint_schema, masked):
    report = lint_json(masked)
    assert set(lint_schema["properties"]) == set(report)
    defs = lint_schema["$defs"]
    assert set(defs["model"]["properties"]) == set(report["models"][0])
    assert set(defs["diagnostic"]["properties"]) == set(report["diagnostics"][0])
    assert set(lint_schema["properties"]["summary"]["properties"]) == set(report["summary"])


def test_real_lint_reports_validate(lint_validator, masked, resnet16, tmp_path):
    config = tmp_path / "cfg.toml"
    config.write_text('suppress = [{ code = "AC101", node = "^softmax$" }, { code = "AC104" }]\n')
    reports = {
        "fp16 model": lint_json(masked),
        "fp32 model (prospective)": lint_json(GPT2),
        "bf16 prospective": lint_json(BERT, "--precision", "bf16"),
        "converted model": lint_json(resnet16),
        "several models": lint_json(masked, GPT2, resnet16),
        "suppressions (model-level AC901)": lint_json(masked, "--config", config),
        "nothing selected fires": lint_json(resnet16, "--select", "AC1"),
    }
    for what, report in reports.items():
        errors = [e.message for e in lint_validator.iter_errors(report)]
        assert not errors, f"{what}: {errors}"
    assert reports["fp32 model (prospective)"]["models"][0]["mode"] == "prospective"
    assert reports["bf16 prospective"]["models"][0]["precision"] == "bf16"
    assert [m["path"] for m in reports["several models"]["models"]] == [str(masked), str(GPT2), str(resnet16)]
    unused = [d for d in reports["suppressions (model-level AC901)"]["diagnostics"] if d["code"] == "AC901"]
    assert len(unused) == 1 and unused[0]["node"] is None


def _mutations():
    def drop(key):
        return lambda r: r.pop(key)

    def set_(path, value):
        def mutate(r):
            node = r
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value

        return mutate

    return {
        "missing diagnostics": drop("diagnostics"),
        "extra top-level key": set_(["extra"], 1),
        "wrong schema_version": set_(["schema_version"], 2),
        "unknown severity": set_(["diagnostics", 0, "severity"], "fatal"),
        "bad code": set_(["diagnostics", 0, "code"], "X101"),
        "extra diagnostic key": set_(["diagnostics", 0, "line"], 3),
        "missing diagnostic key": lambda r: r["diagnostics"][0].pop("tensor"),
        "string node_index": set_(["diagnostics", 0, "node_index"], "3"),
        "unknown mode": set_(["models", 0, "mode"], "maybe"),
        "negative count": set_(["summary", "error"], -1),
        "missing summary key": lambda r: r["summary"].pop("info"),
    }


@pytest.mark.parametrize("what", list(_mutations()))
def test_broken_lint_reports_do_not_validate(what, lint_validator, masked):
    report = lint_json(masked)
    lint_validator.validate(report)
    _mutations()[what](report)
    assert not lint_validator.is_valid(report), what


def test_reports_are_standard_json_even_for_an_infinite_value(tmp_path, sarif_validator, lint_validator, monkeypatch):
    # A finding may cite an infinite value (a check measuring a tensor that holds inf). JSON has no
    # Infinity: json.dumps writes the non-standard token -Infinity, which strict parsers (GitHub
    # code scanning, jq, JavaScript) reject. No built-in check cites one for this model any more
    # (an -inf mask converts exactly: hazards.py), so the masking check is made to cite -inf.
    from autocast_onnx.lint import checks

    def infinite(ctx, check):
        for node in ctx.index.nodes:
            if node.op == "Add":
                yield ctx.diag(
                    check, node, "masking constant 'mask' (-inf) cited as is", value=float("-inf"), tensor="mask"
                )

    monkeypatch.setitem(checks.KINDS, "masking-constant", infinite)
    mask = np.zeros((1, 8), dtype=np.float32)
    mask[0, 4:] = -np.inf
    nodes = [
        helper.make_node("Cast", ["mask"], ["mask16"], name="mask_cast", to=F16),
        helper.make_node("Add", ["x", "mask16"], ["scores"], name="add_mask"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax"),
    ]
    path = save(
        model(nodes, [tensor("x", F16, [2, 8])], [tensor("probs", F16, [2, 8])], [init("mask", mask)]),
        tmp_path / "inf_mask.onnx",
    )

    def strict(text):
        def reject(token):
            raise ValueError(f"non-standard JSON token {token}")

        return json.loads(text, parse_constant=reject)

    for fmt in ("json", "sarif"):
        result = invoke("lint", path, "--format", fmt)
        assert result.exit_code == 1
        report = strict(result.stdout)
        (lint_validator if fmt == "json" else sarif_validator).validate(report)
    assert "AC203" in codes(json.loads(invoke("lint", path, "--format", "json").stdout))


# ---- exit codes -------------------------------------------------------------------------------------


def test_exit_0_for_a_converted_example_model(resnet16):
    result = invoke("lint", resnet16)
    assert result.exit_code == 0, result.output
    # AC402 on the stem Conv (3 input channels); the head Gemm stays fp32 (output head)
    assert "1 finding(s): 0 error, 0 warning, 1 info; 0 suppressed" in result.stdout


def test_exit_1_for_softmax_in_fp16(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="softmax")]
    path = save(model(nodes, [tensor("x", F16, [2, 8])], [tensor("y", F32, [2, 8])]), tmp_path / "softmax.onnx")
    result = invoke("lint", path, "--select", "AC101")
    assert result.exit_code == 1
    assert "softmax (Softmax): Softmax computed in fp16" in result.stdout


@pytest.mark.parametrize(
    "select, fail_on, expected",
    [
        ("AC302", None, 0),
        ("AC302", "error", 0),
        ("AC302", "warning", 1),
        ("AC302", "info", 1),
        ("AC402", None, 0),
        ("AC402", "warning", 0),
        ("AC402", "info", 1),
        ("AC101", None, 1),
        ("AC101", "info", 1),
    ],
)
def test_fail_on_sets_the_lowest_failing_severity(masked, select, fail_on, expected):
    args = ["lint", masked, "--select", select] + (["--fail-on", fail_on] if fail_on else [])
    assert invoke(*args).exit_code == expected


def test_fail_on_info_fails_a_converted_model_with_info_findings(resnet16):
    assert invoke("lint", resnet16, "--fail-on", "warning").exit_code == 0
    assert invoke("lint", resnet16, "--fail-on", "info").exit_code == 1


@pytest.mark.slow
def test_input_and_usage_errors_exit_2_with_one_line(masked, tmp_path):
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_text("this is not a model\n")
    cases = [  # the first ones as real processes (stderr as a user sees it), the rest in process
        (cli_proc, ["lint", tmp_path / "missing.onnx"], ["missing.onnx", "not found"]),
        (cli_proc, ["lint", not_onnx], ["notes.onnx", "not an ONNX model"]),
        (cli_proc, ["lint", masked, "--select", "XYZ999"], ["'XYZ999' selects no check"]),
        (cli_in, ["lint", masked, "--ignore", "XYZ999"], ["'XYZ999' selects no check"]),
        (cli_in, ["lint", masked, "--config", tmp_path / "nope.toml"], ["nope.toml", "config file not found"]),
        (cli_in, ["lint", masked, "--format", "json", "-o", tmp_path / "no" / "dir" / "r.json"], []),
    ]
    for runner, args, fragments in cases:
        proc = runner(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert_one_error_line(proc.stderr, *fragments)
        assert proc.stdout == ""
    # one unreadable model among several: the others are linted, the run still exits 2
    proc = cli_proc("lint", masked, tmp_path / "missing.onnx", not_onnx, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{masked}: 5 finding(s) (as converted)" in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("autocast-onnx: error: ") for line in lines)
    assert "missing.onnx" in lines[0] and "not an ONNX model" in lines[1]


@pytest.mark.parametrize(
    "name, text, fragments",
    [
        ("invalid TOML", "select = [\n", ["autocast-onnx.toml", "invalid TOML"]),
        ("unknown key", 'selct = ["AC1"]\n', ["autocast-onnx.toml", "unknown key 'selct'"]),
        ("bad fail-on", 'fail-on = "fatal"\n', ["autocast-onnx.toml", "fail-on must be one of"]),
        ("select not a list", 'select = "AC1"\n', ["autocast-onnx.toml", "select must be a list of non-empty strings"]),
        ("bad threshold", 'atol = "small"\n', ["autocast-onnx.toml", "atol must be a finite number"]),
        ("bad suppress entry", 'suppress = [{ node = "x" }]\n', ["autocast-onnx.toml", "suppress must be a list"]),
        ("bad suppress regex", 'suppress = [{ code = "AC101", node = "(" }]\n', ["autocast-onnx.toml", "bad regex"]),
        ("select nothing", 'select = ["XYZ999"]\n', ["'XYZ999' selects no check"]),
    ],
)
def test_bad_configuration_exits_2_with_one_line(name, text, fragments, masked, tmp_path):
    (tmp_path / "autocast-onnx.toml").write_text(text)
    proc = cli_in("lint", masked, cwd=tmp_path)
    assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
    assert_one_error_line(proc.stderr, *fragments)


def test_click_usage_errors_exit_2_without_traceback(masked, tmp_path):
    for args in (["lint"], ["lint", masked, "--format", "xml"], ["lint", masked, "--fail-on", "fatal"]):
        proc = cli_in(*args, cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""


def test_several_models_in_one_call(masked, resnet16, tmp_path):
    # pre-commit passes every changed model in one call
    both = invoke("lint", resnet16, masked)
    assert both.exit_code == 1
    assert f"{masked}: softmax (Softmax): Softmax computed in fp16" in both.stdout
    assert f"{resnet16}: 1 finding(s) (as converted)" in both.stdout
    assert f"{masked}: 5 finding(s) (as converted)" in both.stdout
    assert "6 finding(s): 3 error, 1 warning, 2 info; 0 suppressed" in both.stdout
    report = lint_json(resnet16, masked)
    assert [m["path"] for m in report["models"]] == [str(resnet16), str(masked)]
    assert [m["findings"] for m in report["models"]] == [1, 5]
    assert report["summary"] == {"error": 3, "warning": 1, "info": 2}
    assert [d["model"] for d in report["diagnostics"]] == [str(resnet16)] + [str(masked)] * 5
    clean = invoke("lint", resnet16, GPT2, RESNET)
    assert clean.exit_code == 0, clean.output
    # a bad file among them is an input error, whatever the others hold
    assert invoke("lint", masked, tmp_path / "gone.onnx").exit_code == 2


# ---- select / ignore ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected_codes, expected_checks",
    [
        (["--select", "AC101"], ["AC101"], ["AC101"]),
        (["--select", "AC2"], ["AC201", "AC203"], ["AC201", "AC202", "AC203", "AC204"]),
        (["--select", "softmax-in-low-precision"], ["AC101"], ["AC101"]),
        (["--select", "AC101", "--select", "tensor-core-alignment"], ["AC101", "AC402"], ["AC101", "AC402"]),
        (["--select", "AC2", "--ignore", "AC203"], ["AC201"], ["AC201", "AC202", "AC204"]),
        (["--select", "AC2", "--ignore", "masking-constant"], ["AC201"], ["AC201", "AC202", "AC204"]),
        (
            ["--ignore", "AC1", "--ignore", "AC2", "--ignore", "AC9"],
            ["AC302", "AC402"],
            [
                "AC301",
                "AC302",
                "AC303",
                "AC304",
                "AC305",
                "AC401",
                "AC402",
                "AC403",
                "AC404",
                "AC501",
                "AC502",
                "AC503",
            ],
        ),
    ],
)
def test_select_and_ignore_by_code_prefix_and_name(masked, args, expected_codes, expected_checks):
    report = lint_json(masked, *args)
    assert codes(report) == expected_codes
    assert report["models"][0]["checks"] == expected_checks


def test_default_runs_every_check(masked):
    catalog = [c["code"] for c in json.loads(invoke("rules", "--format", "json").stdout)]
    assert lint_json(masked)["models"][0]["checks"] == catalog


# ---- configuration ----------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def checks_in_force(model_path, cwd, *args, process=True) -> list[str]:
    return lint_json(model_path, *args, cwd=cwd, process=process)["models"][0]["checks"]


def test_cli_flags_override_the_configuration(masked, tmp_path):
    write(tmp_path / "autocast-onnx.toml", 'select = ["AC4"]\nignore = ["AC403"]\nfail-on = "info"\n')
    # the configuration alone: AC401, AC402, AC404; the info finding fails
    proc = cli_in("lint", masked, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["models"][0]["checks"] == ["AC401", "AC402", "AC404"]
    # --fail-on beats fail-on
    assert cli_in("lint", masked, "--fail-on", "error", cwd=tmp_path).returncode == 0
    # --select beats select (the configuration's ignore still applies); --ignore beats ignore
    assert checks_in_force(masked, tmp_path, "--select", "AC1", process=False) == [
        "AC101",
        "AC102",
        "AC103",
        "AC104",
        "AC105",
        "AC106",
    ]
    assert checks_in_force(masked, tmp_path, "--ignore", "AC401", process=False) == ["AC402", "AC403", "AC404"]


@pytest.mark.slow
def test_autocast_onnx_toml_beats_pyproject_in_the_same_folder(masked, tmp_path):
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n\n[tool.autocast-onnx]\nselect = ["AC402"]\n')
    write(tmp_path / "autocast-onnx.toml", 'select = ["AC101"]\n')
    assert checks_in_force(masked, tmp_path) == ["AC101"]
    (tmp_path / "autocast-onnx.toml").unlink()
    assert checks_in_force(masked, tmp_path) == ["AC402"]


@pytest.mark.slow
def test_the_nearest_folder_upward_wins(masked, tmp_path):
    write(tmp_path / "autocast-onnx.toml", 'select = ["AC402"]\n')
    write(tmp_path / "team" / "pyproject.toml", '[tool.autocast-onnx]\nselect = ["AC101"]\n')
    deep = tmp_path / "team" / "models" / "bert"
    deep.mkdir(parents=True)
    sibling = tmp_path / "other"
    sibling.mkdir()
    assert checks_in_force(masked, deep) == ["AC101"]
    assert checks_in_force(masked, tmp_path / "team") == ["AC101"]
    assert checks_in_force(masked, sibling) == ["AC402"]
    assert checks_in_force(masked, tmp_path) == ["AC402"]


@pytest.mark.slow
def test_a_pyproject_without_the_tool_table_is_skipped(masked, tmp_path):
    write(tmp_path / "autocast-onnx.toml", 'select = ["AC402"]\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n\n[tool.ruff]\nline-length = 100\n')
    assert checks_in_force(masked, tmp_path / "pkg") == ["AC402"]


def test_config_option_wins_over_discovery(masked, tmp_path):
    write(tmp_path / "autocast-onnx.toml", 'select = ["AC402"]\n')
    explicit = write(tmp_path / "ci" / "lint-ci.toml", 'select = ["AC101"]\n')
    pyproject = write(tmp_path / "elsewhere" / "pyproject.toml", '[tool.autocast-onnx]\nselect = ["AC302"]\n')
    assert checks_in_force(masked, tmp_path, "--config", explicit, process=False) == ["AC101"]
    assert checks_in_force(masked, tmp_path, "--config", pyproject, process=False) == ["AC302"]
    assert checks_in_force(masked, tmp_path, process=False) == ["AC402"]


@pytest.mark.slow
def test_unknown_key_in_pyproject_names_the_file_and_table(masked, tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.autocast-onnx]\nfail_on = "error"\nseverity = "x"\n')
    proc = cli_proc("lint", masked, cwd=tmp_path)
    assert proc.returncode == 2
    line = assert_one_error_line(proc.stderr, "unknown key 'severity'")
    assert f"{(tmp_path / 'pyproject.toml').resolve()} [tool.autocast-onnx]" in line


@pytest.mark.slow
def test_config_suppressions_hide_findings_and_unused_ones_are_reported(masked, tmp_path):
    config = write(
        tmp_path / "autocast-onnx.toml",
        'suppress = [\n  { code = "AC2", node = "^mask_" },\n  { code = "AC104", node = "." },\n]\n',
    )
    proc = cli_proc("lint", masked, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 1  # AC101 still fails
    report = json.loads(proc.stdout)
    assert codes(report) == ["AC101", "AC302", "AC402", "AC901"]
    assert report["models"][0]["suppressed"] == 2
    [unused] = [d for d in report["diagnostics"] if d["code"] == "AC901"]
    assert unused["severity"] == "warning" and unused["node"] is None
    assert "AC104" in unused["message"] and str(config.resolve()) in unused["message"]
    text = cli_in("lint", masked, cwd=tmp_path).stdout
    assert "4 finding(s): 1 error, 2 warning, 1 info; 2 suppressed" in text
    # a warning (the unused suppression) fails with --fail-on warning once AC101 is suppressed too
    write(config, 'suppress = [{ code = "AC101" }, { code = "AC104", node = "." }]\n')
    assert cli_in("lint", masked, "--select", "AC1", "--select", "AC9", cwd=tmp_path).returncode == 0
    assert (
        cli_in("lint", masked, "--select", "AC1", "--select", "AC9", "--fail-on", "warning", cwd=tmp_path).returncode
        == 1
    )


def test_suppression_by_check_name(masked, tmp_path):
    config = write(tmp_path / "s.toml", 'suppress = [{ code = "softmax-in-low-precision", node = "softmax" }]\n')
    report = lint_json(masked, "--config", config, "--select", "AC1", "--select", "AC9", expect=0)
    assert codes(report) == [] and report["models"][0]["suppressed"] == 1


def test_node_metadata_suppresses_findings_of_that_node(tmp_path):
    m = masked_softmax_model()
    softmax = next(n for n in m.graph.node if n.name == "softmax")
    entry = softmax.metadata_props.add()
    entry.key, entry.value = "autocast-onnx:ignore", "AC101, AC302"
    path = save(m, tmp_path / "annotated.onnx")
    report = lint_json(path)
    assert codes(report) == ["AC201", "AC203", "AC402"]
    assert report["models"][0]["suppressed"] == 2
    # a code that matches nothing at that node is an unused suppression
    entry.value = "AC101,AC104"
    path = save(m, tmp_path / "annotated.onnx")
    report = lint_json(path)
    assert "AC101" not in codes(report)
    [unused] = [d for d in report["diagnostics"] if d["code"] == "AC901"]
    assert "AC104" in unused["message"] and "metadata of node softmax" in unused["message"]
    # the metadata of one node does not hide the same check elsewhere
    entry.value = "AC201"
    report = lint_json(save(m, tmp_path / "annotated.onnx"))
    assert "AC201" in codes(report) and "AC901" in codes(report)


# ---- rules ---------------------------------------------------------------------------------------


def test_rules_lists_every_check():
    catalog = json.loads(invoke("rules", "--format", "json").stdout)
    text = invoke("rules").stdout
    assert catalog and [c["code"] for c in catalog] == sorted(c["code"] for c in catalog)
    for check in catalog:
        assert re.search(rf"^{check['code']}\s+{re.escape(check['name'])}\s+{check['severity']}\s", text, re.M)
        assert set(check) == {"code", "name", "severity", "summary", "why", "fix", "kind"}


# ---- explain -----------------------------------------------------------------------------------


def rule_line(op: str, category: str) -> int:
    """Line of `op = ...` in the [ops.<category>] table of rules/default.toml."""
    table = None
    for number, line in enumerate(DEFAULT_RULES.read_text(encoding="utf-8").splitlines(), 1):
        header = re.match(r"^\[(.+)\]\s*$", line)
        if header:
            table = header.group(1)
        elif table == f"ops.{category}" and re.match(rf"^{re.escape(op)}\s*=", line):
            return number
    raise AssertionError(f"{op} not in [ops.{category}] of {DEFAULT_RULES}")


def test_explain_where_of_bert_cites_the_measured_mask_and_the_rule_line():
    # --precise: the Where stays fp32 (by default the fast plan runs it fp16 with the Add it feeds,
    # its fill stored as the sentinel: tests/plan/test_mask_sentinels.py)
    result = invoke("explain", BERT, "/Where", "--precise")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("/Where (Where), node #")
    assert "  precision: fp32" in out
    # the mask's -3.4e38 reaches only the two Softmax inputs: an attention-mask sentinel, retargeted
    # (plan/masks.py) rather than keeping its readers fp32 (the Where is fp32 only because nothing
    # low-precision feeds it)
    sentinel = (
        r"\[mask-sentinel\] reads the attention-mask sentinel '\w+', whose values beyond the fp16 range reach only "
        r"2 Softmax input\(s\): they become -49152 there \(plan/masks\.py\).*\(measured 3\.403e\+38\)"
    )
    assert re.search(sentinel, out), out
    assert "[data-range]" not in out
    assert "[unchanged] not fed by a low-precision node" in out
    category = re.search(r"category: (\w+)", out).group(1)
    cited = re.search(r"\[op-category\].*\(rules/default\.toml:(\d+)\)", out)
    assert cited, out
    assert int(cited.group(1)) == rule_line("Where", category)


def test_explain_softmax_is_keep_fp32_with_its_rule_line():
    line = rule_line("Softmax", "keep_fp32")
    assert DEFAULT_RULES.read_text().splitlines()[line - 1].startswith("Softmax =")
    # planned for CUDA (the default), whose Softmax kernel computes in fp32 and rounds once, the
    # keep_fp32 Softmax between fp16 neighbours runs at fp16 (kernel-fp32)
    result = invoke("explain", BERT, "/encoder/layer.0/attention/self/Softmax")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "  category: keep_fp32" in out and "  precision: fp16" in out
    assert f"(rules/default.toml:{line})" in out
    assert re.search(
        r"^    - \[kernel-fp32\] onnxruntime-cuda [\d.]+'s Softmax kernel computes in fp32 and rounds its outputs once "
        r"\(onnxruntime/core/providers/cuda/math/softmax\.cc:[\d-]+@\w+\);.* so it runs at fp16 inputs and outputs",
        out,
        re.M,
    ), out
    assert out.rstrip("\n").splitlines()[-1].startswith("    - [kernel-fp32] ")  # the last reason
    # planned for no runtime's kernels it stays fp32
    result = invoke("explain", BERT, "/encoder/layer.0/attention/self/Softmax", "--runtime", "any")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "  category: keep_fp32" in out and "  precision: fp32" in out
    assert f"(rules/default.toml:{line})" in out
    assert "[kernel-fp32]" not in out


def test_explain_by_node_id():
    by_name = invoke("explain", BERT, "/Where").stdout
    node_id = re.search(r"node #(\d+)", by_name).group(1)
    by_id = invoke("explain", BERT, f"#{node_id}")
    assert by_id.exit_code == 0 and by_id.stdout == by_name


@pytest.mark.slow
def test_explain_unknown_node_suggests_names(tmp_path):
    proc = cli_proc("explain", BERT, "/Wher", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_error_line(proc.stderr, "no node named '/Wher'", "did you mean", "'/Where'")
    proc = cli_proc("explain", BERT, "#99999", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr, "#99999")


def test_explain_with_calibration_data_reports_measured_ranges(tmp_path):
    path = save(mlp_with_huge_activations(), tmp_path / "mlp.onnx")
    data = tmp_path / "calibration.npz"
    np.savez(data, x=np.full((4, 8), 100.0, dtype=np.float32))
    plain = invoke("explain", path, "fc1")
    assert plain.exit_code == 0
    assert "  precision: fp16" in plain.stdout and "[calibration]" not in plain.stdout
    measured = invoke("explain", path, "fc1", "--calibration-data", data)
    assert measured.exit_code == 0, measured.output
    assert "  precision: fp32" in measured.stdout
    assert re.search(r"\[calibration\] calibration: max \|h\| = 8e\+04 exceeds .*\(measured 8e\+04\)", measured.stdout)
    # downstream nodes fed by the huge values are kept fp32 too
    relu = invoke("explain", path, "relu", "--calibration-data", data).stdout
    assert "  precision: fp32" in relu and "[calibration]" in relu


# ---- at scale: folders, statistics, exit-zero, colour, protected findings, rules CODE ------------


@pytest.mark.slow
def test_a_folder_is_searched_for_models_and_an_unreadable_one_is_reported(masked, tmp_path):
    folder = tmp_path / "zoo"
    (folder / "sub").mkdir(parents=True)
    save(masked_softmax_model(), folder / "sub" / "a.onnx")
    (folder / "broken.onnx").write_bytes(b"not a model")
    (folder / "notes.txt").write_text("ignored")
    proc = cli_proc("lint", folder, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert [m["path"] for m in report["models"]] == [str(folder / "sub" / "a.onnx")]
    assert_one_error_line(proc.stderr, "broken.onnx", "not an ONNX model")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_error_line(cli_in("lint", empty, cwd=tmp_path).stderr, "folder holds no .onnx file")


def test_statistics_exit_zero_and_the_output_format_alias(masked, resnet16):
    stats = invoke("lint", masked, resnet16, "--statistics")
    assert stats.exit_code == 1  # the findings still decide the exit code
    lines = stats.stdout.splitlines()
    assert lines[0].split()[:2] == ["2", "AC402"] and lines[-1].split()[:2] == ["6", "finding(s)"]
    assert any(line.split()[:3] == ["1", "AC101", "softmax-in-low-precision"] for line in lines)
    as_json = json.loads(invoke("lint", masked, "--statistics", "--output-format", "json").stdout)
    assert {row["code"]: row["count"] for row in as_json} == {
        "AC101": 1,
        "AC201": 1,
        "AC203": 1,
        "AC302": 1,
        "AC402": 1,
    }
    assert invoke("lint", masked, "--exit-zero").exit_code == 0
    assert invoke("lint", masked, "--output-format", "json").stdout == invoke("lint", masked, "--format", "json").stdout


def test_colour_only_when_asked_for(masked, monkeypatch):
    from autocast_onnx.cli.lint import _colour
    from autocast_onnx.lint import lint as run_lint
    from autocast_onnx.lint.report import lint_text

    result = run_lint(masked)
    assert "\x1b[" not in lint_text([result]) and "\x1b[31m" in lint_text([result], colour=True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not _colour()
    monkeypatch.delenv("NO_COLOR")
    assert _colour()
    assert "\x1b[" not in invoke("lint", masked).stdout  # CliRunner's stdout is no terminal


def test_protected_findings_are_counted_not_listed_unless_asked(tmp_path):
    # --runtime any: counting on no runtime's kernels, the Softmax is reported (AC101), protected
    proc = invoke("lint", GPT2, "--runtime", "any")
    assert proc.exit_code == 0
    hidden = re.search(
        r"(\d+) finding\(s\) the conversion rules protect \(info, not listed; --show-protected", proc.stdout
    )
    assert hidden and int(hidden.group(1)) > 0
    shown = invoke("lint", GPT2, "--show-protected", "--runtime", "any").stdout
    assert "not listed" not in shown and "the default conversion rules keep this fp32" in shown
    # a group's header gives the severities found, not the check's default (AC101 is an error check)
    assert re.search(r"^AC101 softmax-in-low-precision \[info\]:", shown, re.M)


def test_rules_code_explains_one_check():
    one = invoke("rules", "AC203")
    assert one.exit_code == 0
    assert one.stdout.startswith("AC203 masking-constant [") and "Why: " in one.stdout and "Fix: " in one.stdout
    by_name = invoke("rules", "masking-constant")
    assert by_name.stdout == one.stdout
    assert [c["code"] for c in json.loads(invoke("rules", "AC9", "--format", "json").stdout)] == ["AC901"]
    bad = invoke("rules", "ZZ999")
    assert bad.exit_code == 2 and "no check has the code or name 'ZZ999'" in bad.stderr


@pytest.mark.slow
def test_explain_by_regex_and_by_op_type(tmp_path):
    both = cli_proc("explain", BERT, "--op", "Softmax", cwd=tmp_path)
    assert both.returncode == 0 and both.stdout.startswith("2 nodes match\n")
    assert both.stdout.count("(Softmax), node #") == 2
    one = cli_proc("explain", BERT, r"layer\.1/.*Softmax", cwd=tmp_path)
    assert one.returncode == 0 and one.stdout.startswith("/encoder/layer.1/attention/self/Softmax (Softmax)")
    assert "Softmax always stays fp32 (category keep_fp32). Why: " in one.stdout  # a sentence, then the evidence
    narrowed = cli_proc("explain", BERT, "layer.0", "--op", "Softmax", cwd=tmp_path)
    assert narrowed.stdout.count("(Softmax), node #") == 1
    for args, fragment in (
        (["--op", "Conv"], "no node has op type 'Conv'"),
        ([], "give NODE (a name, regex or #ID), --op TYPE or --islands"),
        (["(unclosed"], "bad regex"),
        (["#99999"], "no node #99999"),
    ):
        proc = cli_proc("explain", BERT, *args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == ""
        assert_one_error_line(proc.stderr, fragment)
