"""Stage: CLI. Parses options, calls the pipeline, prints reports, maps errors to exit codes:
0 success, 1 a failed threshold or findings, 2 bad input or usage (one line, no traceback),
3 internal error (a bug; one line, the traceback with AUTOCAST_ONNX_DEBUG=1).

Every command checks all its option values and outputs before any work, writes '-' outputs to
stdout (then its human-readable text goes to stderr), and leaves none of its outputs behind when
it ends in exit 2 or 3 after writing them."""

from __future__ import annotations

import math
import os
import sys
import traceback
from pathlib import Path

import click

from ..errors import AutocastError, InternalCheckError

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
BUG_HINT = "this is a bug in autocast-onnx; rerun with AUTOCAST_ONNX_DEBUG=1 for a traceback and please report it"


def _fail(message: str, code: int) -> None:
    click.echo(f"autocast-onnx: error: {message}", err=True)
    sys.exit(code)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if isinstance(exc, InternalCheckError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_guarded(fn, *, doing: str, subject=None):
    """Run a command body `fn(outputs)`, where `outputs` is an io.OutputSnapshot the body tracks
    its output paths in before writing them. Bad input becomes one line and exit 2, anything
    unexpected one line and exit 3 (naming the command and the file); either way, the outputs
    this run wrote are removed (all or nothing)."""
    from ..io import OutputSnapshot

    outputs = OutputSnapshot()
    context = f"{doing} {subject}" if subject is not None else doing
    try:
        return fn(outputs)
    except AutocastError as exc:
        outputs.discard()
        _fail(exc.line(), EXIT_INPUT)
    except KeyboardInterrupt:
        outputs.discard()
        _fail("interrupted; nothing was written", 130)
    except MemoryError:
        outputs.discard()
        _fail(f"out of memory while {context}: the model or its inputs are too large for this machine "
              "(use smaller --dim/--batches, or a machine with more memory)", EXIT_INPUT)
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: one line, exit 3
        outputs.discard()
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        _fail(f"internal error while {context}: {_one_line(exc)} ({BUG_HINT})", EXIT_INTERNAL)


class _PathType(click.Path):
    """click.Path that refuses an empty value (click would read it as '.')."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty path; give a file name", param, ctx)
        return super().convert(value, param, ctx)


class _TextType(click.ParamType):
    """A string that must not be empty or blank."""

    name = "text"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty value", param, ctx)
        return value


PATH = _PathType(path_type=Path)
TEXT = _TextType()
SEED_MAX = 2**32 - 1         # numpy seeds are unsigned 32-bit
MAX_BATCHES, MAX_ITERATIONS, MAX_WARMUP = 10_000, 1_000_000, 100_000


def validation_options(f):
    """Options shared by `validate` and `convert --validate`."""
    options = [
        click.option("--inputs", type=PATH, help="An .npz file (one batch) or a folder of .npz files."),
        click.option("--dim", "dims", multiple=True, type=TEXT, help="Value of a symbolic dimension, NAME=VALUE (repeatable)."),
        click.option("--input-range", "ranges", multiple=True, type=TEXT, help="Range of generated values, NAME=LO:HI (repeatable)."),
        click.option("--batches", type=click.IntRange(1, MAX_BATCHES), default=1, show_default=True,
                     help="Generated batches when no --inputs."),
        click.option("--seed", type=click.IntRange(0, SEED_MAX), default=0, show_default=True,
                     help="Seed for generated inputs (0 to 2**32-1)."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                     help="Where to run: CUDA when onnxruntime-gpu and a GPU are there (auto), or force one."),
        click.option("--numerics", type=click.Choice(["auto", "emulate", "plain"]), default="auto", show_default=True,
                     help="emulate: round every low-precision tensor like a GPU (default on CPU); plain: run as is."),
        click.option("--atol", type=float, help="Max absolute error per output."),
        click.option("--rtol", type=float, help="Max error relative to max |reference| per output [0.01]."),
        click.option("--min-cosine", type=float, help="Min cosine similarity per output, -1 to 1 [0.999]."),
        click.option("--min-top1", type=float, help="Min top-1 agreement for class-score outputs, 0 to 1 [0.99]."),
        click.option("--class-output", "class_outputs", multiple=True, type=TEXT,
                     help="Treat this output as class scores (top-1/top-k)."),
        click.option("--speed/--no-speed", default=True, show_default=True, help="Measure latency and speed-up."),
        click.option("--iterations", type=click.IntRange(1, MAX_ITERATIONS), default=20, show_default=True,
                     help="Timed runs per model."),
        click.option("--warmup", type=click.IntRange(0, MAX_WARMUP), default=3, show_default=True,
                     help="Untimed runs first."),
        click.option("--report-json", type=PATH, help="Write the report as JSON ('-': stdout)."),
        click.option("--report-html", type=PATH, help="Write a self-contained HTML report ('-': stdout)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


# Allowed values of each threshold (command line, configuration file and --target).
THRESHOLD_BOUNDS = {"atol": (0.0, math.inf), "rtol": (0.0, math.inf), "min_cosine": (-1.0, 1.0),
                    "min_top1": (0.0, 1.0)}


def _check_threshold(key: str, value, flag: str, hint: str, label: str | None = None) -> None:
    low, high = THRESHOLD_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bound = " >= 0" if high == math.inf else f" from {low:g} to {high:g}"
        raise AutocastError(f"{label or flag} must be a finite number{bound}, not {value!r}", flag, hint)


def _validate_options(kw, settings=None):
    from ..config import load_settings
    from ..validate.core import ValidateOptions
    from ..validate.inputs import parse_assignments, parse_ranges
    from ..validate.metrics import Thresholds

    if settings is None:
        settings, _ = load_settings()
    thresholds = Thresholds()
    for key in THRESHOLD_BOUNDS:
        value = kw.get(key)
        if value is None:
            value = settings.get(key, getattr(thresholds, key))
        if value is not None:
            _check_threshold(key, value, "--" + key.replace("_", "-"),
                             "fix the threshold (command line or [tool.autocast-onnx])")
        setattr(thresholds, key, value)
    return ValidateOptions(inputs=kw.get("inputs"), dims=parse_assignments(kw.get("dims", ()), "dim"),
                           ranges=parse_ranges(kw.get("ranges", ())), batches=kw.get("batches", 1),
                           seed=kw.get("seed", 0), device=kw.get("device", "auto"),
                           numerics=kw.get("numerics", "auto"), thresholds=thresholds,
                           speed=kw.get("speed", True), iterations=kw.get("iterations", 20),
                           warmup=kw.get("warmup", 3), class_outputs=list(kw.get("class_outputs", ())))


def _parse_targets(targets):
    from ..validate.search import parse_target

    goal = parse_target(targets)
    keys = {"atol": "atol", "rtol": "rtol", "min_cosine": "cosine", "min_top1": "top1"}
    for key, name in keys.items():
        value = getattr(goal, key)
        if value is not None:
            _check_threshold(key, value, "--target", "e.g. --target cosine=0.9999,top1=0.99", f"{name}=")
    return goal


def _precheck_validation(model_path, options) -> None:
    """Everything validation would refuse about its options, checked before a conversion so that
    `convert --validate` and `check` refuse bad options before writing anything: --dim and
    --input-range names and values, the size of generated inputs, --inputs archives (headers
    only), --class-output names."""
    from ..io import load_model
    from ..validate.inputs import check_batches, check_generated_size, describe_inputs, plan_inputs

    source = load_model(model_path, load_external=False).model
    specs = describe_inputs(source)
    plan = plan_inputs(specs, options.dims, options.ranges)
    if options.inputs:
        check_batches(options.inputs, specs)
    else:
        check_generated_size(plan)
    outputs = [o.name for o in source.graph.output]
    unknown = set(options.class_outputs) - set(outputs)
    if unknown:
        raise AutocastError(f"--class-output names unknown output(s): {', '.join(sorted(unknown))}", str(model_path),
                            "outputs are: " + ", ".join(outputs))


def _progress(label, total):
    if total < 2 or not sys.stderr.isatty():
        return None
    bar = click.progressbar(length=total, label=label, file=sys.stderr)
    bar.__enter__()

    class _Bar:
        def update(self, n):
            bar.update(n)

        def finish(self):
            bar.__exit__(None, None, None)

    return _Bar()


def _to_stdout(*paths) -> bool:
    """Whether a report goes to stdout (then the human-readable text goes to stderr)."""
    from ..io import goes_to_stdout

    return any(goes_to_stdout(p) for p in paths)


def _write_validation_reports(report, report_json, report_html) -> None:
    from ..io import write_text_atomic
    from ..report.validation import validation_json

    if report_json is not None:
        write_text_atomic(Path(report_json), validation_json(report) + "\n")
    if report_html is not None:
        from ..report.html import validation_html

        write_text_atomic(Path(report_html), validation_html(report))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autocast-onnx")
def cli() -> None:
    """Automatic mixed precision for ONNX models, correct by default and explained node by node."""


@cli.command()
@click.argument("model", type=PATH)
@click.option("-o", "--output", type=PATH, help="Output model (default: MODEL.<precision>.onnx beside the input).")
@click.option("--precision", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True,
              help="Low-precision type for the nodes that can take it.")
@click.option("--rules", "rules", multiple=True, type=PATH,
              help="Extra rule file (TOML), applied over the default profile; repeatable, later wins.")
@click.option("--keep-io-types/--no-keep-io-types", default=True, show_default=True,
              help="Keep the types of the model's inputs and outputs.")
@click.option("--exclude-op", multiple=True, type=TEXT, help="Keep every node of this op type in fp32 (repeatable).")
@click.option("--exclude-node", multiple=True, type=TEXT,
              help="Keep nodes whose name matches this regex in fp32 (repeatable).")
@click.option("--include-node", multiple=True, type=TEXT,
              help="Force nodes whose name matches this regex to low precision (repeatable).")
@click.option("--plan-out", type=PATH, help="Write the precision plan (JSON) here ('-': stdout).")
@click.option("--external-data/--no-external-data", default=None,
              help="Write initializers to MODEL.onnx.data (default: when the input had external data or the model is over 2 GB).")
@click.option("--check", type=click.Choice(["full", "basic", "none"]), default="basic", show_default=True,
              help="Checks on the converted model: basic = onnx.checker; full = also ONNX shape/type inference.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@click.option("--calibration-data", type=PATH,
              help="An .npz file or folder of them: run the fp32 model on it and keep fp32 the nodes whose tensors leave the target type's safe range.")
@click.option("--target", "targets", multiple=True, type=TEXT,
              help="Accuracy target, e.g. 'cosine=0.9999,top1=0.99' (keys atol, rtol, cosine, top1): keep the fewest nodes fp32 that meet it on the validation inputs.")
@click.option("--validate", "run_validate", is_flag=True,
              help="Then validate the result against MODEL (accuracy and speed; exit 1 if a threshold fails).")
@validation_options
def convert(model, output, precision, rules, keep_io_types, exclude_op, exclude_node, include_node, plan_out,
            external_data, check, quiet, calibration_data, targets, run_validate, **validation) -> None:
    """Convert MODEL to mixed precision and print a summary."""
    from ..report import conversion_summary

    report_json = validation.get("report_json") if run_validate else None
    report_html = validation.get("report_html") if run_validate else None
    to_stderr = _to_stdout(plan_out, report_json, report_html)   # stdout holds the report alone

    def echo(text=""):
        if not quiet:
            click.echo(text, err=to_stderr)

    def body(written):
        from ..config import load_settings
        from ..io import check_outputs, load_model
        from ..pipeline import convert_file, default_output_path

        if output is None and (not Path(model).exists() or Path(model).is_dir()):
            load_model(model)      # no default output beside it: say what is wrong with MODEL
        out = output or default_output_path(model, precision)
        settings, config_file = load_settings()
        options = _validate_options(validation, settings)  # refuse bad validation flags before any work
        goal = _parse_targets(targets) if targets else None
        check_outputs([("-o", out), ("--plan-out", plan_out), ("--report-json", report_json),
                       ("--report-html", report_html)],
                      [model, calibration_data, options.inputs, config_file, *rules], models=["-o"],
                      read_back=["-o"] if run_validate else [],
                      # convert_file checks -o and --plan-out against the input's data files itself
                      model_inputs=[model] if run_validate else [])
        if run_validate:
            _precheck_validation(model, options)
        convert_options = dict(precision=precision, rules=list(rules), keep_io_types=keep_io_types,
                               exclude_ops=list(exclude_op), exclude_nodes=list(exclude_node),
                               include_nodes=list(include_node))
        calibration = force = None
        if calibration_data is not None or goal is not None:
            from ..validate import runner
            from ..validate.inputs import check_batches, describe_inputs, generate, load_batches, plan_inputs

            source = load_model(model).model
            specs = describe_inputs(source)
            if calibration_data is not None:
                check_batches(calibration_data, specs)
            if goal is not None and options.inputs:
                check_batches(options.inputs, specs)
            device, _ = runner.resolve_device(options.device)
            if calibration_data is not None:
                from ..validate.calibrate import calibrate

                calibration = calibrate(source, load_batches(calibration_data, specs), device, _progress)
            if goal is not None:
                from ..validate.search import search

                if options.inputs:
                    batches = load_batches(options.inputs, specs)
                else:
                    in_plan = plan_inputs(specs, options.dims, options.ranges)
                    batches = [generate(in_plan, seed=options.seed + k) for k in range(options.batches)]
                force, log = search(source, batches, dict(convert_options, calibration=calibration), goal,
                                    device, _progress)
                kept = ", ".join(log["kept"]) if log["kept"] else "none"
                echo(f"--target search: {log['evaluations']} evaluations over {log['candidates']} "
                     f"low-precision nodes; kept fp32: {kept}")
        written.track(out, Path(out).with_name(Path(out).name + ".data"), plan_out, report_json, report_html)
        result = convert_file(model, out, plan_out=plan_out, external_data=external_data, check=check,
                              calibration=calibration, force_fp32=force, **convert_options)
        echo(conversion_summary(result, model, out))
        if plan_out:
            echo(f"plan written to {'stdout' if str(plan_out) == '-' else plan_out}")
        if not run_validate:
            return True
        from ..report.validation import validation_text
        from ..validate.core import validate as run_validation

        echo("")
        report = run_validation(model, out, options, progress=_progress)
        echo(validation_text(report))
        _write_validation_reports(report, report_json, report_html)
        return report["passed"]

    passed = run_guarded(body, doing="converting", subject=model)
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


@cli.command()
@click.argument("reference", type=PATH)
@click.argument("converted", type=PATH)
@validation_options
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; use the exit code.")
def validate(reference, converted, quiet, **kw) -> None:
    """Compare CONVERTED against REFERENCE: per-output accuracy and speed.

    Exit codes: 0 every output passes, 1 a threshold failed, 2 usage or input error, 3 internal error."""
    report_json, report_html = kw.get("report_json"), kw.get("report_html")

    def body(written):
        from ..config import load_settings
        from ..io import check_outputs
        from ..report.validation import validation_text
        from ..validate.core import validate as run_validation

        settings, config_file = load_settings()
        options = _validate_options(kw, settings)
        check_outputs([("--report-json", report_json), ("--report-html", report_html)],
                      [reference, converted, options.inputs, config_file], model_inputs=[reference, converted])
        written.track(report_json, report_html)
        report = run_validation(reference, converted, options, progress=_progress)
        if not quiet:
            click.echo(validation_text(report), err=_to_stdout(report_json, report_html))
        _write_validation_reports(report, report_json, report_html)
        return report["passed"]

    passed = run_guarded(body, doing="validating", subject=f"{converted} against {reference}")
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


def _lint_options(settings, select, ignore, fail_on, precision, rules):
    from ..lint.engine import LintOptions, Suppression

    suppress = [Suppression(code=e["code"], node=e.get("node", ".*"), source=settings.get("_source", "config"))
                for e in settings.get("suppress", [])]
    return LintOptions(select=list(select) or settings.get("select", ["AC"]),
                       ignore=list(ignore) or settings.get("ignore", []),
                       fail_on=fail_on or settings.get("fail_on", "error"), precision=precision,
                       suppress=suppress, rules=list(rules) or settings.get("rules", []))


def _write_or_echo(text: str, output) -> None:
    from ..io import is_stdout, write_text_atomic

    if output is None or is_stdout(output):
        click.echo(text)
    else:
        write_text_atomic(Path(output), text + "\n")


@cli.command()
@click.argument("models", nargs=-1, required=True, type=PATH)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sarif"]), default="text", show_default=True)
@click.option("-o", "--output", type=PATH, help="Write the report here instead of stdout ('-': stdout).")
@click.option("--select", multiple=True, type=TEXT, help="Check codes, prefixes or names to run (repeatable; default all).")
@click.option("--ignore", multiple=True, type=TEXT, help="Check codes, prefixes or names to skip (repeatable).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"]), help="Lowest severity that fails [error].")
@click.option("--precision", type=click.Choice(["fp16", "bf16"]), help="For fp32 models: the low type to check against [fp16].")
@click.option("--rules", multiple=True, type=PATH, help="Conversion rule files (decide what the rules protect).")
@click.option("--config", type=PATH, help="Configuration file (default: discovered).")
def lint(models, fmt, output, select, ignore, fail_on, precision, rules, config) -> None:
    """Find numerically unsafe low-precision ops in MODELS (converted, or fp32 as if converted).

    Exit codes: 0 no finding at or above --fail-on, 1 findings, 2 usage or input error, 3 internal error."""
    from ..config import load_settings
    from ..lint import lint as run_lint
    from ..report.lint import lint_json, lint_text, sarif_json

    def body(written):
        from ..io import check_outputs

        settings, config_file = load_settings(config=config)
        options = _lint_options(settings, select, ignore, fail_on, precision, rules)
        check_outputs([("-o", output)], [*models, config_file, *options.rules], model_inputs=models)
        written.track(output)
        if len(models) > 1:
            # configuration suppressions are judged over all the models together
            from ..lint.engine import unused_config_suppressions

            options.report_unused_config = False
            results = [run_lint(m, options) for m in models]
            results[-1].diagnostics.extend(unused_config_suppressions(results, options))
        else:
            results = [run_lint(m, options) for m in models]
        if fmt == "json":
            text = lint_json(results)
        elif fmt == "sarif":
            text = sarif_json([d for r in results for d in r.diagnostics])
        else:
            text = lint_text(results)
        _write_or_echo(text, output)
        return any(r.failed(options.fail_on) for r in results)

    failed = run_guarded(body, doing="linting", subject=", ".join(str(m) for m in models[:3])
                         + (f" and {len(models) - 3} more" if len(models) > 3 else ""))
    sys.exit(EXIT_FAIL if failed else EXIT_OK)


@cli.command("rules")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text", show_default=True)
def rules_cmd(fmt) -> None:
    """List the lint checks: code, name, severity, summary (markdown: the docs/rules.md page)."""
    import json as _json

    from ..lint.catalog import load_checks
    from ..report.lint import rules_markdown, rules_text

    def body(written):
        if fmt == "markdown":
            click.echo(rules_markdown(), nl=False)
        elif fmt == "json":
            click.echo(_json.dumps([{"code": c.code, "name": c.name, "severity": c.severity, "summary": c.summary,
                                     "why": " ".join(c.why.split()), "fix": c.fix, "kind": c.kind}
                                    for c in load_checks()], indent=1))
        else:
            click.echo(rules_text())

    run_guarded(body, doing="listing the lint checks")


@cli.command()
@click.argument("model", type=PATH)
@click.argument("node", type=TEXT)
@click.option("--precision", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True)
@click.option("--rules", multiple=True, type=PATH, help="Extra rule files, as for convert.")
@click.option("--exclude-op", multiple=True, type=TEXT)
@click.option("--exclude-node", multiple=True, type=TEXT)
@click.option("--include-node", multiple=True, type=TEXT)
@click.option("--calibration-data", type=PATH, help="Measure tensor ranges on this data first.")
def explain(model, node, precision, rules, exclude_op, exclude_node, include_node, calibration_data) -> None:
    """Say which precision NODE of MODEL gets and why: the rules that fired (file:line) and
    measured values. NODE is a node name, or #ID for the plan's node id."""
    from ..io import load_model
    from ..pipeline import convert

    def body(written):
        source = load_model(model).model
        ranges = None
        if calibration_data is not None:
            from ..validate import runner
            from ..validate.calibrate import calibrate
            from ..validate.inputs import check_batches, describe_inputs, load_batches

            specs = describe_inputs(source)
            check_batches(calibration_data, specs)
            device, _ = runner.resolve_device("auto")
            ranges = calibrate(source, load_batches(calibration_data, specs), device)
        result = convert(model, precision=precision, rules=list(rules), exclude_ops=list(exclude_op),
                         exclude_nodes=list(exclude_node), include_nodes=list(include_node), check="none",
                         calibration=ranges)
        entries = result.plan.by_name(node)
        if not entries and node.startswith("#") and node[1:].isdigit():
            entries = [e for e in result.plan.nodes if e.id == int(node[1:])]
        if not entries:
            import difflib

            names = [e.name for e in result.plan.nodes if e.name]
            close = difflib.get_close_matches(node, names, n=3, cutoff=0.5)
            raise AutocastError(f"no node named {node!r}", str(model),
                                ("did you mean " + ", ".join(repr(c) for c in close) + "?") if close
                                else "use a node name or #ID (see --plan-out of convert)")
        for entry in entries:
            graph = "" if entry.graph == "main" else f" in {entry.graph}"
            click.echo(f"{entry.label} ({entry.domain + ':' if entry.domain else ''}{entry.op_type}){graph}, node #{entry.id}")
            click.echo(f"  category: {entry.category}")
            click.echo(f"  precision: {entry.precision}")
            if entry.fp32_inputs or entry.fp32_outputs:
                click.echo(f"  pinned fp32 ports: inputs {entry.fp32_inputs}, outputs {entry.fp32_outputs}")
            click.echo("  because:")
            for reason in entry.reasons:
                value = "" if reason.value is None else f" (measured {reason.value:.4g})"
                click.echo(f"    - [{reason.code}] {reason.message}{value}" + (f"  ({reason.source})" if reason.source else ""))

    run_guarded(body, doing="explaining", subject=f"node {node!r} of {model}")


def _check_steps(model, out, output, precision, options, vopts, skip_validate):
    """lint -> convert -> lint -> validate, for `check`."""
    from ..lint import lint as run_lint
    from ..lint.engine import unused_config_suppressions
    from ..pipeline import convert_file

    before = run_lint(model, options)
    converted = convert_file(model, out, precision=precision, rules=options.rules)
    after = run_lint(out, options)
    if output is None:
        # the converted file is temporary: findings point at the model that was checked
        after.model = str(model)
        for d in after.diagnostics:
            d.model = str(model)
    after.diagnostics.extend(unused_config_suppressions([before, after], options))
    validation_report = None
    if not skip_validate:
        from ..validate.core import validate

        validation_report = validate(model, out, vopts, progress=_progress)
    return before, after, converted, validation_report


@cli.command()
@click.argument("model", type=PATH)
@click.option("-o", "--output", type=PATH, help="Keep the converted model here (default: a temporary file).")
@click.option("--precision", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True)
@click.option("--rules", multiple=True, type=PATH, help="Extra conversion rule files.")
@click.option("--select", multiple=True, type=TEXT, help="Lint checks to run (codes, prefixes, names).")
@click.option("--ignore", multiple=True, type=TEXT, help="Lint checks to skip.")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"]), help="Lowest lint severity that fails [error].")
@click.option("--baseline", type=PATH, help="A previous --report-json: fail only on new findings or regressions.")
@click.option("--sarif", type=PATH, help="Write the lint findings as SARIF 2.1.0 ('-': stdout).")
@click.option("--config", type=PATH, help="Configuration file (default: discovered).")
@click.option("--no-validate", "skip_validate", is_flag=True, help="Skip the accuracy/speed validation.")
@validation_options
def check(model, output, precision, rules, select, ignore, fail_on, baseline, sarif, config, skip_validate,
          **validation) -> None:
    """The CI gate: lint MODEL, convert it, lint the result, validate it; one summary, one exit code.

    Exit codes: 0 pass, 1 findings at or above --fail-on or a failed threshold (with --baseline: only
    new findings and regressions), 2 usage or input error, 3 internal error."""
    import json as _json
    import tempfile

    from ..config import load_settings
    from ..io import write_text_atomic
    from ..report.checkgate import check_summary, compare_baseline
    from ..report.lint import lint_dict, sarif_json

    report_json = validation.pop("report_json", None)
    report_html = validation.pop("report_html", None)

    def body(written):
        from ..io import check_outputs

        settings, source = load_settings(config=config)
        options = _lint_options(settings, select, ignore, fail_on, None, rules)
        options.precision = precision
        vopts = _validate_options(validation, settings)
        prior = None
        if baseline is not None:
            try:
                prior = _json.loads(Path(baseline).read_text())
                prior["lint_converted"]["diagnostics"]
            except (OSError, ValueError, KeyError, TypeError):
                raise AutocastError("not a check report (--report-json of autocast-onnx check)", str(baseline),
                                    "write one with --report-json") from None
        check_outputs([("-o", output), ("--report-json", report_json), ("--report-html", report_html),
                       ("--sarif", sarif)],
                      [model, baseline, vopts.inputs, source, config, *options.rules], models=["-o"],
                      read_back=["-o"], model_inputs=[model])
        if not skip_validate:
            _precheck_validation(model, vopts)
        # configuration suppressions are judged over both lints: a finding the conversion removes
        # does not make its suppression "unused"
        options.report_unused_config = False
        if output is not None:
            written.track(output, Path(output).with_name(Path(output).name + ".data"))
        written.track(report_json, report_html, sarif)
        with tempfile.TemporaryDirectory() as tmp:
            out = output or Path(tmp) / f"{Path(model).stem}.{precision}.onnx"
            before, after, converted, validation_report = _check_steps(
                model, out, output, precision, options, vopts, skip_validate)
        report = {
            "schema_version": 1,
            "model": str(model),
            "converted": str(output) if output else None,
            "config": source,
            "fail_on": options.fail_on,
            "lint_original": lint_dict([before]),
            "conversion": {"precision": precision, "counts": converted.plan.counts(),
                           "casts_added": converted.stats.casts_added,
                           "warnings": [w.message for w in converted.plan.warnings]},
            "lint_converted": lint_dict([after]),
            "validation": validation_report,
        }
        report["gate"] = compare_baseline(report, prior, after, options.fail_on)
        click.echo(check_summary(report), err=_to_stdout(report_json, report_html, sarif))
        if report_json is not None:
            write_text_atomic(Path(report_json), _json.dumps(report, indent=1, default=float, allow_nan=False) + "\n")
        if report_html is not None and validation_report is not None:
            from ..report.html import validation_html

            write_text_atomic(Path(report_html), validation_html(validation_report))
        if sarif is not None:
            write_text_atomic(Path(sarif), sarif_json(after.diagnostics) + "\n")
        return report["gate"]["passed"]

    passed = run_guarded(body, doing="checking", subject=model)
    sys.exit(EXIT_OK if passed else EXIT_FAIL)


def main(argv=None) -> None:
    """Entry point: usage errors (unknown option, bad choice, missing argument) become one line
    and exit code 2, like every other bad input; anything unexpected that escapes a command is
    one line and exit code 3."""
    try:
        cli.main(args=argv, prog_name="autocast-onnx", standalone_mode=False)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "autocast-onnx"
        _fail(f"{' '.join(exc.format_message().split())} (see {command} --help)", EXIT_INPUT)
    except click.ClickException as exc:
        _fail(" ".join(exc.format_message().split()), EXIT_INPUT)
    except click.Abort:
        _fail("aborted", 130)
    except Exception as exc:  # noqa: BLE001 - outside any command body: still one line
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        _fail(f"internal error: {_one_line(exc)} ({BUG_HINT})", EXIT_INTERNAL)
    sys.exit(EXIT_OK)


if __name__ == "__main__":
    main()
