"""`autocast-onnx check`: the CI gate (lint, convert, lint the result, validate; one verdict)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .app import GroupedCommand
from .groups import (
    _COMPARE_ONLY,
    _INPUT_OPTIONS,
    PATH,
    _echo,
    _plan_from,
    _progress,
    _refuse_generation_with_inputs,
    _refuse_unused,
    _setup,
    _to_stdout,
    config_option,
    lint_options_group,
    plan_options_group,
    strict_option,
    validation_options,
    verbose_option,
)
from .guard import EXIT_FAIL, EXIT_OK, run_guarded


@click.command(cls=GroupedCommand)
@click.argument("model", type=PATH)
@click.option("-o", "--output", type=PATH, help="Keep the converted model here (default: a temporary file).")
@plan_options_group()
@lint_options_group
@click.option("--baseline", type=PATH, help="A previous --report-json: fail only on new findings or regressions.")
@click.option("--sarif", type=PATH, help="Write the lint findings as SARIF 2.1.0 ('-': stdout).")
@click.option("--no-validate", "skip_validate", is_flag=True, help="Skip the accuracy/speed validation.")
@validation_options
@strict_option
@config_option
@verbose_option
@click.pass_context
def check(ctx, model, output, select, ignore, fail_on, baseline, sarif, skip_validate, config, verbose, **kw) -> None:
    """The CI gate: lint MODEL, convert it, lint the result, validate it; one summary, one exit code.

    Exit codes: 0 pass, 1 findings at or above --fail-on or a failed threshold (with --baseline: only
    new findings and regressions), 2 usage or input error, 3 internal error."""
    import json as _json

    from ..io import write_text_atomic
    from ..lint.report import sarif_json
    from ..report.checkgate import check_summary

    report_json = kw.get("report_json")
    report_html = kw.get("report_html")

    def body(written):
        from ..gate import check as run_check
        from ..gate import load_baseline
        from ..io import check_outputs
        from ..lint.engine import lint_options
        from ..validate.options import validate_options

        if skip_validate:
            # check's --report-json is the gate's report, written either way
            _refuse_unused(
                ctx,
                tuple(n for n in _COMPARE_ONLY if n != "report_json") + _INPUT_OPTIONS + ("device",),
                "with --no-validate",
                "drop them or run the validation",
            )
        _refuse_generation_with_inputs(ctx, kw)
        settings, source = _setup(config, verbose)
        plan = _plan_from(settings, kw)
        options = lint_options(settings, select=select, ignore=ignore, fail_on=fail_on, plan=plan)
        vopts = validate_options(settings, **kw)
        prior = load_baseline(baseline) if baseline is not None else None
        header = _header(model)
        check_outputs(
            [
                ("-o", output),
                ("--report-json", report_json),
                ("--report-html", report_html),
                ("--sarif", sarif),
                ("--save-inputs", vopts.save_inputs),
            ],
            [model, baseline, vopts.inputs, source, config, *plan.rules],
            models=["-o"],
            read_back=["-o"],
            model_inputs=[header or model],
        )
        if output is not None:
            written.track(output, Path(output).with_name(Path(output).name + ".data"))
        written.track(report_json, report_html, sarif)
        result = run_check(
            model,
            output=output,
            plan_options=plan,
            lint_options=options,
            validation=vopts,
            skip_validate=skip_validate,
            baseline=prior,
            config_source=source,
            progress=_progress,
            header=header,
        )
        report = result.report
        _echo(check_summary(report), err=_to_stdout(report_json, report_html, sarif))
        if report_json is not None:
            write_text_atomic(Path(report_json), _json.dumps(report, indent=1, default=float, allow_nan=False) + "\n")
        if report_html is not None and report["validation"] is not None:
            from ..report.html import validation_html

            write_text_atomic(Path(report_html), validation_html(report["validation"]))
        if sarif is not None:
            write_text_atomic(Path(sarif), sarif_json(result.diagnostics) + "\n")
        return result.passed

    passed = run_guarded(body, doing="checking", subject=model)
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


def _header(model):
    """MODEL read once (its external data left on disk, not yet checked) for the output checks and
    the gate, or None when it cannot be read: the gate then refuses it in its own place, after the
    refusals of the options and outputs."""
    from ..errors import AutocastError
    from ..io import load_model

    try:
        return load_model(model, load_external=False)
    except AutocastError:
        return None
