"""The CI gate behind `autocast-onnx check`, as a library call: lint the model, convert it with
the plan options, lint the result, validate it, and judge the whole against a baseline report.
Returns the check report (docs/check-report.schema.json) and the findings; writing them is
the caller's business."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from .errors import AutocastError

CHECK_SCHEMA_VERSION = 1


@dataclass
class CheckResult:
    """What the gate decided: `passed`, the check report (`report`, as `--report-json` writes it)
    and the converted model's findings (`diagnostics`, as `--sarif` writes them)."""

    report: dict  # the check report (docs/check-report.schema.json)
    diagnostics: list  # the converted model's findings, for SARIF

    @property
    def passed(self) -> bool:
        return bool(self.report["gate"]["passed"])

    def text(self) -> str:
        """The summary as `autocast-onnx check` prints it."""
        from .report.checkgate import check_summary

        return check_summary(self.report)

    def __repr__(self) -> str:
        report, gate = self.report, self.report["gate"]
        after = report["lint_converted"]["summary"]
        validation = report.get("validation")
        validated = "skipped" if validation is None else ("pass" if validation["passed"] else "FAIL")
        against = " against the baseline" if gate["baseline"] else ""
        return (
            f"CheckResult({'PASS' if self.passed else 'FAIL'}{against}: {report['model']} to "
            f"{report['conversion']['precision']}; converted model's lint {after['error']} error, "
            f"{after['warning']} warning, {after['info']} info; validation {validated}; "
            f"{len(gate['new_findings'])} {'new ' if gate['baseline'] else ''}finding(s) and "
            f"{len(gate['regressions'])} regression(s) that fail at fail_on={report['fail_on']})"
        )


def load_baseline(path: str | os.PathLike) -> dict:
    """A previous check report, or AutocastError saying what the file is instead."""
    where = str(path)
    hint = "write one with `autocast-onnx check MODEL --report-json FILE`"
    if not Path(path).exists():
        raise AutocastError("baseline file not found", where, "check the path; " + hint)
    if Path(path).is_dir():
        raise AutocastError("the baseline is a folder, not a check report", where, hint)
    try:
        prior = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise AutocastError(f"cannot read the baseline ({exc.__class__.__name__})", where, hint) from None
    except ValueError:
        raise AutocastError("the baseline is not JSON, so not a check report", where, hint) from None
    try:
        prior["lint_converted"]["diagnostics"]
        prior["model"]
    except (KeyError, TypeError):
        raise AutocastError(
            "JSON, but not a check report (--report-json of autocast-onnx check)", where, hint
        ) from None
    prior["_path"] = where
    return prior


def model_signature(model: onnx.ModelProto) -> dict:
    """What identifies a model across its revisions for a baseline: its graph's input and output names."""
    return {"inputs": [i.name for i in model.graph.input], "outputs": [o.name for o in model.graph.output]}


def check_baseline_model(prior: dict, model_path, signature: dict) -> None:
    """Refuse a baseline written for another model: its recorded signature (or, in a report without
    one, its model's file name) must match this model's."""
    where = prior.get("_path")
    theirs = prior.get("signature")
    if theirs is not None:
        if theirs != signature:
            raise AutocastError(
                f"the baseline is the report of another model ({prior['model']}: inputs "
                f"{', '.join(theirs['inputs'])}; outputs {', '.join(theirs['outputs'])}), not of {model_path} "
                f"(inputs {', '.join(signature['inputs'])}; outputs {', '.join(signature['outputs'])})",
                where,
                "pass the report written for this model",
            )
    elif Path(str(prior["model"])).name != Path(str(model_path)).name:
        raise AutocastError(
            f"the baseline is the report of another model ({prior['model']}), not of {model_path}",
            where,
            "pass the report written for this model",
        )


def check(
    model: str | os.PathLike,
    *,
    output: str | os.PathLike | None = None,
    plan_options=None,
    lint_options=None,
    validation=None,
    skip_validate: bool = False,
    baseline: dict | None = None,
    config_source: str | None = None,
    progress=None,
    shown: str | None = None,
    header=None,
) -> CheckResult:
    """Run the gate on `model` (a path). The converted model is kept at `output` when given
    (and removed again if the gate fails with an error), else written to a temporary folder.
    `baseline` is a previous report (see load_baseline): then only new findings and
    regressions fail. `shown` names the model in the report and its findings instead of that path
    (api.check's `<model>`, for a ModelProto it wrote to a temporary file). `header` is `model` as
    the caller read it already (io.load_model with load_external=False, not yet checked), so that
    the gate does not read it again."""
    from .lint.engine import lint_options as _lint_options
    from .lint.report import lint_dict
    from .plan.options import plan_options as _plan_options
    from .report.checkgate import compare_baseline
    from .validate.options import ValidateOptions

    plan_options = plan_options or _plan_options()
    lint_options = lint_options or _lint_options(plan=plan_options)
    # configuration suppressions are judged over both lints: a finding the conversion removes does not
    # make its suppression "unused"
    lint_options = replace(
        lint_options,
        precision=plan_options.target.value,
        report_unused_config=False,
        plan=plan_options,
        rules=list(plan_options.rules),
    )
    validation = None if skip_validate else (validation or ValidateOptions())
    name = shown if shown is not None else str(model)
    source, signature = _read(header if header is not None else model, name, baseline, validation)
    before, converted, after, validation_report = _run(
        model, source, output, plan_options, lint_options, validation, progress, shown
    )
    if shown is not None and validation_report is not None:
        validation_report["reference"]["path"] = None  # the model was given in memory, as validate() says it
    report = {
        "schema_version": CHECK_SCHEMA_VERSION,
        "model": name,
        "signature": signature,
        "converted": str(output) if output else None,
        "config": config_source,
        "fail_on": lint_options.fail_on,
        "lint_original": lint_dict([before]),
        "conversion": {
            "precision": plan_options.target.value,
            "counts": converted.plan.counts(),
            "casts_added": converted.stats.casts_added,
            "warnings": [w.message for w in converted.plan.warnings],
        },
        "lint_converted": lint_dict([after]),
        "validation": validation_report,
    }
    report["gate"] = compare_baseline(report, baseline, after, lint_options.fail_on)
    return CheckResult(report=report, diagnostics=list(after.diagnostics))


def _read(model, name: str, baseline: dict | None, validation) -> tuple:
    """The model (a path, or a LoadedModel its caller read) read and checked once for the whole
    gate, its external data left on disk: (the LoadedModel, its signature). What the gate refuses
    comes in the order it always has: with validation, a malformed model, then the validation's
    options (precheck), then the screen (_screen); without, the screen, then a malformed model."""
    from .graph.sanity import check_loaded
    from .io import LoadedModel, load_model

    loaded = model if isinstance(model, LoadedModel) else load_model(model, load_external=False)
    if validation is not None:
        from .validate.core import precheck

        precheck(check_loaded(loaded), validation)
    signature = _screen(loaded.model, name, baseline, validation is not None)
    if validation is None:
        check_loaded(loaded)
    return loaded, signature


def _screen(header: onnx.ModelProto, name: str, baseline: dict | None, validating: bool) -> dict:
    """What the gate refuses from the model's header before any work: a baseline written for
    another model, and (when it validates) an onnxruntime-training training model. Returns the
    model's signature."""
    signature = model_signature(header)
    if baseline is not None:
        check_baseline_model(baseline, name, signature)
    if validating:
        from .graph.training import recognise

        training = recognise(header)
        if training is not None and training.accumulations:
            raise AutocastError(
                "check validates inference outputs; this is an onnxruntime-training training model",
                name,
                "pass --no-validate, and validate the training step with `autocast-onnx validate REFERENCE "
                "CONVERTED` where onnxruntime-training is installed",
            )
    return signature


def _run(model, source, output, plan_options, lint_options, validation, progress, shown: str | None) -> tuple:
    """The gate's work on the model file: lint it, convert it (to `output`, else to a temporary
    folder), lint the result, validate it (unless `validation` is None). `source` is the model read
    and checked once (_read): the lint and the comparison use it when it holds all of its weights,
    else they read `model` (each run reads the weights it needs and lets them go); the conversion
    streams the file itself; the converted model is read back once for its lint and comparison.
    The findings in a temporary file name the model checked instead: the converted model's without
    `output`, the model's own with `shown` (see check). Returns (the lint before, the
    ConversionResult, the lint after, the validation report or None); a failure removes the
    converted model it wrote to `output`."""
    from .io import whole_or_path
    from .lint import lint as run_lint
    from .lint.engine import unused_config_suppressions
    from .pipeline import convert_file
    from .validate.core import validate

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(output) if output is not None else Path(tmp) / f"{Path(model).stem}.{plan_options.target.value}.onnx"
        existed = output is not None and Path(output).exists()
        try:
            before = run_lint(whole_or_path(source, model), lint_options)
            if shown is not None:
                _name_findings(before, shown)
            converted = convert_file(model, out, options=plan_options)
            written = _read_back(out, converted)
            after = run_lint(whole_or_path(written, out), lint_options)
            if output is None:
                _name_findings(after, shown or str(model))
            after.diagnostics.extend(unused_config_suppressions([before, after], lint_options))
            report = None
            if validation is not None:
                reference, result = whole_or_path(source, model), whole_or_path(written, out)
                report = validate(reference, result, validation, progress=progress)
        except BaseException:
            if output is not None and not existed:
                Path(output).unlink(missing_ok=True)  # a failed gate leaves no converted model behind
                Path(str(output) + ".data").unlink(missing_ok=True)
            raise
    return before, converted, after, report


def _read_back(out: Path, converted):
    """The converted model read back from its file and checked, once for its lint and its
    comparison; None when the conversion wrote it with external data (each of them then reads the
    weights it needs)."""
    from .graph.sanity import load_checked

    if any(Path(f) != out for f in converted.output_files):
        return None
    return load_checked(out, load_external=False)


def _name_findings(result, name: str) -> None:
    """Name `name` as the model of a lint result (LintResult) and of its findings."""
    result.model = name
    for d in result.diagnostics:
        d.model = name
