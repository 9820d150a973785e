"""`autocast-onnx validate`, `diagnose` and `emulate`: compare a conversion with its reference,
find the nodes that make its error, write the fp32 model that rounds like it."""

from __future__ import annotations

import json
import sys

import click

from ..errors import one_line
from .app import GroupedCommand
from .groups import (
    PATH,
    _echo,
    _given,
    _is_training_model,
    _progress,
    _refuse_for_training_step,
    _refuse_generation_with_inputs,
    _refuse_unused,
    _setup,
    _to_stdout,
    _training_step,
    _write_or_echo,
    _write_validation_reports,
    config_option,
    input_options_group,
    strict_option,
    validation_options,
    verbose_option,
)
from .guard import EXIT_FAIL, EXIT_OK, _say, run_guarded


@click.command(cls=GroupedCommand)
@click.argument("model", type=PATH)
@click.option(
    "-o",
    "--output",
    type=PATH,
    help="The emulation model (default: MODEL.emu.onnx beside it; for an artifacts folder, FOLDER.emu).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@verbose_option
def emulate(model, output, quiet, verbose) -> None:
    """Write the fp32 model that rounds like the mixed-precision MODEL would on a GPU.

    Every fp16/bf16 tensor of MODEL is rounded to its type right after it is produced and computed
    on in fp32 (as tensor cores accumulate), so ONNX Runtime's CPU provider - and onnxruntime-training
    on CPU - shows fp16 overflow, underflow and rounding. MODEL may be a converted model or a
    converted artifacts folder (both models emulated, the other files copied)."""

    def body(written):
        from ..validate.emulate import emulate_file

        _setup(None, verbose)
        done = emulate_file(model, output)
        written.track(done["output"])
        if not quiet:
            for name, entry in done["files"].items():
                if entry.get("action") == "emulated":
                    count = entry["low_precision_tensors"]
                    _echo(one_line(f"{name}: {count} low-precision tensors emulated"))
                    if not count:
                        _say(
                            "warning",
                            f"{name} has no fp16/bf16 tensor: its emulation computes "
                            "exactly what it computes (pass a converted model)",
                        )
            _echo(one_line(f"written to {done['output']}"))
        return True

    run_guarded(body, doing="emulating", subject=model)
    sys.exit(EXIT_OK)


@click.command(cls=GroupedCommand)
@click.argument("reference", type=PATH)
@click.argument("converted", type=PATH)
@validation_options
@strict_option
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; use the exit code.")
@config_option
@verbose_option
@click.pass_context
def validate(ctx, reference, converted, quiet, config, verbose, **kw) -> None:
    """Compare CONVERTED against REFERENCE: per-output accuracy and speed.

    For onnxruntime-training models (training_model.onnx and its conversion; needs
    onnxruntime-training): one training step of each on the same batch (--inputs, or generated
    from --seed), compared gradient by gradient - cosine, relative error, underflow, non-finite
    entries and all_finite.

    Exit codes: 0 every output passes, 1 a threshold failed, 2 usage or input error, 3 internal error."""
    report_json, report_html = kw.get("report_json"), kw.get("report_html")

    def training_body(written) -> bool:
        from ..io import check_outputs
        from ..validate.options import validate_options

        _refuse_for_training_step(ctx, _given(ctx, list(kw)))
        settings, config_file = _setup(config, verbose)
        options = validate_options(settings, **kw)
        check_outputs([("--report-json", report_json)], [reference, converted, options.inputs, config_file])
        written.track(report_json)

        def echo(text=""):
            if not quiet:
                _echo(text, err=_to_stdout(report_json))

        return _training_step(reference, converted, options, echo, report_json)

    def body(written):
        if _is_training_model(reference):
            return training_body(written)
        from ..io import check_outputs
        from ..report.validation import validation_text
        from ..validate.core import validate as run_validation
        from ..validate.options import validate_options

        _refuse_generation_with_inputs(ctx, kw)
        settings, config_file = _setup(config, verbose)
        options = validate_options(settings, **kw)
        check_outputs(
            [("--report-json", report_json), ("--report-html", report_html), ("--save-inputs", options.save_inputs)],
            [reference, converted, options.inputs, config_file],
            model_inputs=[reference, converted],
        )
        written.track(report_json, report_html)
        report = run_validation(reference, converted, options, progress=None if quiet else _progress)
        if not quiet:
            _echo(validation_text(report), err=_to_stdout(report_json, report_html))
        _write_validation_reports(report, report_json, report_html)
        return report["passed"]

    passed = run_guarded(body, doing="validating", subject=f"{converted} against {reference}")
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


@click.command(cls=GroupedCommand)
@click.argument("reference", type=PATH)
@click.argument("converted", type=PATH)
@input_options_group(
    batches=False,
    inputs_help="An .npz file, a Polygraphy JSON input file or a folder of either (the first batch is used).",
)
@click.option(
    "--plan",
    "plan_file",
    type=PATH,
    help="The plan CONVERTED was made with (--plan-out), for categories and reasons [default: the default rules].",
)
@click.option(
    "--top", type=click.IntRange(1, 1_000_000), default=10, show_default=True, help="Nodes listed per output."
)
@click.option("--report-json", type=PATH, help="Write the full report as JSON ('-': stdout).")
@click.option("--report-html", type=PATH, help="Write a self-contained HTML report with error-by-depth plots.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing.")
@verbose_option
@click.pass_context
def diagnose(ctx, reference, converted, inputs, dims, ranges, seed, plan_file, top, report_json, report_html, quiet,
             verbose) -> None:  # fmt: skip
    """Find the nodes whose rounding makes CONVERTED's error, in one pass.

    Runs REFERENCE (fp32) and CONVERTED's emulation once on the same batch and, for every node,
    estimates the error it introduces itself (computed from exact inputs as CONVERTED computes
    it), the error it receives and the error it produces; per output, ranks the nodes it depends
    on by the error they introduce."""

    def body(written):
        from ..io import check_outputs
        from ..validate.diagnose import diagnose_files
        from ..validate.inputs import parse_assignments, parse_ranges

        if inputs is not None:
            _refuse_unused(ctx, ("dims", "ranges", "seed"), "with --inputs (nothing is generated)", "drop them")
        _setup(None, verbose)
        check_outputs(
            [("--report-json", report_json), ("--report-html", report_html)],
            [reference, converted, inputs, plan_file],
            model_inputs=[reference, converted],
        )
        written.track(report_json, report_html)
        report = diagnose_files(
            reference,
            converted,
            inputs=inputs,
            dims=parse_assignments(dims, "dim"),
            ranges=parse_ranges(ranges),
            seed=seed,
            plan=plan_file,
            top=top,
        )
        if not quiet:
            _echo(report.text(), err=_to_stdout(report_json, report_html))
        if report_json is not None:
            _write_or_echo(json.dumps(report.to_dict(), indent=1), report_json)
        if report_html is not None:
            _write_or_echo(report.html(), report_html)
        return True

    run_guarded(body, doing="diagnosing", subject=f"{converted} against {reference}")
    sys.exit(EXIT_OK)
