"""The GitHub Action (action.yml, issue 31 item 3): its inputs are the ones examples/ci/README.md
documents, every input reaches the script that does the work (tools/action_run.py), and the
steps' own command lines run here as the runner runs them: the SARIF and the JSON report are
written, the verdict is the gate's (pass, findings, a failed threshold, bad input), and the
upload step comes before the step that fails the job."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers import F16, model, sarif_location_path, tensor
from onnx import helper, save_model

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
SCRIPT = ROOT / "tools" / "action_run.py"
CI_README = ROOT / "examples" / "ci" / "README.md"
WORKFLOW = ROOT / "examples" / "ci" / "github-actions-autocast-onnx.yml"
SARIF_SCHEMA = ROOT / "reference" / "sarif-schema-2.1.0.json"
RESNET = "examples/models/resnet_tiny.onnx"
DIGITS = "examples/models/digits_cnn.onnx"
BERT = "examples/models/bert_tiny.onnx"


@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))


def steps(action) -> list[dict]:
    return action["runs"]["steps"]


def step(action, name_part: str) -> dict:
    [found] = [s for s in steps(action) if name_part in s.get("name", "") or name_part in s.get("uses", "")]
    return found


def documented_inputs() -> dict[str, str]:
    """The rows of the inputs table in examples/ci/README.md: input name -> default as written."""
    text = CI_README.read_text(encoding="utf-8")
    section = text.split("### Inputs", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([^|]*) \|", section, flags=re.M)
    assert rows, "no inputs table under '### Inputs' in examples/ci/README.md"
    return {name: default.strip() for name, default in rows}


# ---- the YAML -------------------------------------------------------------------------------------


def test_action_is_a_composite_action_with_the_documented_inputs(action):
    assert action["runs"]["using"] == "composite"
    documented = documented_inputs()
    assert list(action["inputs"]) == list(documented), "action.yml and the README's table differ"
    for name, spec in action["inputs"].items():
        assert spec["description"], name
        written = documented[name]
        default = spec.get("default", "")
        expected = "(required)" if spec.get("required") else (f"`{default}`" if default else "empty")
        assert written == expected, f"{name}: README says {written}, action.yml {expected}"


def test_every_input_is_used_by_a_step(action):
    text = ACTION.read_text(encoding="utf-8").split("\nruns:", 1)[1]
    for name in action["inputs"]:
        assert f"inputs.{name}" in text, f"input {name} is declared but no step reads it"


def test_the_script_reads_exactly_the_inputs_the_steps_pass(action):
    passed = {
        key[len("INPUT_") :].lower().replace("_", "-")
        for s in steps(action)
        for key in s.get("env", {})
        if key.startswith("INPUT_")
    }
    for s in steps(action):
        for key, value in s.get("env", {}).items():
            if key.startswith("INPUT_"):
                name = key[len("INPUT_") :].lower().replace("_", "-")
                assert value == "${{ inputs." + name + " }}", key
    read = set(re.findall(r'\b(?:env|flag)\("([a-z-]+)"', SCRIPT.read_text(encoding="utf-8")))
    assert read == passed
    # the rest are the action's own: setup-python, the upload step and its category
    assert set(action["inputs"]) - passed == {"python-version", "category"}


def test_upload_runs_before_the_verdict_and_even_when_the_gate_failed(action):
    names = [s.get("id") or s.get("name") or s.get("uses") for s in steps(action)]
    upload = step(action, "github/codeql-action/upload-sarif@")
    verdict = step(action, "Fail on the gate")
    run = step(action, "autocast-onnx ${{ inputs.command }}")
    assert steps(action).index(run) < steps(action).index(upload) < steps(action).index(verdict), names
    assert upload["if"].startswith("always() && inputs.upload-sarif == 'true'")
    assert upload["with"]["sarif_file"] == "${{ steps.run.outputs.sarif }}"
    assert verdict["if"] == "always()"
    assert "--defer-exit" in run["run"], "the run step must not fail before the upload"


@pytest.mark.parametrize("code, expect", [("0", 0), ("1", 1), ("2", 2), ("", 2)])
def test_verdict_step_exits_with_the_gate_code(action, code, expect):
    verdict = step(action, "Fail on the gate")
    result = subprocess.run(["bash", "-c", verdict["run"]], env={**os.environ, "EXIT_CODE": code}, capture_output=True)
    assert result.returncode == expect, result.stdout


def test_the_example_workflow_uses_this_action(action):
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    [job] = workflow["jobs"].values()
    [use] = [s for s in job["steps"] if s.get("uses") == "./"]
    assert set(use["with"]) <= set(action["inputs"])
    assert job["permissions"]["security-events"] == "write"
    # the models it names exist here
    for pattern in use["with"]["models"].split():
        assert list(ROOT.glob(pattern)), pattern


def test_the_example_workflow_keeps_the_report_it_asks_for():
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    [job] = workflow["jobs"].values()
    [use] = [s for s in job["steps"] if s.get("uses") == "./"]
    [keep] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert keep["if"] == "always()" and keep["with"]["path"] == use["with"]["report-json"]


# ---- the steps, run as the runner runs them -------------------------------------------------------


def action_env(tmp_path: Path, **inputs: str) -> dict[str, str]:
    """The environment of a step: INPUT_* as action.yml's `env:` sets them, the runner's
    GITHUB_* variables, and the project's Python first on PATH as setup-python puts its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_", "AUTOCAST_ONNX_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env |= {
        "GITHUB_ACTION_PATH": str(ROOT),
        "GITHUB_WORKSPACE": str(ROOT),
        "GITHUB_OUTPUT": str(tmp_path / "github_output"),
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "owner/repo",
        "GITHUB_SHA": "0123abc",
        "AUTOCAST_ONNX_ACTION_REPOSITORY": "",
        "AUTOCAST_ONNX_ACTION_REF": "",
    }
    inputs = {"sarif": str(tmp_path / "out.sarif"), "report-json": str(tmp_path / "report.json")} | inputs
    env |= {"INPUT_" + k.upper().replace("-", "_"): v for k, v in inputs.items()}
    return env


def run_step(action, tmp_path: Path, **inputs: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """The action's run step, its own command line through bash, from the repository root (the
    checkout); returns the process and the step outputs it wrote."""
    command = step(action, "autocast-onnx ${{ inputs.command }}")["run"]
    result = subprocess.run(
        ["bash", "-c", command], env=action_env(tmp_path, **inputs), cwd=ROOT, capture_output=True, text=True
    )
    out = tmp_path / "github_output"
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines()) if out.is_file() else {}
    return result, outputs


@pytest.fixture(scope="module")
def sarif_validator():
    return jsonschema.Draft7Validator(json.loads(SARIF_SCHEMA.read_text(encoding="utf-8")))


def test_the_example_workflows_gate_passes_on_the_example_models(action, tmp_path, sarif_validator):
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    [use] = [s for s in next(iter(workflow["jobs"].values()))["steps"] if s.get("uses") == "./"]
    inputs = dict(use["with"]) | {"sarif": str(tmp_path / "out.sarif"), "report-json": str(tmp_path / "r.json")}
    result, outputs = run_step(action, tmp_path, **inputs)
    assert outputs["exit-code"] == "0", result.stdout + result.stderr
    assert result.stdout.count("result: PASS") == 2
    sarif_validator.validate(json.loads((tmp_path / "out.sarif").read_text()))
    report = json.loads((tmp_path / "r.json").read_text())
    assert [m["model"] for m in report["models"]] == use["with"]["models"].split()
    for entry in report["models"]:
        assert entry["report"]["gate"]["passed"] is True
        assert entry["report"]["validation"] is not None and entry["report"]["validation"]["passed"] is True


def test_check_that_passes(action, tmp_path, sarif_validator):
    result, outputs = run_step(action, tmp_path, models=RESNET, command="check")
    assert result.returncode == 0, result.stderr
    assert outputs == {
        "exit-code": "0",
        "sarif": str(tmp_path / "out.sarif"),
        "report-json": str(tmp_path / "report.json"),
    }
    assert "result: PASS" in result.stdout + result.stderr
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    assert run["results"], "the converted resnet_tiny has info findings"
    for r in run["results"]:
        artifact = r["locations"][0]["physicalLocation"]["artifactLocation"]
        assert artifact["uri"] == RESNET and artifact["uriBaseId"] == "%SRCROOT%"
        assert sarif_location_path(run, artifact) == ROOT / RESNET
    # uses: ./ here: the rules link to docs/rules.md of the workflow's repository at its commit
    assert run["tool"]["driver"]["rules"][0]["helpUri"].startswith(
        "https://github.com/owner/repo/blob/0123abc/docs/rules.md#ac101-"
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["command"] == "check" and report["exit_code"] == 0
    [entry] = report["models"]
    assert entry["model"] == RESNET and entry["exit_code"] == 0 and entry["report"]["gate"]["passed"] is True


def test_a_failed_threshold_fails_the_gate_and_still_writes_the_sarif(action, tmp_path):
    result, outputs = run_step(action, tmp_path, models=RESNET, args="--rtol 1e-9")
    assert result.returncode == 0, "the run step defers its verdict to the last step"
    assert outputs["exit-code"] == "1" and outputs["sarif"], result.stdout
    assert (tmp_path / "out.sarif").is_file()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["models"][0]["report"]["gate"]["passed"] is False


def test_fail_on_reaches_the_command(action, tmp_path):
    _, passing = run_step(action, tmp_path / "a", models=RESNET, **{"fail-on": "error"})
    _, failing = run_step(action, tmp_path / "b", models=RESNET, **{"fail-on": "info"})
    assert (passing["exit-code"], failing["exit-code"]) == ("0", "1")


def test_several_models_by_glob_give_one_sarif_run(action, tmp_path, sarif_validator):
    # bert_tiny converts without a finding: the first model with findings is resnet_tiny
    result, outputs = run_step(action, tmp_path, models=f"{BERT}\n  examples/models/resnet_*.onnx\n")
    assert outputs["exit-code"] == "0", result.stdout + result.stderr
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    assert run["artifacts"] == [{"location": {"uri": RESNET, "uriBaseId": "%SRCROOT%"}}]
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": ROOT.as_uri() + "/"}}
    for r in run["results"]:
        location = r["locations"][0]["physicalLocation"]["artifactLocation"]
        assert location == {"uri": RESNET, "uriBaseId": "%SRCROOT%", "index": 0}
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["model"] for m in report["models"]] == [BERT, RESNET]


def test_merged_sarif_keeps_each_models_location_and_fingerprint(action, tmp_path):
    """Two checks merged into one run give each result the location and fingerprint the model's
    own check gives it; a model in another checkout keeps its absolute URI."""
    other = tmp_path / "other"
    (other / ".git").mkdir(parents=True)
    second = fp16_softmax(other / "m" / "attn.onnx")
    result, outputs = run_step(action, tmp_path, models=f"{RESNET} {second}", args="--no-validate")
    assert outputs["exit-code"] == "0", result.stdout + result.stderr
    [run] = json.loads((tmp_path / "out.sarif").read_text())["runs"]
    uris = [a["location"] for a in run["artifacts"]]
    assert uris == [{"uri": RESNET, "uriBaseId": "%SRCROOT%"}, {"uri": second.as_uri()}]
    run_step(action, tmp_path / "single", models=str(second), args="--no-validate")
    [alone] = json.loads((tmp_path / "single" / "out.sarif").read_text())["runs"]
    assert alone["results"] and alone["originalUriBaseIds"] == {"%SRCROOT%": {"uri": other.as_uri() + "/"}}
    merged_fps = [
        r["partialFingerprints"]
        for r in run["results"]
        if r["locations"][0]["physicalLocation"]["artifactLocation"]["index"] == 1
    ]
    assert merged_fps == [r["partialFingerprints"] for r in alone["results"]]


def fp16_softmax(path: Path) -> Path:
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model(nodes, [tensor("x", F16, [2, 12])], [tensor("y", F16, [2, 12])]), path)
    return path


def test_lint_over_models_one_report(action, tmp_path, sarif_validator):
    bad = fp16_softmax(tmp_path / "models" / "bad.onnx")
    result, outputs = run_step(action, tmp_path, models=f"{RESNET} {bad}", command="lint")
    assert result.returncode == 0 and outputs["exit-code"] == "1", result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["path"] for m in report["models"]] == [RESNET, str(bad)]
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    sarif_validator.validate(sarif)
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == [d["code"] for d in report["diagnostics"]]
    assert "AC101" in [d["code"] for d in report["diagnostics"]]


@pytest.mark.parametrize(
    "inputs, where",
    [
        ({"models": RESNET, "command": "convert"}, "command"),
        ({"models": "examples/models/nothing_*.onnx"}, "models"),
        ({"models": "  "}, "models"),
        ({"models": RESNET, "upload-sarif": "yes"}, "upload-sarif"),
        ({"models": RESNET, "speed": "maybe"}, "speed"),
        ({"models": RESNET, "args": "--rtol '0.1"}, "args"),
        ({"models": f"{RESNET} {DIGITS}", "args": "-o out.onnx"}, "args"),
        ({"models": RESNET, "speed": "true", "args": "--no-validate"}, "speed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(action, tmp_path, inputs, where):
    result, outputs = run_step(action, tmp_path, **inputs)
    assert result.returncode == 0 and outputs == {"exit-code": "2", "sarif": "", "report-json": ""}
    [line] = result.stderr.splitlines()
    assert line.startswith(f"autocast-onnx: error: {where}: ") and line.endswith(")"), line


def test_a_model_that_does_not_exist_is_the_commands_exit_2(action, tmp_path):
    result, outputs = run_step(action, tmp_path, models=f"missing.onnx {RESNET}")
    assert outputs["exit-code"] == "2", result.stdout
    assert "Traceback" not in result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(m["model"], m["exit_code"]) for m in report["models"]] == [("missing.onnx", 2), (RESNET, 0)]
    assert report["models"][0]["report"] is None
    assert outputs["sarif"], "the other model's findings are still uploaded"


def test_a_previous_runs_sarif_is_not_passed_off_as_this_ones(action, tmp_path):
    (tmp_path / "out.sarif").write_text("{}")
    _, outputs = run_step(action, tmp_path, models="missing.onnx")
    assert outputs == {"exit-code": "2", "sarif": "", "report-json": str(tmp_path / "report.json")}
    assert not (tmp_path / "out.sarif").exists()


def test_without_defer_exit_the_script_exits_with_the_verdict(tmp_path):
    env = action_env(tmp_path, models=RESNET, **{"fail-on": "info"})
    result = subprocess.run([sys.executable, str(SCRIPT), "run"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr


def test_a_remote_use_links_rules_to_the_actions_revision(action, tmp_path):
    env = action_env(tmp_path, models=RESNET)
    env |= {"AUTOCAST_ONNX_ACTION_REPOSITORY": "someone/autocast-onnx", "AUTOCAST_ONNX_ACTION_REF": "v1"}
    env["GITHUB_ACTION_PATH"] = str(tmp_path / "_actions" / "someone" / "autocast-onnx" / "v1")
    command = step(action, "autocast-onnx ${{ inputs.command }}")["run"].replace("$GITHUB_ACTION_PATH", str(ROOT))
    subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, check=True, capture_output=True)
    rule = json.loads((tmp_path / "out.sarif").read_text())["runs"][0]["tool"]["driver"]["rules"][0]
    assert (
        rule["helpUri"]
        == "https://github.com/someone/autocast-onnx/blob/v1/docs/rules.md#ac101-softmax-in-low-precision"
    )


# ---- the install step -----------------------------------------------------------------------------


def load_script():
    spec = importlib.util.spec_from_file_location("action_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_install_step_installs_the_actions_checkout_by_default(action, monkeypatch):
    install = step(action, "Install autocast-onnx")
    assert install["run"] == 'python "$GITHUB_ACTION_PATH/tools/action_run.py" install'
    assert install["env"] == {"INPUT_PACKAGE": "${{ inputs.package }}"}
    script = load_script()
    monkeypatch.setenv("GITHUB_ACTION_PATH", "/runner/_actions/o/autocast-onnx/v1")
    monkeypatch.delenv("INPUT_PACKAGE", raising=False)
    assert script.pip_command()[1:] == ["-m", "pip", "install", "/runner/_actions/o/autocast-onnx/v1[cpu]"]
    monkeypatch.setenv("INPUT_PACKAGE", "autocast-onnx[cpu]==0.1.0 onnxruntime==1.20.1")
    assert script.pip_command()[4:] == ["autocast-onnx[cpu]==0.1.0", "onnxruntime==1.20.1"]


def test_setup_python_is_skipped_without_a_version(action):
    setup = steps(action)[0]
    assert setup["uses"].startswith("actions/setup-python@") and setup["if"] == "inputs.python-version != ''"
    assert setup["with"] == {"python-version": "${{ inputs.python-version }}"}


def test_lint_findings_keep_their_data_through_the_script(tmp_path):
    """run_lint builds the SARIF from the JSON report's findings: the same SARIF lint writes."""
    bad = fp16_softmax(tmp_path / "m" / "bad.onnx")
    direct = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "lint", str(bad), "--format", "sarif"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=action_env(tmp_path) | {"AUTOCAST_ONNX_DOCS_URL": "https://github.com/owner/repo/blob/0123abc/docs/"},
    )
    run_inputs = {"models": str(bad), "command": "lint", "sarif": str(tmp_path / "via.sarif")}
    subprocess.run(
        [sys.executable, str(SCRIPT), "run"], env=action_env(tmp_path, **run_inputs), cwd=ROOT, capture_output=True
    )
    assert json.loads((tmp_path / "via.sarif").read_text()) == json.loads(direct.stdout)
