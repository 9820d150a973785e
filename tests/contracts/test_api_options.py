"""The Python API takes the command line's options, through the same builders.

For each call (convert, validate, lint, explain, check, diagnose) the keyword set is derived from
the click command's parameters (autocast_onnx/cli/main.py), renamed where the API spells a name
otherwise (RENAMED), less the options that only make sense on a command line (CLI_ONLY), plus
the keywords only the API has (API_ONLY), each with the reason. The API function must accept
exactly that set: a new CLI option without its keyword, or a new keyword without its option,
fails here until it is added or listed with its reason. The planning options are declared once,
by PlanOptions' fields (plan/options.py); what is derived from them is checked here too."""

from __future__ import annotations

import inspect
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx import AutocastError, api, config, pipeline
from autocast_onnx.cli import main as cli_main
from autocast_onnx.plan.options import PLANNING, PlanOptions, cli_name, plan_options, planning_fields
from autocast_onnx.plan.vocab import Precision

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "models" / "digits_cnn.onnx"  # the smallest shipped example model

# CLI parameter name -> the API keyword that takes it
RENAMED = {
    "exclude_op": "exclude_ops",
    "include_op": "include_ops",
    "exclude_node": "exclude_nodes",
    "include_node": "include_nodes",
    "plan_file": "plan",
    "targets": "target",
    "op_type": "op",
}

# options every command may have that no API call takes
GENERAL = {
    "config": "the API reads no configuration file: its keywords are all there is",
    "verbose": "logging: configure the 'autocast_onnx' logger",
    "quiet": "the API prints nothing",
}
REPORTS = {
    "report_json": "the result holds the report (to_dict(), report); writing it is the caller's",
    "report_html": "ValidationReport and DiagnoseReport give the page (html()); writing it is the caller's",
}
# convert --validate's comparison: autocast_onnx.validate(...) is a call of its own
COMPARISON = ("numerics", "atol", "rtol", "min_cosine", "min_top1", "class_outputs", "generate", "speed")
COMPARISON += ("iterations", "warmup", "min_iou")
COMPARISON += ("save_inputs",)

CLI_ONLY: dict[str, dict[str, str]] = {
    "convert": GENERAL
    | REPORTS
    | dict.fromkeys(COMPARISON, "convert --validate's comparison: validate() is a call of its own")
    | {
        "output": "convert returns the model; convert_file(model, out) writes it",
        "plan_out": "result.plan.save(path)",
        "external_data": "convert_file writes the model; convert returns it",
        "run_validate": "validate() is a call of its own",
        "models": "convert takes one model (`model`); converting several is a loop of the caller's",
        "jobs": "how many models the command line converts at once: a loop of the caller's in the API",
    },
    "validate": GENERAL | REPORTS,
    "lint": GENERAL
    | {
        "fmt": "LintReport holds the findings; text() gives the text format",
        "output": "LintReport is returned; writing it is the caller's",
        "statistics": "LintReport.counts()",
        "exit_zero": "the API has no exit code: LintReport.passed",
        "show_protected": "LintReport.text(show_protected=True)",
        "jobs": "how many models the command line lints at once, in processes: the caller's in the API",
    },
    "explain": GENERAL,
    "check": GENERAL
    | REPORTS
    | {"sarif": "CheckResult.diagnostics; writing SARIF is the caller's (lint.report.sarif_json)"},
    "diagnose": GENERAL | REPORTS,
}

FROM_DATA = "what plan_on_data measured (calibration ranges, the search's fp32 nodes), for a conversion of one's own"
OPTIONS = "the planning options as one PlanOptions object instead of keywords"
VERDICT = "a Python callable that judges the search's tries: a command line cannot pass one"
API_ONLY: dict[str, dict[str, str]] = {
    "convert": {"copy": "an in-memory model is copied unless copy=False", "calibration": FROM_DATA}
    | {"model": "one model per call: the command line's MODELS (several) are a loop of calls"}
    | {"force_fp32": FROM_DATA, "options": OPTIONS, "verdict": VERDICT},
    "validate": {},
    "lint": {},
    # explain plans as convert does, and converts when a keyword needs the whole conversion
    "explain": dict.fromkeys(
        ("target", "inputs", "dims", "ranges", "batches", "seed", "device", "check", "loss_scale")
        + ("map_threshold", "compare_padded"),
        "explain takes convert's keywords (the search's target and inputs, the check level, ...)",
    )
    | {"copy": "an in-memory model is copied unless copy=False", "calibration": FROM_DATA, "force_fp32": FROM_DATA}
    | {"options": OPTIONS, "strict": "convert's planning keyword: a selector that matches nothing is an error"}
    | {"verdict": VERDICT},
    "check": {},
    "diagnose": {},
}


def accepted(fn) -> set[str]:
    """The keywords (and positional names) a function accepts: its own parameters, and for a
    `**options` the keywords of the call it hands them to (PASS_THROUGH)."""
    names = set()
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            names |= PASS_THROUGH[fn]()
        else:
            names.add(param.name)
    return names


# where each function's **options go (read from the code: api.convert hands them to
# pipeline.convert, explain to plan_model or api.convert, check and the pipeline's calls take
# PlanOptions' fields through the builder)
PASS_THROUGH = {
    api.convert: lambda: accepted(pipeline.convert),
    api.explain: lambda: accepted(api.convert) | accepted(pipeline.plan_model),
    api.check: lambda: set(PLANNING),
    pipeline.convert: lambda: set(PLANNING),
    pipeline.plan_model: lambda: set(PLANNING),
}

CALLS = {
    "convert": api.convert,
    "validate": api.validate,
    "lint": api.lint,
    "explain": api.explain,
    "check": api.check,
    "diagnose": autocast_onnx.diagnose,
}


def cli_params(command: str) -> set[str]:
    return {param.name for param in cli_main.cli.commands[command].params if param.name}


@pytest.mark.parametrize("command", sorted(CALLS))
def test_each_api_call_takes_exactly_its_commands_options(command):
    cli = {RENAMED.get(name, name) for name in cli_params(command) - set(CLI_ONLY[command])}
    api_side = accepted(CALLS[command]) - set(API_ONLY[command])
    assert not cli - api_side, f"`autocast-onnx {command}` options without an API keyword: {sorted(cli - api_side)}"
    assert not api_side - cli, f"{command}() keywords without a `{command}` option: {sorted(api_side - cli)}"


@pytest.mark.parametrize("command", sorted(CALLS))
def test_the_tables_name_real_options_and_keywords(command):
    """A stale entry would hide a mismatch: every listed name exists on its side (GENERAL lists
    what any command may have)."""
    assert set(CLI_ONLY[command]) - set(GENERAL) <= cli_params(command)
    assert set(API_ONLY[command]) <= accepted(CALLS[command])
    assert set(API_ONLY[command]).isdisjoint(RENAMED.get(n, n) for n in cli_params(command))


def test_the_derivation_sees_a_missing_keyword():
    """The comparison above fails when the two sides differ (here: lint without `ignore`)."""

    def lint(*models, select=(), fail_on="error", precision=None, rules=(), exclude_ops=(), include_ops=(),
             exclude_nodes=(), include_nodes=(), opset=None, runtime=None, precise=None):  # fmt: skip
        raise AssertionError("not called")

    cli = {RENAMED.get(name, name) for name in cli_params("lint") - set(CLI_ONLY["lint"])}
    assert cli - accepted(lint) == {"ignore"}


# ---- one declaration per planning option --------------------------------------------------------


def test_every_planning_option_is_a_flag_of_the_planning_commands_and_a_configuration_key():
    for option in planning_fields():
        for command in ("convert", "check"):
            params = {p.name: p for p in cli_main.cli.commands[command].params}
            assert option.metadata["flag"] in params[cli_name(option)].opts, (option.name, command)
        assert option.metadata["replay"] in ("refused", "compared", "allowed")
    keys = tuple(f.metadata["key"] for f in planning_fields() if f.metadata["key"])
    assert config.PLAN_KEYS == keys and set(keys) <= set(config.ALL_KEYS)
    assert set(PLANNING) == {f.name for f in fields(PlanOptions)} - {"source"}
    refused = {f.metadata["flag"] for f in planning_fields() if f.metadata["replay"] == "refused"}
    assert refused | {"--calibration-data", "--target"} == set(pipeline._PLANNING_FLAGS.values())


def test_the_builder_lets_flags_win_and_keeps_not_given_apart():
    settings = {"precision": "bf16", "exclude_op": ["Softmax"], "keep_io_types": False, "_source": "cfg"}
    built = plan_options(settings, exclude_ops=("Add",), rules=[], precision=None)
    assert built.precision is Precision.BF16 and built.exclude_ops == ("Add",) and built.keep_io_types is False
    assert built.source == "cfg"
    bare = plan_options()
    assert bare.precision is None and bare.keep_io_types is None and bare.target is Precision.FP16
    assert bare == PlanOptions()
    with pytest.raises(TypeError, match="exclude_op"):
        plan_options(exclude_op=["Add"])
    with pytest.raises(AutocastError, match="unknown precision"):
        plan_options(precision="fp8")


def _small_model():
    return parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            [mm] h = MatMul(x, w)
            [add] a = Add(h, x)
            [sm] y = Softmax<axis = -1>(a)
        }""",
        w=randn([8, 8], 3),
    )


def test_keywords_and_an_options_object_convert_alike_and_not_both():
    model = _small_model()
    by_keywords = pipeline.convert(model, precision="bf16", exclude_ops=["Add"])
    by_object = pipeline.convert(model, options=PlanOptions(precision="bf16", exclude_ops=("Add",)))
    assert by_keywords.model.SerializeToString() == by_object.model.SerializeToString()
    assert by_keywords.plan.by_name("add")[0].precision == "fp32"
    with pytest.raises(TypeError, match="not both"):
        pipeline.convert(model, options=PlanOptions(), precision="bf16")
    with pytest.raises(TypeError, match="unexpected keyword argument 'exclude_op'"):
        autocast_onnx.convert(model, exclude_op=["Add"])


def test_a_replayed_plan_decides_what_the_options_leave_unsaid(tmp_path):
    model = _small_model()
    plan = pipeline.convert(model, precision="bf16").plan
    plan.save(tmp_path / "plan.json")
    replayed = pipeline.convert(model, plan=tmp_path / "plan.json", options=PlanOptions())
    assert replayed.plan.target is Precision.BF16
    with pytest.raises(AutocastError, match="--precision fp16 contradicts"):
        pipeline.convert(model, plan=tmp_path / "plan.json", options=PlanOptions(precision="fp16"))
    with pytest.raises(AutocastError, match="--exclude-op cannot be combined with --plan"):
        pipeline.convert(model, plan=tmp_path / "plan.json", exclude_ops=["Add"])


# ---- check ----------------------------------------------------------------------------------------


def test_check_takes_the_commands_options_as_keywords(tmp_path):
    first = autocast_onnx.check(DIGITS, speed=False)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(first.report, indent=1, default=float, allow_nan=False))
    result = autocast_onnx.check(
        str(DIGITS), precision="bf16", rtol=0.05, speed=False, fail_on="warning", baseline=str(report)
    )
    assert isinstance(result, autocast_onnx.CheckResult)
    assert result.report["conversion"]["precision"] == "bf16" and result.report["fail_on"] == "warning"
    assert result.report["gate"]["baseline"] and result.report["validation"]["speed"] is None
    assert result.report["validation"]["thresholds"]["rtol"] == 0.05
    shown = repr(result)
    assert shown.startswith("CheckResult(") and "bf16" in shown and "against the baseline" in shown
    assert "object at 0x" not in shown and result.text().startswith(f"check {DIGITS}")


def test_check_refuses_bad_keywords_as_the_command_line_does(tmp_path):
    with pytest.raises(AutocastError, match="baseline file not found"):
        autocast_onnx.check(DIGITS, baseline=tmp_path / "missing.json", speed=False)
    bad = {
        "fail_on": "sometimes",
        "precision": "fp8",
        "batches": 0,
        "device": "tpu",
        "rtol": -1.0,
        "exclude_ops": ["Nope"],
        "dims": {"batch": 0},
    }
    for keyword, value in bad.items():
        with pytest.raises(AutocastError):
            autocast_onnx.check(DIGITS, **{keyword: value})
    with pytest.raises(AutocastError, match="rtol= has no effect with skip_validate=True"):
        autocast_onnx.check(DIGITS, skip_validate=True, rtol=0.05)
    with pytest.raises(AutocastError, match="seed= has no effect with inputs="):
        autocast_onnx.check(DIGITS, inputs=tmp_path / "b.npz", seed=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'exclude_op'"):
        autocast_onnx.check(DIGITS, exclude_op=["Add"])


# ---- diagnose ------------------------------------------------------------------------------------


def test_diagnose_returns_a_typed_report_the_command_line_writes_as_it_is(tmp_path):
    reference, converted = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(_small_model(), reference)
    autocast_onnx.convert_file(reference, converted)
    np.savez(tmp_path / "b.npz", x=randn([2, 8], 5))
    report = autocast_onnx.diagnose(reference, converted, inputs=tmp_path / "b.npz")
    assert isinstance(report, autocast_onnx.DiagnoseReport)
    shown = repr(report)
    assert shown.startswith(f"DiagnoseReport({converted} against {reference}: y: error ") and "object at" not in shown
    assert report["outputs"] == report.outputs and report.nodes and report.to_dict()["kind"] == "diagnose"
    written = tmp_path / "d.json"
    outcome = CliRunner().invoke(
        cli_main.cli,
        [
            "diagnose",
            str(reference),
            str(converted),
            "--inputs",
            str(tmp_path / "b.npz"),
            "--report-json",
            str(written),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    assert written.read_text() == json.dumps(report.to_dict(), indent=1) + "\n"
    assert outcome.stdout.rstrip("\n") == report.text()


# ---- generated-input options beside given inputs: one refusal -------------------------------------


@pytest.mark.parametrize(
    "given",
    [{"seed": 3}, {"dims": {"batch": 2}, "batches": 2}],
    ids=["one", "two"],
)
def test_generating_options_beside_inputs_are_refused_alike_on_every_surface(tmp_path, given):
    """validate, check and their calls refuse the options that shape generated inputs beside
    given arrays with one message naming the options given, each in its own spelling. The
    library's validate() used to name all four whether given or not, in other words."""
    arrays = tmp_path / "b.npz"
    np.savez(arrays, x=np.zeros((1, 1, 8, 8), np.float32))
    flags = {"seed": ["--seed", "3"], "dims": ["--dim", "batch=2"], "batches": ["--batches", "2"]}
    args = [a for name in given for a in flags[name]]
    verb = "has" if len(given) == 1 else "have"
    why = "(the arrays' own shapes and values are used)"
    cli_names = ", ".join(flags[name][0] for name in given)
    for command in (["validate", DIGITS, DIGITS], ["check", DIGITS]):
        result = CliRunner().invoke(cli_main.cli, [*map(str, command), "--inputs", str(arrays), *args])
        assert result.exit_code == 2
        assert result.stderr.strip() == (
            f"autocast-onnx: error: {cli_names} {verb} no effect with --inputs {why} "
            "(drop them, or drop --inputs to generate inputs)"
        )
    keywords = ", ".join(f"{name}=" for name in given)
    expected = f"{keywords} {verb} no effect with inputs= {why} (drop them, or drop inputs= to generate inputs)"
    for call in (lambda: autocast_onnx.validate(DIGITS, DIGITS, inputs=arrays, **given),
                 lambda: autocast_onnx.check(DIGITS, inputs=arrays, **given)):  # fmt: skip
        with pytest.raises(AutocastError) as caught:
            call()
        assert str(caught.value) == expected
