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

ROOT = Path(__file__).resolve().parents[2]
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
    return result, step_outputs(tmp_path / "github_output")


def step_outputs(path: Path) -> dict[str, str]:
    """The step outputs in `path` as the runner reads $GITHUB_OUTPUT: `key=value` lines and
    `key<<DELIMITER` blocks, the last value of a key winning."""
    if not path.is_file():
        return {}
    lines = path.read_bytes().decode("utf-8", "surrogateescape").split("\n")
    outputs, k = {}, 0
    while k < len(lines):
        line = lines[k]
        k += 1
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, k)
            outputs[key] = "\n".join(lines[k:end])
            k = end + 1
        else:
            key, value = line.split("=", 1)
            outputs[key] = value
    return outputs


@pytest.fixture(scope="module")
def sarif_validator():
    return jsonschema.Draft7Validator(json.loads(SARIF_SCHEMA.read_text(encoding="utf-8")))


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_failed_threshold_fails_the_gate_and_still_writes_the_sarif(action, tmp_path):
    result, outputs = run_step(action, tmp_path, models=RESNET, args="--rtol 1e-9")
    assert result.returncode == 0, "the run step defers its verdict to the last step"
    assert outputs["exit-code"] == "1" and outputs["sarif"], result.stdout
    assert (tmp_path / "out.sarif").is_file()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["models"][0]["report"]["gate"]["passed"] is False


@pytest.mark.slow
def test_fail_on_reaches_the_command(action, tmp_path):
    _, passing = run_step(action, tmp_path / "a", models=RESNET, **{"fail-on": "error"})
    _, failing = run_step(action, tmp_path / "b", models=RESNET, **{"fail-on": "info"})
    assert (passing["exit-code"], failing["exit-code"]) == ("0", "1")


@pytest.mark.slow
def test_several_models_by_glob_give_one_sarif_run(action, tmp_path, sarif_validator):
    # both models' conversions have findings (bert_tiny: AC305, the Cast before the LayerNormalization
    # that feeds its fp32 output head), so the one run lists both, each result at its own artifact
    result, outputs = run_step(action, tmp_path, models=f"{BERT}\n  examples/models/resnet_*.onnx\n")
    assert outputs["exit-code"] == "0", result.stdout + result.stderr
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    uris = [a["location"]["uri"] for a in run["artifacts"]]
    assert uris == [BERT, RESNET]
    assert all(a["location"]["uriBaseId"] == "%SRCROOT%" for a in run["artifacts"])
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": ROOT.as_uri() + "/"}}
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == set(uris)
    for r in run["results"]:
        location = r["locations"][0]["physicalLocation"]["artifactLocation"]
        assert location["index"] == uris.index(location["uri"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["model"] for m in report["models"]] == [BERT, RESNET]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_model_that_does_not_exist_is_the_commands_exit_2(action, tmp_path):
    result, outputs = run_step(action, tmp_path, models=f"missing.onnx {RESNET}")
    assert outputs["exit-code"] == "2", result.stdout
    assert "Traceback" not in result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(m["model"], m["exit_code"]) for m in report["models"]] == [("missing.onnx", 2), (RESNET, 0)]
    assert report["models"][0]["report"] is None
    assert outputs["sarif"], "the other model's findings are still uploaded"


@pytest.mark.slow
def test_a_previous_runs_sarif_is_not_passed_off_as_this_ones(action, tmp_path):
    (tmp_path / "out.sarif").write_text("{}")
    _, outputs = run_step(action, tmp_path, models="missing.onnx")
    assert outputs == {"exit-code": "2", "sarif": "", "report-json": str(tmp_path / "report.json")}
    assert not (tmp_path / "out.sarif").exists()


@pytest.mark.slow
def test_without_defer_exit_the_script_exits_with_the_verdict(tmp_path):
    env = action_env(tmp_path, models=RESNET, **{"fail-on": "info"})
    result = subprocess.run([sys.executable, str(SCRIPT), "run"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr


@pytest.mark.slow
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


@pytest.mark.slow
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


# ---- hostile inputs (issue 36, defects 1 and 8) ---------------------------------------------------


def runner_commands(log: str) -> list[str]:
    """The workflow commands the runner would act on in a step's log (stdout and stderr as one
    stream): every line that starts with `::`, except while `::stop-commands::TOKEN` holds, up
    to its `::TOKEN::`. The runner's own markers are left out."""
    commands, stopped = [], None
    for line in log.split("\n"):
        text = line.lstrip()
        if stopped is not None:
            if text == f"::{stopped}::":
                stopped = None
            continue
        if text.startswith("::stop-commands::"):
            stopped = text[len("::stop-commands::") :]
        elif text.startswith("::"):
            commands.append(text)
    return commands


FORGED = "x\n::error file=forged.onnx,line=1::forged\n::set-output name=exit-code::0\r\x1b]0;pwned\x07\x1b[2J"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sarif", "report-json"])
def test_a_newline_in_an_output_path_cannot_turn_a_failed_gate_green(action, tmp_path, name):
    """Minimal reproduction: `sarif: "out\\nexit-code=0"` wrote a second exit-code line to
    $GITHUB_OUTPUT, which the runner takes (the last wins), so a failed gate read as 0."""
    hostile = str(tmp_path / "out") + "\nexit-code=0"
    result, outputs = run_step(action, tmp_path, models=RESNET, args="--rtol 1e-9", **{name: hostile})
    assert outputs["exit-code"] == "1", result.stdout + result.stderr
    assert outputs[name] == hostile and Path(hostile).is_file()
    verdict = step(action, "Fail on the gate")
    gate = subprocess.run(["bash", "-c", verdict["run"]], env={**os.environ, "EXIT_CODE": outputs["exit-code"]})
    assert gate.returncode == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sarif", "report-json"])
def test_a_carriage_return_in_an_output_path_is_refused(action, tmp_path, name):
    result, outputs = run_step(action, tmp_path, models=RESNET, **{name: str(tmp_path / "out\r.json")})
    assert outputs == {"exit-code": "2", "sarif": "", "report-json": ""}
    [line] = result.stderr.splitlines()
    assert line.startswith(f"autocast-onnx: error: {name}: ") and "carriage return" in line
    assert not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("code", ["0\nexit-code=0", "1 ", "-9", "137", "x"])
def test_the_verdict_step_refuses_a_code_autocast_onnx_does_not_give(action, code):
    verdict = step(action, "Fail on the gate")
    result = subprocess.run(["bash", "-c", verdict["run"]], env={**os.environ, "EXIT_CODE": code}, capture_output=True)
    assert result.returncode == 2 and b"::error::" in result.stdout


KILLER = """import os, signal, sys
if sys.argv[1:2] == [os.environ["KILL_COMMAND"]] and any("KILLME" in a for a in sys.argv):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def killing_env(tmp_path: Path, command: str) -> dict[str, str]:
    """A sitecustomize that kills (SIGKILL, as the OOM killer does) any `python -m autocast_onnx
    COMMAND` run whose arguments name a file with KILLME in it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILLER)
    return {"PYTHONPATH": str(hook), "KILL_COMMAND": command}


@pytest.mark.slow
def test_a_check_killed_by_a_signal_fails_the_gate(action, tmp_path, monkeypatch):
    """Minimal reproduction: a check killed by SIGKILL (returncode -9) beside a passing one gave
    max(-9, 0) = 0, a passing verdict."""
    killed = tmp_path / "KILLME.onnx"
    killed.write_bytes((ROOT / RESNET).read_bytes())
    for key, value in killing_env(tmp_path, "check").items():
        monkeypatch.setenv(key, value)
    result, outputs = run_step(action, tmp_path, models=f"{killed} {RESNET}", args="--no-validate")
    assert outputs["exit-code"] == "3", result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 3
    first, second = report["models"]
    assert (first["exit_code"], first["report"], first["ended"]) == (-9, None, "killed by signal 9 (SIGKILL)")
    assert second["exit_code"] == 0 and second["report"]["gate"]["passed"] is True
    assert f"::error::autocast-onnx check of {killed} did not end normally: killed by signal 9" in result.stderr


@pytest.mark.slow
def test_a_lint_killed_by_a_signal_fails_the_gate(action, tmp_path, monkeypatch):
    killed = tmp_path / "KILLME.onnx"
    killed.write_bytes((ROOT / RESNET).read_bytes())
    for key, value in killing_env(tmp_path, "lint").items():
        monkeypatch.setenv(key, value)
    result, outputs = run_step(action, tmp_path, models=str(killed), command="lint")
    assert outputs == {"exit-code": "3", "sarif": "", "report-json": ""}, result.stdout + result.stderr
    assert "did not end normally: killed by signal 9 (SIGKILL)" in result.stderr


@pytest.mark.slow
def test_names_from_models_and_paths_cannot_forge_commands_or_reach_the_terminal(action, tmp_path):
    """Minimal reproduction: a model file name holding a newline and `::error file=...::` (or
    `::set-output`) was echoed raw into the job's log, where the runner took it for a command, and
    terminal escapes reached the log as they were. The step runs as in Actions (GITHUB_ACTIONS)."""
    models = tmp_path / "models"
    models.mkdir()
    hostile = models / f"m{FORGED}.onnx"
    hostile.write_bytes((ROOT / RESNET).read_bytes())
    env = action_env(tmp_path, models=f"{models}/*.onnx", args="--no-validate") | {"GITHUB_ACTIONS": "true"}
    command = step(action, "autocast-onnx ${{ inputs.command }}")["run"]
    result = subprocess.run(
        ["bash", "-c", command], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    log = result.stdout.decode("utf-8", "surrogateescape")
    assert step_outputs(tmp_path / "github_output")["exit-code"] == "0", log
    assert runner_commands(log) == [], log
    for raw in ("\r", "\x1b", "\x07"):
        assert raw not in log
    assert "m" + FORGED.encode("unicode_escape").decode() in log, "the name is shown, escaped"
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["model"] for m in report["models"]] == [str(hostile)]


def test_a_hostile_name_in_the_actions_own_warning_stays_one_annotation(tmp_path, capsys):
    script = load_script()
    script.annotation("warning", f"models: {FORGED} is y (through a link); checked once")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("::warning::models: x\\n::error") and "%" not in line.replace("%0A", "")


# ---- globs without links --------------------------------------------------------------------------


def tree(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")


GLOB_PATTERNS = [
    "**/*.onnx",
    "models/**/*.onnx",
    "models/**",
    "models/**/",
    "**/",
    "**",
    "m*/**/b/*.onnx",
    "*/**/*.onnx",
    "models/**/a/**/*.onnx",
    "models/*/*.onnx",
    "**/x/*.onnx",
    "nothing/**/*.onnx",
    "models/m.onnx",
]


@pytest.mark.parametrize("pattern", GLOB_PATTERNS)
@pytest.mark.parametrize("absolute", [False, True])
def test_expand_glob_matches_glob_where_there_is_no_link(tmp_path, monkeypatch, pattern, absolute):
    tree(tmp_path, ["models/m.onnx", "models/a/n.onnx", "models/a/b/o.onnx", "models/.hid/h.onnx"])
    tree(tmp_path, ["models/a/.q.onnx", "other/x/p.onnx", "top.onnx", "models/a/b/notes.txt"])
    monkeypatch.chdir(tmp_path)
    pattern = f"{tmp_path}/{pattern}" if absolute else pattern
    import glob

    assert sorted(load_script().expand_glob(pattern)) == sorted(glob.glob(pattern, recursive=True))


@pytest.mark.slow
def test_a_link_loop_under_a_glob_checks_each_model_once(action, tmp_path):
    """Minimal reproduction: one link back up (models/a/loop -> ..) under models/**/*.onnx gave
    the one model 41 times; glob follows links to folders while expanding **."""
    bad = fp16_softmax(tmp_path / "models" / "a" / "bad.onnx")
    (tmp_path / "models" / "a" / "loop").symlink_to("..")
    result, outputs = run_step(action, tmp_path, models=f"{tmp_path}/models/**/*.onnx", command="lint")
    assert outputs["exit-code"] == "1", result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["path"] for m in report["models"]] == [str(bad)]


@pytest.mark.slow
def test_two_link_loops_under_a_glob_end(action, tmp_path):
    """Minimal reproduction: two links back up made glob's expansion of ** exponential: it never
    ended."""
    bad = fp16_softmax(tmp_path / "models" / "a" / "bad.onnx")
    (tmp_path / "models" / "a" / "up").symlink_to("..")
    (tmp_path / "models" / "a" / "top").symlink_to("../..")
    command = step(action, "autocast-onnx ${{ inputs.command }}")["run"]
    env = action_env(tmp_path, models=f"{tmp_path}/models/**/*.onnx", command="lint")
    subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, capture_output=True, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["path"] for m in report["models"]] == [str(bad)]


@pytest.mark.slow
def test_a_model_reached_twice_is_checked_once_with_a_warning(action, tmp_path):
    bad = fp16_softmax(tmp_path / "models" / "bad.onnx")
    (tmp_path / "models" / "same.onnx").symlink_to("bad.onnx")
    result, _ = run_step(action, tmp_path, models=f"{tmp_path}/models/*.onnx {bad}", command="lint")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["path"] for m in report["models"]] == [str(bad)]
    assert f"::warning::models: {tmp_path}/models/same.onnx is {bad} (through a link); checked once" in result.stderr


@pytest.mark.slow
def test_check_over_a_folder_does_not_follow_a_link_loop(action, tmp_path):
    bad = fp16_softmax(tmp_path / "models" / "a" / "bad.onnx")
    (tmp_path / "models" / "a" / "loop").symlink_to("..")
    result, _ = run_step(action, tmp_path, models=str(tmp_path / "models"), args="--no-validate")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [m["model"] for m in report["models"]] == [str(bad)], result.stdout + result.stderr
