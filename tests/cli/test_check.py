"""`autocast-onnx check`, the CI gate: verdict and exit code, thresholds from the configuration,
--baseline (new findings and regressions only), --no-validate, -o, --sarif, and the
--report-json file against docs/check-report.schema.json (which references
docs/lint-report.schema.json and docs/validate-report.schema.json)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import jsonschema
import onnx
import pytest
from click.testing import CliRunner
from helpers import cli_process as cli_proc
from helpers import sarif_location_path
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from schema_helpers import assert_schema_documented_and_closed

from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESNET = ROOT / "examples" / "models" / "resnet_tiny.onnx"
SARIF_SCHEMA = Path(__file__).resolve().parents[2] / "reference" / "sarif-schema-2.1.0.json"
FAST = ("--no-speed",)


@pytest.fixture(autouse=True)
def isolated_cwd(tmp_path, monkeypatch):
    """Run from an empty folder, so no configuration file is found unless a test writes one."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def check(*args, report=None):
    """Run `check` in process; returns (exit code, stdout, the --report-json dict or None)."""
    extra = ["--report-json", report] if report is not None else []
    result = invoke("check", *args, *extra)
    assert result.exit_code in (0, 1), result.output
    data = json.loads(Path(report).read_text()) if report is not None else None
    return result.exit_code, result.stdout, data


def assert_one_error_line(stderr: str, *fragments) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocast-onnx: error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---- schema -----------------------------------------------------------------------------------------


def load_schema(name):
    return json.loads((DOCS / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def check_schema():
    return load_schema("check-report.schema.json")


@pytest.fixture(scope="module")
def validator(check_schema):
    """The check schema with its relative references to the lint and validate schemas resolved."""
    registry = Registry().with_resources(
        (name, Resource.from_contents(load_schema(name), default_specification=DRAFT202012))
        for name in ("lint-report.schema.json", "validate-report.schema.json")
    )
    return jsonschema.Draft202012Validator(check_schema, registry=registry)


def test_check_schema_is_a_documented_draft_2020_12_schema(check_schema):
    assert check_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(check_schema)

    assert_schema_documented_and_closed(check_schema)


@pytest.fixture(scope="module")
def passing_report(tmp_path_factory):
    """A passing run with speed measured (two timed runs), its report and its summary."""
    folder = tmp_path_factory.mktemp("pass")
    out = folder / "report.json"
    before = os.getcwd()
    os.chdir(folder)  # no configuration file is found from here
    try:
        code, text, report = check(RESNET, "--speed", "--iterations", "2", "--warmup", "0", report=out)
    finally:
        os.chdir(before)
    return code, text, report, out


def test_check_passes_on_an_example_model(passing_report, validator, check_schema):
    code, text, report, _ = passing_report
    assert code == 0, text
    assert text.startswith(f"check {RESNET}\n")
    assert "validate (emulate on cpu): pass" in text or "validate (plain on cuda): pass" in text
    assert "speed-up" in text
    assert text.rstrip().endswith("result: PASS")
    validator.validate(report)
    assert set(report) == set(check_schema["properties"])
    assert report["gate"] == {
        "baseline": False,
        "blocking_findings": 0,
        "failed_outputs": [],
        "new_findings": [],
        "regressions": [],
        "passed": True,
    }
    assert report["converted"] is None and report["config"] is None and report["fail_on"] == "error"
    assert report["lint_original"]["models"][0]["mode"] == "prospective"
    assert report["lint_converted"]["models"][0]["mode"] == "actual"
    assert report["validation"]["passed"] is True and report["validation"]["speed"]["reference"]["iterations"] == 2


def test_the_schema_lists_exactly_the_keys_the_code_writes(passing_report, check_schema):
    report = passing_report[2]
    props = check_schema["properties"]
    assert set(props["gate"]["properties"]) == set(report["gate"])
    assert set(props["conversion"]["properties"]) == set(report["conversion"])
    assert set(props["conversion"]["properties"]["counts"]["properties"]) == set(report["conversion"]["counts"])


def _mutations():
    def setter(path, value):
        def mutate(report):
            node = report
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value

        return mutate

    return {
        "missing gate": lambda r: r.pop("gate"),
        "extra key": setter(["extra"], True),
        "extra gate key": setter(["gate", "verdict"], "pass"),
        "bad fail_on": setter(["fail_on"], "fatal"),
        "validation not a report": setter(["validation"], {"passed": True}),
        "lint report without diagnostics": lambda r: r["lint_converted"].pop("diagnostics"),
        "new finding without a code": setter(["gate", "new_findings"], [{"name": "x"}]),
        "string counts": setter(["conversion", "counts", "fp16"], "10"),
        "passed as string": setter(["gate", "passed"], "yes"),
    }


@pytest.mark.parametrize("what", list(_mutations()))
def test_broken_check_reports_do_not_validate(what, passing_report, validator):
    report = copy.deepcopy(passing_report[2])
    _mutations()[what](report)
    assert not validator.is_valid(report), what


# ---- thresholds from the configuration -------------------------------------------------------------


@pytest.mark.slow
def test_a_threshold_from_the_configuration_fails_the_gate(tmp_path, validator):
    config = tmp_path / "autocast-onnx.toml"
    config.write_text("atol = 1e-9\n")
    out = tmp_path / "report.json"
    proc = cli_proc("check", RESNET, *FAST, "--report-json", out, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ": FAIL; worst relative error" in proc.stdout
    assert "  failed output: logits" in proc.stdout
    assert proc.stdout.rstrip().endswith("result: FAIL")
    report = json.loads(out.read_text())
    validator.validate(report)
    assert report["config"] == str(config.resolve())
    assert report["validation"]["thresholds"]["atol"] == 1e-9
    assert report["gate"]["failed_outputs"] == ["logits"] == report["gate"]["regressions"]
    assert report["gate"]["passed"] is False
    # a flag beats the configuration
    assert cli_proc("check", RESNET, *FAST, "--atol", "1", cwd=tmp_path).returncode == 0


# ---- baselines -----------------------------------------------------------------------------------


def test_a_baseline_of_the_same_model_passes(passing_report, validator, tmp_path):
    baseline = passing_report[3]
    code, text, report = check(RESNET, *FAST, "--baseline", baseline, report=tmp_path / "again.json")
    assert code == 0, text
    assert text.rstrip().endswith("result: PASS (against the baseline)")
    assert report["gate"]["baseline"] is True and report["gate"]["passed"] is True
    validator.validate(report)


def test_a_threshold_that_passed_in_the_baseline_and_fails_now_is_a_regression(passing_report, tmp_path, validator):
    strict = tmp_path / "strict.toml"
    strict.write_text("atol = 1e-9\n")
    code, text, report = check(
        RESNET, *FAST, "--config", strict, "--baseline", passing_report[3], report=tmp_path / "now.json"
    )
    assert code == 1, text
    assert "  regression: logits" in text
    assert text.rstrip().endswith("result: FAIL (against the baseline)")
    assert report["gate"]["regressions"] == ["logits"] and report["gate"]["new_findings"] == []
    validator.validate(report)
    # an output that already failed in the baseline is not a regression
    failing = tmp_path / "failing.json"
    assert check(RESNET, *FAST, "--config", strict, report=failing)[0] == 1
    code, text, report = check(RESNET, *FAST, "--config", strict, "--baseline", failing)
    assert code == 0, text


def test_findings_already_in_the_baseline_are_not_new(tmp_path, validator):
    # Converted with its output head in fp16 too, the resnet has two info findings (AC402 on the
    # stem Conv and the head Gemm).
    head_off = tmp_path / "head-off.toml"
    head_off.write_text('[settings]\noutput_head = "off"\n')
    FAST = ("--no-speed", "--rules", head_off)
    first = tmp_path / "first.json"
    code, text, report = check(RESNET, *FAST, "--fail-on", "info", report=first)
    assert code == 1 and report["gate"]["blocking_findings"] == 2
    nodes = sorted(d["node"] for d in report["gate"]["new_findings"])
    assert len(nodes) == 2 and all(d["code"] == "AC402" for d in report["gate"]["new_findings"])
    assert "  finding AC402 tensor-core-alignment at " in text
    validator.validate(report)
    # the same run against its own report: nothing new
    code, text, again = check(RESNET, *FAST, "--fail-on", "info", "--baseline", first, report=tmp_path / "again.json")
    assert code == 0, text
    assert again["gate"]["blocking_findings"] == 2 and again["gate"]["new_findings"] == []

    # a baseline edited to hold no findings, then one finding key added back
    edited = json.loads(first.read_text())
    known, new = sorted(edited["lint_converted"]["diagnostics"], key=lambda d: d["node"])
    edited["lint_converted"]["diagnostics"] = []
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(edited))
    code, _, report = check(RESNET, *FAST, "--fail-on", "info", "--baseline", empty)
    assert code == 1
    edited["lint_converted"]["diagnostics"] = [known]
    one = tmp_path / "one.json"
    one.write_text(json.dumps(edited))
    code, text, report = check(RESNET, *FAST, "--fail-on", "info", "--baseline", one, report=tmp_path / "r.json")
    assert code == 1
    assert [d["node"] for d in report["gate"]["new_findings"]] == [new["node"]]
    assert f"  new finding AC402 tensor-core-alignment at {new['node']}: " in text
    assert f"at {known['node']}:" not in text


@pytest.mark.slow
def test_bad_baseline_exits_2_with_one_line(tmp_path):
    not_json = tmp_path / "notes.txt"
    not_json.write_text("not json\n")
    other = tmp_path / "lint.json"
    other.write_text(json.dumps({"schema_version": 1, "diagnostics": []}))
    proc = cli_proc("check", RESNET, "--no-validate", "--baseline", not_json, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_error_line(proc.stderr, str(not_json), "not a check report")
    for bad, why in ((other, "not a check report"), (tmp_path / "missing.json", "baseline file not found")):
        result = invoke("check", RESNET, "--no-validate", "--baseline", bad)
        assert result.exit_code == 2, result.output
        assert_one_error_line(result.stderr, str(bad), why)


# ---- options -------------------------------------------------------------------------------------


def test_no_validate_skips_validation(tmp_path, validator):
    code, text, report = check(RESNET, "--no-validate", report=tmp_path / "r.json")
    assert code == 0, text
    assert "  validate: skipped" in text
    assert report["validation"] is None and report["gate"]["failed_outputs"] == []
    validator.validate(report)


def test_output_keeps_the_converted_model(tmp_path, validator):
    out = tmp_path / "kept" / "resnet.fp16.onnx"
    out.parent.mkdir()
    code, text, report = check(RESNET, *FAST, "-o", out, report=tmp_path / "r.json")
    assert code == 0, text
    assert out.is_file()
    converted = onnx.load(out)
    onnx.checker.check_model(converted)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in converted.graph.initializer)
    assert report["converted"] == str(out)
    assert report["lint_converted"]["models"][0]["path"] == str(out)
    assert report["validation"]["converted"]["path"] == str(out)
    validator.validate(report)


def test_fail_on_from_the_configuration(tmp_path):
    config = tmp_path / "gate.toml"
    config.write_text('fail-on = "info"\n')
    code, _, report = check(RESNET, "--no-validate", "--config", config, report=tmp_path / "r.json")
    assert code == 1 and report["fail_on"] == "info" and report["config"] == str(config)
    assert check(RESNET, "--no-validate", "--config", config, "--fail-on", "error")[0] == 0


# ---- SARIF -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sarif_validator():
    assert SARIF_SCHEMA.is_file(), f"the SARIF 2.1.0 schema is expected at {SARIF_SCHEMA}"
    return jsonschema.Draft7Validator(json.loads(SARIF_SCHEMA.read_text(encoding="utf-8")))


def test_sarif_of_the_converted_model(tmp_path, sarif_validator):
    out = tmp_path / "resnet.fp16.onnx"
    sarif_path = tmp_path / "check.sarif"
    head_off = tmp_path / "head-off.toml"  # the head Gemm in fp16 too: two findings
    head_off.write_text('[settings]\noutput_head = "off"\n')
    code, _, report = check(
        RESNET, "--no-validate", "--rules", head_off, "-o", out, "--sarif", sarif_path, report=tmp_path / "r.json"
    )
    assert code == 0
    sarif = json.loads(sarif_path.read_text())
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    diagnostics = report["lint_converted"]["diagnostics"]
    assert len(run["results"]) == len(diagnostics) == 2
    for result, diag in zip(run["results"], diagnostics):
        assert result["ruleId"] == diag["code"] == rules[result["ruleIndex"]]["id"]
        assert result["level"] == "note"
        [location] = result["locations"]
        assert sarif_location_path(run, location["physicalLocation"]["artifactLocation"]) == out
        assert location["logicalLocations"][0]["name"] == diag["node"]
        assert location["logicalLocations"][0]["fullyQualifiedName"] == f"main::{diag['node']}"


def test_sarif_without_output_names_a_file_that_exists(tmp_path, sarif_validator):
    # Without -o the converted model lives in a temporary folder deleted before check exits; a
    # SARIF location naming it points nowhere (code scanning cannot show it). The location should
    # name a file that is still there: the checked MODEL.
    sarif_path = tmp_path / "check.sarif"
    code, _, _ = check(RESNET, "--no-validate", "--sarif", sarif_path)
    assert code == 0
    sarif = json.loads(sarif_path.read_text())
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    paths = {
        sarif_location_path(run, r["locations"][0]["physicalLocation"]["artifactLocation"]) for r in run["results"]
    }
    assert paths, "the converted resnet has two info findings"
    for path in paths:
        assert path.is_file(), f"SARIF location {path} does not exist after the run"
