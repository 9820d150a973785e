"""`autocast-onnx convert`: one model file, an onnxruntime-training artifacts folder, or several
models (cli/batch.py), with the helpers only it uses."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..errors import AutocastError
from .app import GroupedCommand
from .groups import (
    _COMPARE_ONLY,
    _INPUT_OPTIONS,
    PATH,
    TEXT,
    _echo,
    _given,
    _is_training_model,
    _jobs_without_effect,
    _plan_from,
    _progress,
    _refuse_for_training_step,
    _refuse_generation_with_inputs,
    _refuse_unused,
    _require_training_runtime,
    _setup,
    _to_stdout,
    _training_step,
    _write_validation_reports,
    config_option,
    jobs_option,
    plan_options_group,
    strict_option,
    validation_options,
    verbose_option,
)
from .guard import EXIT_FAIL, EXIT_OK, _outlive, _say, run_guarded


@click.command(cls=GroupedCommand)
@click.argument("models", nargs=-1, required=True, type=PATH)
@click.option(
    "-o",
    "--output",
    type=PATH,
    help="Output model (default: MODEL.<precision>.onnx beside the input); with several models, the folder "
    "to write them into (created if missing), each under that name.",
)
@jobs_option
@plan_options_group()
@click.option(
    "--plan",
    "plan_file",
    type=PATH,
    help="Apply this plan (written by --plan-out, maybe edited) instead of planning; it must belong to MODEL.",
)
@click.option("--plan-out", type=PATH, help="Write the precision plan (JSON) here ('-': stdout).")
@click.option(
    "--external-data/--no-external-data",
    default=None,
    help="Write initializers to MODEL.onnx.data (default: when the input had external data or the model is over 2 GB).",
)
@click.option(
    "--check",
    type=click.Choice(["full", "basic", "none"]),
    default="basic",
    show_default=True,
    help="Checks on the converted model: basic = onnx.checker; full = also ONNX shape/type inference.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option(
    "--gpu",
    type=TEXT,
    default=None,
    help="The GPU of the summary's latency estimate (a roofline estimate, no GPU needed): H100, H200, A100, L4, "
    "L40S, RTX4090, RTX3060, Orin (autocast_onnx/data/gpus.json) [default: H100, or the configuration's gpu].",
)
@click.option(
    "--loss-scale",
    type=TEXT,
    default=None,
    help="Training graphs: loss scaling put into the graph: dynamic (a loss_scale input, the default for "
    "onnxruntime-training models), a constant N, or none.",
)
@click.option(
    "--calibration-data",
    type=PATH,
    help="An .npz file, a Polygraphy JSON input file or a folder of either: run the fp32 model on it and keep "
    "fp32 the nodes whose tensors leave the target type's safe range.",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    type=TEXT,
    help="Accuracy target, e.g. 'cosine=0.9999,top1=0.99' (keys atol, rtol, cosine, top1): keep the fewest "
    "nodes fp32 that meet it on the validation inputs.",
)
@click.option(
    "--validate",
    "run_validate",
    is_flag=True,
    help="Then validate the result against MODEL (accuracy and speed; exit 1 if a threshold fails).",
)
@validation_options
@strict_option
@config_option
@verbose_option
@click.pass_context
def convert(
    ctx,
    models,
    output,
    jobs,
    plan_file,
    plan_out,
    external_data,
    check,
    quiet,
    loss_scale,
    calibration_data,
    targets,
    run_validate,
    config,
    verbose,
    **kw,
) -> None:
    """Convert MODEL to mixed precision and print a summary.

    MODEL may be an onnxruntime-training artifacts folder: its training and eval models are
    converted into the -o folder (default: FOLDER.<precision>), the optimizer model and
    checkpoint are copied, and autocast-manifest.json says what changed.

    Several models, or a folder (searched for .onnx files, skipping those named like outputs,
    NAME.fp16.onnx and NAME.bf16.onnx): each is converted on its own (-j at once), beside its
    input or into the -o folder, and one table is printed at the end. A model that fails does
    not stop the others; the exit code is the worst: 3 an internal error, 2 bad input, 1 a
    failed --validate threshold, 0 none."""
    model = models[0]
    call = _ConvertCall(
        ctx=ctx,
        model=model,
        output=output,
        plan_file=plan_file,
        plan_out=plan_out,
        external_data=external_data,
        check=check,
        quiet=quiet,
        loss_scale=loss_scale,
        calibration_data=calibration_data,
        targets=targets,
        run_validate=run_validate,
        config=config,
        verbose=verbose,
        kw=kw,
    )
    if _many_models(models):
        _convert_many(call, models, jobs)
    _jobs_without_effect(jobs)
    call.to_stderr = _to_stdout(plan_out, call.report_json, call.report_html)  # stdout holds the report alone
    passed = run_guarded(functools.partial(_convert_body, call), doing="converting", subject=model)
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


@dataclass
class _ConvertCall:
    """The options of one `convert` command, handed from stage to stage of _convert_body."""

    ctx: click.Context
    model: Path
    output: Path | None
    plan_file: Path | None
    plan_out: Path | None
    external_data: bool | None
    check: str
    quiet: bool
    loss_scale: str | None
    calibration_data: Path | None
    targets: tuple[str, ...]
    run_validate: bool
    config: Path | None
    verbose: bool
    kw: dict[str, Any]
    to_stderr: bool = False
    dims: dict = field(default_factory=dict)  # --dims, parsed: validation's sizes and the summary's

    @property
    def report_json(self):
        return self.kw.get("report_json")

    @property
    def report_html(self):
        return self.kw.get("report_html")

    def echo(self, text: str = "") -> None:
        """Print a line of the human-readable text (stderr when stdout holds a report), unless -q."""
        if not self.quiet:
            _echo(text, err=self.to_stderr)


def _convert_body(call: _ConvertCall, written) -> bool:
    """convert, under run_guarded: check every option and output, plan (maybe on data), convert,
    print the summary, then validate if asked. True when every threshold passed."""
    from ..validate.options import validate_options

    settings, config_file, plan = _convert_setup(call)
    if _artifacts_folder(call.model):
        _refuse_unused(
            call.ctx,
            ("plan_file", "plan_out", "calibration_data", "targets", "run_validate", "external_data"),
            "with an artifacts folder",
            "convert training_model.onnx on its own to use them",
        )
        return _convert_folder(call.model, call.output, plan, call.check, call.loss_scale, call.echo)
    replay = _replay_plan(call)
    out = _choose_output(call, replay.target.value if replay is not None else plan.target.value)
    options = validate_options(settings, **call.kw)  # refuse bad validation flags before any work
    call.dims = dict(options.dims)  # they size the summary's cast traffic and estimate too
    goal = None
    if call.targets:
        from ..validate.options import parse_targets

        goal = parse_targets(call.targets)
    _check_convert_outputs(call, out, options, config_file, plan)
    source = _read_once(call, goal)
    training_step = _prepare_validation(call, options, source)
    measured = _plan_on_data(call, plan, options, goal, source)
    written.track(out, Path(out).with_name(Path(out).name + ".data"), call.plan_out, call.report_json, call.report_html)
    result = _run_conversion(call, out, replay, plan, measured)
    _print_conversion(call, result, out)
    if not call.run_validate:
        return True
    try:
        return _validate_converted(call, out, options, training_step, source)
    except AutocastError as exc:
        # the conversion succeeded: keep it (and its plan), say it was not validated, exit 2
        written.keep(out, Path(out).with_name(Path(out).name + ".data"), call.plan_out)
        raise _not_validated(exc, call.model, out) from None


def _convert_setup(call: _ConvertCall) -> tuple:
    """What convert checks and reads first, for one model or many: the options that do nothing
    here refused, the configuration read, the plan options built, the GPU chosen, --loss-scale
    parsed. Returns (the settings, the configuration file or None, the PlanOptions)."""
    _refuse_convert_options_without_effect(call)
    settings, config_file = _setup(call.config, call.verbose)
    plan = _plan_from(settings, call.kw)
    _choose_gpu(call, settings)
    if call.loss_scale is not None:
        from ..rewrite.loss_scale import parse_loss_scale

        parse_loss_scale(call.loss_scale)
    return settings, config_file, plan


def _choose_gpu(call: _ConvertCall, settings: dict) -> None:
    """--gpu, else the configuration's gpu, checked against the GPU table before any work."""
    from ..roofline import gpu

    flag = call.kw.get("gpu")
    name = flag if flag is not None else settings.get("gpu")
    gpu(name, "--gpu" if flag is not None else "gpu (configuration)")
    call.kw["gpu"] = name


def _refuse_convert_options_without_effect(call: _ConvertCall) -> None:
    """Nothing silent: the comparison, input and device options need --validate (or --target,
    or --calibration-data), and the input-generating ones do nothing with --inputs."""
    if not call.run_validate:
        _refuse_unused(call.ctx, _COMPARE_ONLY, "without --validate", "add --validate or drop them")
        if not call.targets:
            _refuse_unused(
                call.ctx, _INPUT_OPTIONS, "without --validate or --target", "add --validate or --target, or drop them"
            )
            if call.calibration_data is None:
                _refuse_unused(call.ctx, ("device",), "without --validate, --target or --calibration-data", "drop it")
    _refuse_generation_with_inputs(call.ctx, call.kw)


def _replay_plan(call: _ConvertCall):
    """The plan given with --plan (None without it); the planning options would do nothing beside it."""
    if call.plan_file is None:
        return None
    from ..plan import PrecisionPlan
    from ..plan.options import cli_name, planning_fields

    # every planning option PlanOptions declares as refused or compared beside a replayed plan
    # (plan/options.py), and what plans on data
    planning = [cli_name(option) for option in planning_fields() if option.metadata["replay"] != "allowed"]
    _refuse_unused(
        call.ctx,
        (*planning, "calibration_data", "targets"),
        "with --plan: the plan decides every node",
        "edit the plan's node precisions instead",
    )
    return PrecisionPlan.load(call.plan_file)


def _choose_output(call: _ConvertCall, precision: str):
    """-o, or MODEL.<precision>.onnx beside the input (which must then be a model file)."""
    from ..io import check_model_path
    from ..pipeline import default_output_path

    if call.output is None:
        check_model_path(call.model)  # no default output beside a missing file, a folder, a device or a FIFO
    return call.output or default_output_path(call.model, precision)


def _check_convert_outputs(call: _ConvertCall, out, options, config_file, plan) -> None:
    """Refuse, before any work, outputs that clash with each other or with the files read."""
    from ..io import check_outputs

    check_outputs(
        [
            ("-o", out),
            ("--plan-out", call.plan_out),
            ("--report-json", call.report_json),
            ("--report-html", call.report_html),
            ("--save-inputs", options.save_inputs),
        ],
        [call.model, call.calibration_data, options.inputs, config_file, call.plan_file, *plan.rules],
        models=["-o"],
        read_back=["-o"] if call.run_validate else [],
        # convert_file checks -o and --plan-out against the input's data files itself
        model_inputs=[call.model] if call.run_validate else [],
    )


def _read_once(call: _ConvertCall, goal):
    """MODEL read and checked once for what runs it beside the conversion (the validation's
    checks and comparison, the --target search, the calibration), or None when nothing does. Its
    external data stays on disk (io.load_model): the conversion streams the weights itself."""
    if not (call.run_validate or goal is not None or call.calibration_data is not None):
        return None
    from ..graph.sanity import load_checked

    return load_checked(call.model, load_external=False)


def _prepare_validation(call: _ConvertCall, options, source) -> bool:
    """Before converting, check that --validate can run; True when it validates a training step
    (the model is a training graph) rather than comparing outputs."""
    training_step = call.run_validate and _is_training_model(source.model if source is not None else call.model)
    if training_step:
        _refuse_for_training_step(
            call.ctx, _given(call.ctx, [*_COMPARE_ONLY, *_INPUT_OPTIONS, "device", "calibration_data", "targets"])
        )
        _require_training_runtime(call.model)
    elif call.run_validate:
        from ..validate.core import precheck

        precheck(source if source is not None else call.model, options)
    return training_step


def _plan_on_data(call: _ConvertCall, plan, options, goal, source):
    """What running the model decides before the conversion: --calibration-data's fp32 nodes and
    the --target search (whose log is printed here)."""
    from ..io import whole_or_path
    from ..validate.on_data import plan_on_data

    measured = plan_on_data(
        whole_or_path(source, call.model),
        plan,
        calibration_data=call.calibration_data,
        targets=goal if goal is not None else (),  # parsed once, above
        validation=options,
        progress=None if call.quiet else _progress,
        note=None if call.quiet or sys.stderr.isatty() else lambda text: _echo(text, err=True),
        gpu=call.kw.get("gpu"),
    )
    if measured.search_log is not None:
        call.echo(_search_log_line(measured.search_log))
    return measured


def _search_log_line(log) -> str:
    """One line on what the --target search did and which nodes it kept fp32."""
    kept = ", ".join(f"{n} ({e:.2g})" for n, e in log["attribution"].items()) if log["kept"] else "none"
    budget = " (stopped at the evaluation budget: the smallest passing set found)" if log.get("budget_reached") else ""
    trade = log.get("trade")
    price = (
        f"; estimated cost on {trade['gpu']}: {trade['cost_us']:+.1f} us per inference"
        if trade and trade.get("cost_us") is not None
        else ""
    )
    return (
        f"--target search: {log['evaluations']} evaluations in {log['seconds']:.1f} s over "
        f"{log['candidates']} low-precision nodes{budget}; kept fp32 (attributed error): {kept}{price}"
    )


def _run_conversion(call: _ConvertCall, out, replay, plan, measured):
    """Convert the model file into `out`, replaying --plan or planning with the options and what
    was measured on data."""
    from ..pipeline import convert_file

    planning = (
        {"plan": replay}
        if replay is not None
        else {"calibration": measured.calibration, "force_fp32": measured.force_fp32, "options": plan}
    )
    result = convert_file(
        call.model,
        out,
        plan_out=call.plan_out,
        external_data=call.external_data,
        check=call.check,
        loss_scale=call.loss_scale,
        search_log=measured.search_log,
        dims=call.dims or None,
        **planning,
    )
    result.gpu = call.kw.get("gpu")
    _outlive(result)
    return result


def _print_conversion(call: _ConvertCall, result, out) -> None:
    """The conversion's summary and where the plan went."""
    from ..report import conversion_summary

    if not call.quiet:  # the summary walks the plan once more (0.1 s at 100k nodes): not for nothing
        call.echo(conversion_summary(result, call.model, out, verbose=call.verbose))
    if call.plan_out:
        call.echo(f"plan written to {'stdout' if str(call.plan_out) == '-' else call.plan_out}")


def _not_validated(exc: AutocastError, model, out) -> AutocastError:
    """`exc` (validation could not run) as the error of a conversion that was written: what went
    wrong and that the model was kept unvalidated, then how to validate it once that is fixed."""
    command = f"autocast-onnx validate {model} {out}"
    hint = f"{exc.hint}; then validate it with `{command}`" if exc.hint else f"validate it with `{command}`"
    return AutocastError(f"{exc.what}; the converted model was written to {out} but not validated", exc.where, hint)


def _validate_converted(call: _ConvertCall, out, options, training_step: bool, source) -> bool:
    """convert --validate: compare the converted model with MODEL (or run a training step), print
    and write the report; True when every threshold passed."""
    if training_step:
        call.echo("")
        return _training_step(call.model, out, options, call.echo, call.report_json)
    from ..io import whole_or_path
    from ..report.validation import validation_text
    from ..validate.core import validate as run_validation

    call.echo("")
    report = run_validation(whole_or_path(source, call.model), out, options, progress=None if call.quiet else _progress)
    call.echo(validation_text(report))
    _write_validation_reports(report, call.report_json, call.report_html)
    return report["passed"]


def _artifacts_folder(path) -> bool:
    """Whether the folder `path` is an onnxruntime-training artifacts folder (the training
    package is imported only for a folder: a model file's conversion does not need it)."""
    if not Path(path).is_dir():
        return False
    from ..training.artifacts import is_artifacts_dir

    return is_artifacts_dir(path)


def _convert_folder(model, output, plan, check, loss_scale, echo) -> bool:
    """convert on an onnxruntime-training artifacts folder (see training/artifacts.py). All or
    nothing, as for a model file: the new folder is renamed into place with the earlier output
    kept aside until the summary is printed; a failure while printing removes the new folder
    whole and brings the earlier output back (a closed stdout is a success: the folder stays)."""
    from ..report import conversion_summary
    from ..training.artifacts import MANIFEST, convert_artifacts, default_output_dir

    out_dir = Path(output) if output is not None else default_output_dir(Path(model), plan.target.value)
    result = convert_artifacts(model, out_dir, check=check, loss_scale=loss_scale, hold=True, options=plan)
    try:
        for name, converted in result.results.items():
            echo(conversion_summary(converted, Path(model) / name, out_dir / name))
            echo("")
        echo(f"copied unchanged: {', '.join(result.copied) or 'nothing'}")
        echo(f"manifest written to {out_dir / MANIFEST}")
    except BaseException as exc:
        result.settle(keep=isinstance(exc, BrokenPipeError))  # run_guarded: a closed stdout is a success
        raise
    result.settle(keep=True)
    return True


def _many_models(models) -> bool:
    """Whether convert works on a batch: several models, or a folder that is not an
    onnxruntime-training artifacts folder."""
    return len(models) > 1 or (Path(models[0]).is_dir() and not _artifacts_folder(models[0]))


# options that belong to one model: refused with several
_ONE_MODEL_ONLY = (
    "plan_file",
    "plan_out",
    "report_json",
    "report_html",
    "save_inputs",
    "inputs",
    "calibration_data",
    "targets",
)


def _convert_many(call: _ConvertCall, models, jobs) -> None:
    """convert on several models (cli/batch.py): the options checked once, every output decided
    and checked before any work, the models converted (-j at once), one table printed; exits
    with the worst outcome."""
    from . import batch

    lines, code = run_guarded(
        functools.partial(_convert_batch, call, models, jobs or batch.default_jobs()),
        doing="converting",
        subject=", ".join(str(m) for m in models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else ""),
    )
    for line in lines:
        _say("error", line)
    sys.exit(code)


def _convert_batch(call: _ConvertCall, models, jobs: int, written) -> tuple[list[str], int]:
    """_convert_many under run_guarded: the error lines to print after the table, and the exit
    code."""
    import time

    from . import batch

    given = _given(call.ctx, _ONE_MODEL_ONLY)
    if given:
        several = "a directory of models" if len(models) == 1 else "several models"
        raise AutocastError(
            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect with {several}: "
            f"{'it names' if len(given) == 1 else 'each names'} a file of one model",
            str(models[0]) if len(models) == 1 else None,
            "convert that model on its own to use them",
        )
    settings, config_file, plan = _convert_setup(call)
    validation = None
    if call.run_validate:
        from ..validate import core  # noqa: F401  (imported once here, before the workers fork)
        from ..validate.options import validate_options

        validation = validate_options(settings, **call.kw)
    for model in models:  # an artifacts folder's models are converted together, by convert FOLDER
        if _artifacts_folder(model):
            raise AutocastError(
                "an onnxruntime-training artifacts folder cannot be converted among other models",
                str(model),
                f"convert it on its own: autocast-onnx convert {model}",
            )
    expanded = batch.expand_models(models, skip_converted=True)
    if not expanded.paths:  # nothing to convert: the error, nothing written
        raise expanded.errors[0]
    outs = _batch_outputs(call, expanded, plan, config_file, written)
    if expanded.skipped:
        _say(
            "warning",
            f"skipped {len(expanded.skipped)} file(s) named like converted models (*.fp16.onnx, *.bf16.onnx), "
            f"e.g. {expanded.skipped[0]}; pass them as files to convert them",
        )
    jobs_list = [
        batch.ConvertJob(path, out, plan, call.check, call.external_data, call.loss_scale, validation, call.verbose)
        for path, out in zip(expanded.paths, outs, strict=True)
    ]
    from .. import pipeline  # noqa: F401  (imported once here, before the workers fork)

    progress = batch.Progress(len(jobs_list), enabled=not call.quiet)
    start = time.perf_counter()
    outcomes = batch.run_all(
        batch.convert_one,
        jobs_list,
        jobs=jobs,
        doing="converting",
        subjects=expanded.paths,
        done=lambda k, outcome: progress(expanded.paths[k], outcome),
    )
    progress.finish()
    for outcome in outcomes:
        if outcome.value is not None and outcome.value.summary:
            call.echo(outcome.value.summary)
            call.echo("")
    call.echo(batch.convert_table(jobs_list, outcomes, time.perf_counter() - start))
    errors = [*(e.line() for e in expanded.errors), *(o.error for o in outcomes if o.error)]
    code = max(batch.worst(outcomes), batch.EXIT_INPUT if expanded.errors else batch.EXIT_OK)
    return errors, code


def _batch_outputs(call: _ConvertCall, expanded, plan, config_file, written) -> list[Path]:
    """Each model's output, refused up front if two clash or one clashes with a file read; the
    -o folder created; every output tracked (an interrupt removes what the batch wrote)."""
    from ..io import check_outputs
    from . import batch

    outs = batch.output_paths(expanded, call.output, plan.target.value)
    existing = [p for p in expanded.paths if p.exists()]
    flags = [f"the output of {p}" for p in expanded.paths]
    created = batch.make_folders(outs, call.output) if call.output is not None else []
    try:
        check_outputs(
            list(zip(flags, outs, strict=True)),
            [*existing, config_file, *plan.rules],
            models=flags,
            read_back=flags if call.run_validate else [],
        )
    except AutocastError:
        batch.remove_folders(created)
        raise
    written.track(*outs, *(out.with_name(out.name + ".data") for out in outs))
    return outs
