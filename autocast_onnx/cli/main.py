"""Stage: CLI. Parses options, calls the pipeline, prints reports, maps errors to exit codes:
0 success, 1 a failed threshold or findings, 2 bad input or usage (one line, no traceback),
3 internal error (a bug; one line, the traceback with AUTOCAST_ONNX_DEBUG=1).

Every command checks all its option values and outputs before any work, writes '-' outputs to
stdout (then its human-readable text goes to stderr), and leaves none of its outputs behind when
it ends in exit 2 or 3 after writing them."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from ..errors import AutocastError, InternalCheckError, one_line, printable_lines, printable_text

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
BUG_HINT = "this is a bug in autocast-onnx; rerun with AUTOCAST_ONNX_DEBUG=1 for a traceback and please report it"


def _say(kind: str, message: str) -> None:
    """Print 'autocast-onnx: KIND: MESSAGE' on stderr as exactly one line: a newline or other
    control character in the message (a name from a model, a rule file or a path) is escaped,
    so it can neither split the line nor forge another."""
    click.echo(f"autocast-onnx: {kind}: {one_line(message)}", err=True)


def _echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """click.echo for the commands' text: every control character but the line breaks escaped
    (printable_text), so that a name from a model or a path can neither move, clear or retitle
    the terminal nor, in a CI log, hide in a carriage return. The text reports escape each name
    where they place it (printable_lines); this is the guard behind them."""
    click.echo(printable_text(text), err=err, nl=nl)


def _fail(message: str, code: int) -> None:
    _say("error", message)
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
    this run wrote are removed (all or nothing). The paths given with a trailing separator are
    folders to the output checks (io.spelled_as_folders)."""
    from ..io import OutputSnapshot, spelled_as_folders

    outputs = OutputSnapshot()
    context = f"{doing} {subject}" if subject is not None else doing
    ctx = click.get_current_context(silent=True)
    try:
        with spelled_as_folders(ctx.meta.get(_FOLDER_SPELLINGS, ()) if ctx is not None else ()):
            return fn(outputs)
    except AutocastError as exc:
        outputs.discard()
        _fail(exc.line(), EXIT_INPUT)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM under run() (Terminated)
        outputs.discard()
        _fail(f"{_interruption(exc)}; nothing was written", _interrupted_code(exc))
    except BrokenPipeError:
        # the reader of stdout stopped early (`| head`): what it read is all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_OK)
    except MemoryError:
        outputs.discard()
        _fail(
            f"out of memory while {context}: the model or its inputs are too large for this machine "
            "(use smaller --dim/--batches, or a machine with more memory)",
            EXIT_INPUT,
        )
    except Exception as exc:
        outputs.discard()
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        _fail(f"internal error while {context}: {_one_line(exc)} ({BUG_HINT})", EXIT_INTERNAL)


_FOLDER_SPELLINGS = "autocast_onnx.folder_spellings"  # ctx.meta: the paths given as 'NAME/'


class _PathType(click.Path):
    """click.Path that refuses an empty value (click would read it as '.'), and notes in
    ctx.meta a value that ends in a separator ('out/'): the Path it becomes no longer shows
    that it names a folder, which an output must not be written as (see run_guarded)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty path; give a file name", param, ctx)
        path = super().convert(value, param, ctx)
        if ctx is not None and isinstance(value, str) and value != "-" and value.endswith(("/", os.sep)):
            ctx.meta.setdefault(_FOLDER_SPELLINGS, set()).add(Path(os.fsdecode(path)))
        return path


class _TextType(click.ParamType):
    """A string that must not be empty or blank."""

    name = "text"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("empty value", param, ctx)
        return value


PATH = _PathType(path_type=Path)
TEXT = _TextType()
MAX_BATCHES, MAX_ITERATIONS, MAX_WARMUP = 10_000, 1_000_000, 100_000
MAX_GENERATE = 1024  # tokens of greedy continuation: beyond a small model's positions ONNX Runtime says so


# ---- option groups (each owns its options; commands stack the groups they need) ----------------


def _stack(options):
    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def config_option(f):
    """--config: the configuration file every command reads (default: discovered)."""
    return click.option(
        "--config",
        type=PATH,
        help="Configuration file (default: the nearest autocast-onnx.toml or pyproject.toml "
        "with [tool.autocast-onnx]).",
    )(f)


def strict_option(f):
    """--strict: what is otherwise a warning (a selector that matches nothing, a comparison that
    compares nothing) is an error or a failure."""
    return click.option(
        "--strict",
        is_flag=True,
        help="Warnings fail: a node rule, --exclude-node/--include-node pattern or --exclude-op/--include-op that "
        "matches no node is an error (exit 2); a validation that compares nothing (empty batch, non-finite reference, "
        "the same model twice, arguments swapped) fails (exit 1).",
    )(f)


def verbose_option(f):
    """-v: debug log lines of every stage and pass on stderr."""
    return click.option("-v", "--verbose", is_flag=True, help="Log each stage and pass (stderr).")(f)


def plan_options_group(keep_io: bool = True):
    """What decides the plan: shared by convert, explain, lint and check, so that all of them
    plan every node alike (flags override the configuration file)."""
    options = [
        click.option(
            "--precision",
            type=click.Choice(["fp16", "bf16"]),
            default=None,
            help="Low-precision type for the nodes that can take it [default: fp16, or the configuration's].",
        ),
        click.option(
            "--rules",
            "rules",
            multiple=True,
            type=PATH,
            help="Extra rule file (TOML), applied over the default profile; repeatable, later wins.",
        ),
        click.option(
            "--exclude-op", multiple=True, type=TEXT, help="Keep every node of this op type in fp32 (repeatable)."
        ),
        click.option(
            "--include-op",
            multiple=True,
            type=TEXT,
            help="Force every node of this op type to low precision (repeatable; an exclude wins).",
        ),
        click.option(
            "--exclude-node",
            multiple=True,
            type=TEXT,
            help="Keep nodes whose name matches this regex in fp32 (repeatable).",
        ),
        click.option(
            "--include-node",
            multiple=True,
            type=TEXT,
            help="Force nodes whose name matches this regex to low precision (repeatable).",
        ),
        click.option(
            "--opset",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help="Upgrade the model's default-domain opset to N (ONNX's version converter) before planning: "
            "bf16 Conv needs 22, BatchNormalization with fp32 parameters 15, fp16 Q/DQ scales 19. Never done unasked.",
        ),
        click.option(
            "--runtime",
            type=click.Choice(["cuda", "tensorrt", "dml", "any"]),  # plan.options.RUNTIME_CHOICES
            default=None,
            help="Plan for this runtime: keep fp32 the nodes it has no fp16/bf16 kernel for (ONNX Runtime's CUDA "
            "or DirectML provider, TensorRT; kernel tables in autocast_onnx/data), and run low between low "
            "neighbours the kept-fp32 ops its kernels compute in fp32 anyway; any: count on no runtime's kernels "
            "[default: cuda].",
        ),
        click.option(
            "--precise",
            is_flag=True,
            default=None,
            help="The precise plan: normalizations and softmaxes keep fp32 inputs and outputs, and with them the "
            "residual stream (more Casts, lower error). Without it the fast plan runs them at low-precision "
            "inputs and outputs with their neighbours where the runtime's kernel computes them in fp32 "
            "[default: the fast plan].",
        ),
    ]
    if keep_io:
        options.insert(
            2,
            click.option(
                "--keep-io-types/--no-keep-io-types",
                default=None,
                help="Keep the types of the model's inputs and outputs [default: keep].",
            ),
        )
        options.insert(
            3,
            click.option(
                "--low-precision-io",
                type=TEXT,
                default=None,
                metavar="REGEX",
                help="Give the model inputs and outputs whose whole name matches this regex the low-precision "
                "type (e.g. a KV cache: 'past_key_values\\..*|present\\..*').",
            ),
        )
    return _stack(options)


def lint_options_group(f):
    """Which lint checks run and what fails."""
    return _stack(
        [
            click.option(
                "--select",
                multiple=True,
                type=TEXT,
                help="Check codes, prefixes or names to run (repeatable; default all).",
            ),
            click.option(
                "--ignore", multiple=True, type=TEXT, help="Check codes, prefixes or names to skip (repeatable)."
            ),
            click.option(
                "--fail-on", type=click.Choice(["error", "warning", "info"]), help="Lowest severity that fails [error]."
            ),
        ]
    )(f)


class _OneLineFormatter(logging.Formatter):
    """-v logs, one line per record: control characters in the message are escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


def _setup(config, verbose):
    """(settings, configuration file) for a command, after turning on debug logs if asked."""
    import logging

    from ..config import load_settings

    root = logging.getLogger("autocast_onnx")
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLineFormatter("autocast-onnx: %(name)s: %(message)s"))
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG)
    else:
        root.handlers[:] = []
        root.setLevel(logging.NOTSET)
    return load_settings(config=config)


def _plan_from(settings, kw):
    """The command's PlanOptions, built once from the configuration and its flags: each planning
    option's flag is read by the click name PlanOptions declares for it (plan/options.py); one the
    command does not have reads as not given."""
    from ..plan.options import cli_name, plan_options, planning_fields

    return plan_options(settings, **{option.name: kw.get(cli_name(option)) for option in planning_fields()})


def _given(ctx, names) -> list[str]:
    """The options among `names` given on the command line (not left at their defaults)."""
    from click.core import ParameterSource

    out = []
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) not in (ParameterSource.DEFAULT, None):
            out.append(next((o for o in param.opts if o.startswith("--")), param.opts[0]))
    return out


def _refuse_unused(ctx, names, why: str, hint: str) -> None:
    """Nothing silent: an option that would do nothing in this run is an error."""
    given = _given(ctx, names)
    if given:
        raise AutocastError(f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect {why}", None, hint)


def _refuse_generation_with_inputs(ctx, kw) -> None:
    """--inputs gives the batches: the options that shape generated inputs would do nothing."""
    if kw.get("inputs") is not None:
        _refuse_unused(
            ctx,
            ("dims", "ranges", "batches", "seed"),
            "with --inputs (the arrays' own shapes and values are used)",
            "drop them, or drop --inputs to generate inputs",
        )


def input_options_group(
    batches: bool = True,
    inputs_help: str = "An .npz file (one batch), a Polygraphy JSON input file (--save-inputs FILE.json; one batch "
    "per feed dict) or a folder of either.",
):
    """Where a run's inputs come from: --inputs, or batches generated from --dim, --input-range and
    --seed (and --batches of them). Shared by validate, convert --validate/--target, check and
    diagnose (one batch: no --batches)."""
    options = [
        click.option("--inputs", type=PATH, help=inputs_help),
        click.option(
            "--dim",
            "dims",
            multiple=True,
            type=TEXT,
            help="Size of a dynamic input dimension: NAME=VALUE for a symbolic one, INPUT:AXIS=VALUE for an unnamed "
            "one (repeatable). convert: also the size of the summary's cast traffic and GPU estimate.",
        ),
        click.option(
            "--input-range",
            "ranges",
            multiple=True,
            type=TEXT,
            help="Range of generated values, NAME=LO:HI (repeatable).",
        ),
        click.option(
            "--seed",
            type=click.IntRange(0, 2**32 - 1),
            default=0,
            show_default=True,
            help="Seed for generated inputs (0 to 2**32-1).",
        ),
    ]
    if batches:
        options.insert(
            3,
            click.option(
                "--batches",
                type=click.IntRange(1, MAX_BATCHES),
                default=None,
                help="Generated batches when no --inputs [default: 1, or the configuration's].",
            ),
        )
    return _stack(options)


def validation_options(f):
    """Options shared by `validate`, `convert --validate` and `check`."""
    return _stack(
        [
            input_options_group(),
            click.option(
                "--device",
                type=click.Choice(["auto", "cpu", "cuda"]),
                default="auto",
                show_default=True,
                help="Where to run: CUDA when onnxruntime-gpu and a GPU are there (auto), or force one.",
            ),
            click.option(
                "--numerics",
                type=click.Choice(["auto", "emulate", "plain"]),
                default="auto",
                show_default=True,
                help="emulate: round every low-precision tensor like a GPU (default on CPU); plain: run as is.",
            ),
            *_threshold_options(),
            click.option(
                "--class-output",
                "class_outputs",
                multiple=True,
                type=TEXT,
                help="Treat this output as class scores (top-1/top-k).",
            ),
            click.option(
                "--generate",
                type=click.IntRange(0, MAX_GENERATE),
                default=16,
                show_default=True,
                help="Causal LMs: tokens of greedy continuation to compare (0: none).",
            ),
            click.option(
                "--speed/--no-speed",
                default=None,
                help="Measure latency and speed-up [default: on CUDA only (on CPU it says nothing about a GPU), "
                "or the configuration's].",
            ),
            click.option(
                "--iterations",
                type=click.IntRange(1, MAX_ITERATIONS),
                default=None,
                help="Timed runs per model [default: 20, or the configuration's].",
            ),
            click.option(
                "--warmup",
                type=click.IntRange(0, MAX_WARMUP),
                default=None,
                help="Untimed runs first [default: 3, or the configuration's].",
            ),
            click.option(
                "--save-inputs",
                type=PATH,
                help="Write the generated batches before the models run (kept when validation fails), to replay "
                "them with --inputs: a FILE.json is Polygraphy's input file (every batch; polygraphy run "
                "--load-inputs reads it), any other name one batch as an .npz.",
            ),
            click.option("--report-json", type=PATH, help="Write the report as JSON ('-': stdout)."),
            click.option("--report-html", type=PATH, help="Write a self-contained HTML report ('-': stdout)."),
        ]
    )(f)


def _threshold_options():
    """The validation thresholds: each takes X (every output) and NAME=X (one output), repeatable."""
    per_output = " X for every output, NAME=X for one (repeatable)."

    def threshold(flag: str, text: str):
        return click.option(flag, multiple=True, type=TEXT, metavar="[NAME=]X", help=text + per_output)

    return [
        threshold("--atol", "Max absolute error [off]."),
        threshold("--rtol", "Max error relative to max(max |reference|, the low type's resolution at 1) [0.01]."),
        threshold("--min-cosine", "Min cosine similarity, -1 to 1 [0.999]."),
        threshold("--min-top1", "Min top-1 agreement of class-score outputs, 0 to 1 [0.99]."),
        threshold("--min-iou", "Min IoU of a probability map's masks, 0 to 1; replaces atol/rtol/cosine there [0.99]."),
        threshold("--map-threshold", "A probability map's mask is its values above this, 0 to 1 [0.5]."),
        click.option(
            "--compare-padded",
            is_flag=True,
            default=False,
            help="Also compare the positions an attention-mask input marks as padding (left out by default).",
        ),
    ]


# validation options by what uses them: the comparison alone, or also the --target search's inputs
_COMPARE_ONLY = (
    "atol",
    "rtol",
    "min_cosine",
    "min_top1",
    "min_iou",
    "class_outputs",
    "generate",
    "speed",
    "iterations",
    "warmup",
    "save_inputs",
    "numerics",
    "report_json",
    "report_html",
)
# the --target search runs on these inputs and measures as validation does (padding, map masks)
# --dims also sizes the summary's cast traffic and GPU estimate, so it is never without effect
_INPUT_OPTIONS = ("inputs", "ranges", "batches", "seed", "map_threshold", "compare_padded")


LONG_STAGE_S = 1.0  # without a terminal, a stage that took longer says so in one line


def _progress(label, total):
    """Progress of one stage of long work, on stderr. On a terminal: a bar with the steps done
    (the search's bar also shows its best set so far). Without a terminal: one line when a stage
    that took over LONG_STAGE_S ends, with its time (the --target search prints its own line per
    evaluation instead)."""
    import time

    start = time.perf_counter()
    tty = sys.stderr.isatty()
    if not tty and label.startswith("--target search"):
        return None
    if tty and total >= 2:
        bar = click.progressbar(length=total, label=one_line(label), file=sys.stderr, show_eta=False, show_pos=True)
        bar.__enter__()

        class _Bar:
            def update(self, n):
                bar.update(n)

            def describe(self, text: str) -> None:
                """Change the label (e.g. the search's best passing set so far)."""
                bar.label = one_line(text)  # it may name nodes of the model
                bar.render_progress()

            def finish(self):
                bar.__exit__(None, None, None)

        return _Bar()
    if tty:  # a single step on a terminal: nothing to move
        return None

    class _Line:
        done = 0

        def update(self, n):
            self.done += n

        def finish(self):
            took = time.perf_counter() - start
            if took >= LONG_STAGE_S:  # quick stages stay quiet; stderr then holds only errors
                steps = f" ({self.done} of {total})" if total >= 2 and self.done != total else ""
                _echo(f"{label}{steps}: done in {took:.1f} s", err=True)

    return _Line()


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


# --help lists a command's options in these named groups, in this order (by parameter name)
OPTION_GROUPS = (
    ("Input and output", ("output", "plan_out", "external_data", "check", "fmt", "quiet", "top", "jobs", "gpu")),
    (
        "Precision and rules",
        (
            "precision",
            "rules",
            "keep_io_types",
            "low_precision_io",
            "opset",
            "runtime",
            "precise",
            "plan_file",
            "loss_scale",
        ),
    ),
    ("Node selection", ("exclude_op", "include_op", "exclude_node", "include_node", "op_type", "islands", "frontier")),
    ("Data-driven planning", ("calibration_data", "targets")),
    (
        "Validation inputs",
        (
            "run_validate",
            "skip_validate",
            "inputs",
            "dims",
            "ranges",
            "batches",
            "seed",
            "save_inputs",
            "device",
            "numerics",
        ),
    ),
    (
        "Accuracy thresholds",
        (
            "atol",
            "rtol",
            "min_cosine",
            "min_top1",
            "min_iou",
            "map_threshold",
            "compare_padded",
            "class_outputs",
            "generate",
            "strict",
        ),
    ),
    ("Speed", ("speed", "iterations", "warmup")),
    ("Lint", ("select", "ignore", "fail_on", "exit_zero", "statistics", "show_protected", "baseline")),
    ("Reports", ("report_json", "report_html", "sarif", "plan_out_json")),
    ("General", ("config", "verbose", "help", "version")),
)


class GroupedCommand(click.Command):
    """A command whose --help shows its options in named groups (OPTION_GROUPS)."""

    def format_options(self, ctx, formatter) -> None:
        rows: dict[str, list] = {}
        order = {name: title for title, names in OPTION_GROUPS for name in names}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:
                continue
            name = "help" if "--help" in param.opts else param.name or ""
            rows.setdefault(order.get(name, "Other options"), []).append(record)
        for title in [t for t, _ in OPTION_GROUPS] + ["Other options"]:
            if rows.get(title):
                with formatter.section(title):
                    formatter.write_dl(rows[title])


class GroupedGroup(click.Group):
    command_class = GroupedCommand


def version_text() -> str:
    """What --version prints: this tool's version and those of the libraries that decide its
    results (onnx: the checker, shape inference and opsets; onnxruntime: validation), read from
    the installed packages' metadata without importing them."""
    from importlib import metadata

    from .._version import __version__

    def installed(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    ort = installed("onnxruntime", "onnxruntime-gpu", "onnxruntime-training", "onnxruntime-directml")
    return f"autocast-onnx {__version__} (onnx {installed('onnx')}, onnxruntime {ort}, Python {sys.version.split()[0]})"


def _print_version(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        _echo(version_text())
        ctx.exit()


@click.group(cls=GroupedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version, with onnx's and onnxruntime's, and exit.",
)
def cli() -> None:
    """Automatic mixed precision for ONNX models, correct by default and explained node by node."""


MAX_JOBS = 1024  # -j's bound: more worker processes than any machine has cores


def jobs_option(f):
    """-j N: models worked on at once, in worker processes (cli/batch.py)."""
    return click.option(
        "-j",
        "--jobs",
        type=click.IntRange(min=1, max=MAX_JOBS),
        default=None,
        help="With several models: how many to work on at once, in that many worker processes "
        "(default: the number of cores; 1: one after the other in this process).",
    )(f)


@cli.command()
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

    _refuse_convert_options_without_effect(call)
    settings, config_file = _setup(call.config, call.verbose)
    plan = _plan_from(settings, call.kw)
    _choose_gpu(call, settings)
    if call.loss_scale is not None:
        from ..rewrite.loss_scale import parse_loss_scale

        parse_loss_scale(call.loss_scale)
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
    training_step = _prepare_validation(call, options)
    measured = _plan_on_data(call, plan, options, goal)
    written.track(out, Path(out).with_name(Path(out).name + ".data"), call.plan_out, call.report_json, call.report_html)
    result = _run_conversion(call, out, replay, plan, measured)
    _print_conversion(call, result, out)
    if not call.run_validate:
        return True
    try:
        return _validate_converted(call, out, options, training_step)
    except AutocastError as exc:
        # the conversion succeeded: keep it (and its plan), say it was not validated, exit 2
        written.keep(out, Path(out).with_name(Path(out).name + ".data"), call.plan_out)
        raise _not_validated(exc, call.model, out) from None


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


def _prepare_validation(call: _ConvertCall, options) -> bool:
    """Before converting, check that --validate can run; True when it validates a training step
    (the model is a training graph) rather than comparing outputs."""
    training_step = call.run_validate and _is_training_model(call.model)
    if training_step:
        _refuse_for_training_step(
            call.ctx, _given(call.ctx, [*_COMPARE_ONLY, *_INPUT_OPTIONS, "device", "calibration_data", "targets"])
        )
        _require_training_runtime(call.model)
    elif call.run_validate:
        from ..validate.core import precheck

        precheck(call.model, options)
    return training_step


def _plan_on_data(call: _ConvertCall, plan, options, goal):
    """What running the model decides before the conversion: --calibration-data's fp32 nodes and
    the --target search (whose log is printed here)."""
    from ..validate.on_data import plan_on_data

    measured = plan_on_data(
        call.model,
        plan,
        calibration_data=call.calibration_data,
        targets=call.targets if goal else (),
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


def _validate_converted(call: _ConvertCall, out, options, training_step: bool) -> bool:
    """convert --validate: compare the converted model with MODEL (or run a training step), print
    and write the report; True when every threshold passed."""
    if training_step:
        call.echo("")
        return _training_step(call.model, out, options, call.echo, call.report_json)
    from ..report.validation import validation_text
    from ..validate.core import validate as run_validation

    call.echo("")
    report = run_validation(call.model, out, options, progress=None if call.quiet else _progress)
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


def _jobs_without_effect(jobs) -> None:
    """Nothing silent: -j with one model does nothing, said in a warning."""
    if jobs is not None:
        _say("warning", "-j has no effect with one model: it sets how many models are worked on at once")


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
    _refuse_convert_options_without_effect(call)
    settings, config_file = _setup(call.config, call.verbose)
    plan = _plan_from(settings, call.kw)
    _choose_gpu(call, settings)
    if call.loss_scale is not None:
        from ..rewrite.loss_scale import parse_loss_scale

        parse_loss_scale(call.loss_scale)
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


@cli.command()
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


@cli.command()
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


@cli.command()
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


def _is_training_model(path) -> bool:
    """Whether `path` is an onnxruntime-training training model (its validation is one step)."""
    from ..graph.training import recognise
    from ..io import load_model

    if not Path(path).is_file():
        return False
    training = recognise(load_model(path, load_external=False).model)
    return training is not None and bool(training.accumulations)


def _refuse_for_training_step(ctx, given) -> None:
    refused = [name for name in given if name not in ("--inputs", "--seed", "--report-json")]
    if refused:
        raise AutocastError(
            f"{', '.join(refused)} cannot be used when validating a training step",
            ctx.info_name,
            "a training step is validated with --inputs or --seed, and --report-json",
        )


def _require_training_runtime(model) -> None:
    from ..validate.training import HINT, has_training_runtime

    if not has_training_runtime():
        raise AutocastError("validating a training step needs onnxruntime-training", str(model), HINT)


def _training_step(reference, converted, options, echo, report_json) -> bool:
    """One training step of each model, compared gradient by gradient (validate/training.py)."""
    from ..validate.training import training_step_text, validate_training_step

    report = validate_training_step(reference, converted, inputs=options.inputs, seed=options.seed)
    echo(training_step_text(report))
    if report_json is not None:
        _write_or_echo(json.dumps(report, indent=1), report_json)
    return report["passed"]


def _write_or_echo(text: str, output) -> None:
    from ..io import is_stdout, write_text_atomic

    if output is None or is_stdout(output):
        click.echo(text)
    else:
        write_text_atomic(Path(output), text + "\n")


def _expand_models(models) -> tuple[list[Path], list[str]]:
    """The model files to lint: files as given, folders searched for *.onnx (sorted); and one
    error line per argument that gives none."""
    paths: list[Path] = []
    errors: list[str] = []
    for m in models:
        p = Path(m)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.onnx") if f.is_file())
            if not found:
                errors.append(
                    AutocastError("folder holds no .onnx file", str(p), "pass model files or a folder of them").line()
                )
            paths.extend(found)
        else:
            paths.append(p)
    return paths, errors


def selected_any(checks, selector: str) -> bool:
    from ..lint.engine import selected

    try:
        return bool(selected(checks, [selector], ()))
    except AutocastError:
        return False


def _colour() -> bool:
    """Colour on a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


@cli.command()
@click.argument("models", nargs=-1, required=True, type=PATH)
@click.option(
    "--format",
    "--output-format",
    "fmt",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="Report format (--output-format is the same option).",
)
@click.option("-o", "--output", type=PATH, help="Write the report here instead of stdout ('-': stdout).")
@click.option("--statistics", is_flag=True, help="Count the findings per check instead of listing them.")
@click.option(
    "--exit-zero", is_flag=True, help="Exit 0 even with findings at or above --fail-on (input errors exit 2)."
)
@click.option(
    "--show-protected",
    is_flag=True,
    help="fp32 models: list the findings the conversion rules protect (info) instead of counting them in one line.",
)
@jobs_option
@lint_options_group
@plan_options_group(keep_io=False)
@config_option
@verbose_option
def lint(
    models, fmt, output, statistics, exit_zero, show_protected, jobs, select, ignore, fail_on, config, verbose, **kw
):
    """Find numerically unsafe low-precision ops in MODELS: files, or folders searched for .onnx
    files (converted models, or fp32 models as if converted).

    For fp32 models, --precision is the type to check against and the plan options decide which
    findings the conversion protects (reported as info, counted in one line unless --show-protected).
    A model that cannot be read is reported on stderr and the others are linted; so is one whose
    linting fails unexpectedly. With several models, -j of them are linted at once.

    Exit codes: 0 no finding at or above --fail-on, 1 findings, 2 usage or input error (also when
    any model could not be read), 3 internal error (also when linting any model failed unexpectedly)."""
    from dataclasses import replace

    from ..lint.report import lint_json, lint_statistics, lint_text, sarif_json

    bad_inputs: list[str] = []
    internal: list[str] = []

    def body(written):
        from ..io import check_outputs
        from ..lint.engine import lint_options

        settings, config_file = _setup(config, verbose)
        plan = _plan_from(settings, kw)
        options = lint_options(
            settings,
            select=select,
            ignore=ignore,
            fail_on=fail_on,
            plan=plan,
            precision_given=bool(kw.get("precision") or settings.get("precision")),
        )
        paths, errors = _expand_models(models)
        bad_inputs.extend(errors)
        existing = [p for p in paths if p.exists()]
        check_outputs([("-o", output)], [*existing, config_file, *options.rules], model_inputs=existing)
        written.track(output)
        many = len(paths) > 1
        if many:
            # configuration suppressions are judged over all the models together
            options = replace(options, report_unused_config=False)
        if not many:
            _jobs_without_effect(jobs)
        results = _lint_each(paths, options, jobs, bad_inputs, internal)
        if many and results:
            from ..lint.engine import unused_config_suppressions

            results[-1].diagnostics.extend(unused_config_suppressions(results, options))
        if statistics:
            text = lint_statistics(results, fmt)
        elif fmt == "json":
            text = lint_json(results)
        elif fmt == "sarif":
            text = sarif_json([d for r in results for d in r.diagnostics])
        else:
            text = lint_text(
                results,
                show_protected=show_protected,
                colour=output is None and _colour(),
                verbose=verbose,
                rules=options.rules,
            )
        if results or fmt != "text":
            _write_or_echo(text, output)
        return any(r.failed(options.fail_on) for r in results)

    failed = run_guarded(
        body,
        doing="linting",
        subject=", ".join(str(m) for m in models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else ""),
    )
    for line in bad_inputs + internal:
        _say("error", line)
    if internal:
        sys.exit(EXIT_INTERNAL)
    if bad_inputs:
        sys.exit(EXIT_INPUT)
    sys.exit(EXIT_FAIL if failed and not exit_zero else EXIT_OK)


def _lint_each(paths, options, jobs, bad_inputs: list, internal: list) -> list:
    """Lint each model (-j at once, cli/batch.py): the results of those linted, in order; a
    model that cannot be read adds its line to `bad_inputs`, one whose linting failed
    unexpectedly to `internal`. One model is linted here, its unexpected error the command's."""
    from functools import partial

    from ..lint import lint as run_lint
    from . import batch

    if len(paths) == 1:
        try:
            return [run_lint(paths[0], options)]
        except AutocastError as exc:
            bad_inputs.append(exc.line())
            return []
    # on stderr, at a terminal only: lint's stderr otherwise holds its error lines alone
    progress = batch.Progress(len(paths), enabled=batch.interactive())
    outcomes = batch.run_all(
        partial(_lint_one, options=options),
        paths,
        jobs=jobs or batch.default_jobs(),
        doing="linting",
        subjects=paths,
        done=lambda k, outcome: progress(paths[k], outcome),
    )
    progress.finish()
    for outcome in outcomes:
        if outcome.code == batch.EXIT_INPUT:
            bad_inputs.append(outcome.error)
        elif outcome.code == batch.EXIT_INTERNAL:
            internal.append(outcome.error)
    return [o.value for o in outcomes if o.value is not None]


def _lint_one(path, options):
    """One model of lint's batch: its LintResult as a batch.Outcome."""
    from ..lint import lint as run_lint
    from . import batch

    return batch.Outcome(batch.EXIT_OK, run_lint(path, options))


@cli.command("rules")
@click.argument("codes", nargs=-1, type=TEXT)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="text: one line per check (in full with CODES); markdown: the docs/rules.md page; json: every field.",
)
def rules_cmd(codes, fmt) -> None:
    """List the lint checks: code, name, severity, summary (markdown: the docs/rules.md page).

    With CODES (codes, code prefixes or names, e.g. `rules AC101` or `rules masking-constant`):
    each matching check in full - why it matters, how to fix it, an example."""
    import json as _json

    from ..lint.catalog import load_checks
    from ..lint.engine import selected
    from ..lint.report import rule_text, rules_markdown, rules_text

    def body(written):
        checks = list(load_checks())
        if codes:
            unknown = [c for c in codes if not selected_any(checks, c)]
            if unknown:
                raise AutocastError(
                    f"no check has the code or name {', '.join(repr(c) for c in unknown)}",
                    "rules",
                    "`autocast-onnx rules` lists them all",
                )
            checks = selected(checks, codes, ())
        if fmt == "markdown":
            _echo(rules_markdown(checks if codes else None), nl=False)
        elif fmt == "json":
            _echo(
                _json.dumps(
                    [
                        {
                            "code": c.code,
                            "name": c.name,
                            "severity": c.severity,
                            "summary": c.summary,
                            "why": " ".join(c.why.split()),
                            "fix": c.fix,
                            "kind": c.kind,
                        }
                        for c in checks
                    ],
                    indent=1,
                )
            )
        elif codes:
            _echo("\n\n".join(rule_text(c) for c in checks))
        else:
            _echo(rules_text())

    run_guarded(body, doing="listing the lint checks")


def _island_costs(model, plan, measured, kw, settings) -> dict:
    """The conversion `explain --islands` prices its islands on ({"plan": ..., island number: cost, "gpu": ...})."""
    from ..pipeline import convert
    from ..report.speed import island_costs
    from ..roofline import gpu

    flag = kw.get("gpu")
    chosen = gpu(
        flag if flag is not None else settings.get("gpu"), "--gpu" if flag is not None else "gpu (configuration)"
    )
    result = convert(model, calibration=measured.calibration, options=plan, check="none")
    return {"plan": result.plan, "gpu": chosen.key, "result": result, **island_costs(result, chosen.key)}


def _islands_text(plan, replayed: bool, costs: dict | None = None) -> str:
    """`explain --islands`: each fp32 island of the plan with its causes, one per line, and with
    `costs` (report/speed.island_costs) what each island's kernels and Casts are estimated to take."""
    if replayed:
        return "a plan read from a file lists no islands: explain the model without --plan"
    if not plan.islands:
        return f"no fp32 islands: every node that computes in floating point runs {plan.target} or keeps its type"
    costs = costs or {}
    priced = f", estimated on {costs['gpu']} (an estimate: docs/summary.md)" if "gpu" in costs else ""
    lines = [f"{len(plan.islands)} fp32 island(s){priced}"]
    for island in plan.islands:
        ops = ", ".join(f"{o} {n}" for o, n in island.ops.items())
        cost = costs.get(island.number)
        said = (
            f"; its kernels and Casts take {cost['us']:.1f} us ({cost['share']:.0%} of the model), "
            f"the Casts {cost['cast_us']:.1f} us"
            if cost
            else ""
        )
        lines.append(f"island {island.number}: {len(island.nodes)} nodes ({ops}){said}")
        for cause in island.causes or []:
            lines.append(f"  - [{cause.kind}] {cause.node}: {cause.text}")
        if not island.causes:
            lines.append("  - no cause of its own found (report it: every island should name one)")
    return printable_lines(lines)


@cli.command()
@click.argument("model", type=PATH)
@click.argument("node", type=TEXT, required=False)
@click.option("--op", "op_type", type=TEXT, help="Explain every node of this op type (OpType or domain:OpType).")
@plan_options_group()
@click.option(
    "--plan",
    "plan_file",
    type=PATH,
    help="Explain this plan (written by --plan-out, maybe edited; it must belong to MODEL) instead of planning: "
    "each node's reasons as the file gives them, an edited node marked.",
)
@click.option("--calibration-data", type=PATH, help="Measure tensor ranges on this data first.")
@click.option(
    "--islands",
    is_flag=True,
    help="List the plan's fp32 islands (connected fp32 regions), each with what keeps it fp32: a range the graph "
    "bounds or calibration measured, a model output, a rule, the search, or arithmetic no low-precision kernel gives; "
    "and what its kernels and Casts are estimated to take on the GPU.",
)
@click.option(
    "--gpu",
    type=TEXT,
    default=None,
    help="With --islands: the GPU of the estimate (H100, H200, A100, L4, L40S, RTX4090, RTX3060, Orin) "
    "[default: H100, or the configuration's gpu].",
)
@click.option(
    "--frontier",
    is_flag=True,
    help="With --islands: the islands from cheapest to dearest, each with the error it buys (the model run with "
    "fp16 numerics emulated on generated inputs, with and without the island low; needs ONNX Runtime).",
)
@config_option
@verbose_option
def explain(model, node, op_type, plan_file, calibration_data, islands, frontier, config, verbose, **kw) -> None:
    """Say which precision NODE of MODEL gets and why: the rules that fired (file:line) and
    measured values. NODE is a node name, #ID for the plan's node id, or a regex (when it has
    regex characters such as . * [ ^; re.search) explaining every node whose name matches;
    --op TYPE explains every node of that op type (with NODE: those that match both). With
    --plan FILE, the plan that `convert --plan FILE` would apply: a node the file edits says so."""
    import re

    from ..pipeline import plan_model
    from ..plan.model import looks_like_regex
    from ..validate.on_data import plan_on_data

    def select(plan) -> list:
        if op_type is not None and not plan.find(op=op_type):
            raise AutocastError(
                f"no node has op type {op_type!r}",
                str(model),
                "check the op type; --plan-out of convert lists the nodes",
            )
        try:
            found = plan.find(node, op_type)
        except re.error as exc:
            raise AutocastError(f"bad regex {node!r}: {exc}", str(model), "fix the pattern") from None
        if found:
            return found
        if node.startswith("#") and node[1:].isdigit():
            raise AutocastError(f"no node {node}", str(model), f"ids run from #0 to #{len(plan.nodes) - 1}")
        import difflib

        names = [e.name for e in plan.find(op=op_type) if e.name]
        close = difflib.get_close_matches(node, names, n=3, cutoff=0.5)
        raise AutocastError(
            ("no node matches" if looks_like_regex(node) else "no node named")
            + f" {node!r}"
            + (f" among the {op_type!r} nodes" if op_type else ""),
            str(model),
            ("did you mean " + ", ".join(repr(c) for c in close) + "?")
            if close
            else "use a node name, a regex or #ID; --plan-out of convert lists the nodes",
        )

    def body(written):
        if node is None and op_type is None and not islands:
            raise AutocastError(
                "say which node: give NODE (a name, regex or #ID), --op TYPE or --islands", None, "see --help"
            )
        settings, _ = _setup(config, verbose)
        plan = _plan_from(settings, kw)
        if plan_file is not None:
            if calibration_data is not None:
                raise AutocastError(
                    "--calibration-data cannot be combined with --plan: the plan already decides every node",
                    str(plan_file),
                    "drop --calibration-data, or plan afresh without --plan",
                )
            from ..pipeline import replay_model

            planned = replay_model(model, plan_file, options=plan)  # checked as convert --plan checks it
        else:
            measured = plan_on_data(model, plan, calibration_data=calibration_data)
            # only the plan is read: no rewrite
            planned = plan_model(model, calibration=measured.calibration, options=plan)
        if frontier and not (islands and plan_file is None):
            raise AutocastError("--frontier needs --islands (and no --plan)", "--frontier", "add --islands")
        if islands and node is None and op_type is None:
            costs = _island_costs(model, plan, measured, kw, settings) if plan_file is None else {}
            _echo(_islands_text(planned.plan if plan_file is not None else costs["plan"], plan_file is not None, costs))
            if frontier:
                from ..validate.frontier import frontier as islands_frontier
                from ..validate.frontier import frontier_text

                rows = islands_frontier(model, costs["result"], plan, costs["gpu"])
                _echo(frontier_text(rows, costs["gpu"]))
            return
        if kw.get("gpu") is not None:
            raise AutocastError("--gpu has no effect without --islands", "--gpu", "add --islands or drop --gpu")
        entries = select(planned.plan)
        from ..rewrite.provenance import describe, examine

        index: Any = planned.index  # a GraphIndex: the model as planned (its metadata as read)
        found, unreadable = examine(index.model)
        if found is not None:  # a converted model says how it was made (warning of what cannot be read)
            _echo(describe(model, found, unreadable))
        if len(entries) > 1:
            _echo(f"{len(entries)} nodes match")
        member = {i: island for island in planned.plan.islands for i in island.nodes} if entries else {}
        for entry in entries:
            _echo(entry.explain())
            if entry.id in member:
                _echo(printable_lines(["  " + member[entry.id].text()]))

    run_guarded(
        body, doing="explaining", subject=f"{'node ' + repr(node) if node else 'op ' + repr(op_type)} of {model}"
    )


@cli.command()
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
        from ..validate.core import precheck
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
            model_inputs=[model],
        )
        if not skip_validate:
            precheck(model, vopts)
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


def main(argv=None) -> None:
    """Entry point: usage errors (unknown option, bad choice, missing argument) become one line
    and exit code 2, like every other bad input; anything unexpected that escapes a command is
    one line and exit code 3."""
    try:
        cli.main(args=argv, prog_name="autocast-onnx", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError:  # `autocast-onnx` alone: one short line, not the whole help
        commands = ", ".join(cli.commands)
        _fail(
            f"no command given: autocast-onnx COMMAND ... (COMMAND: {commands}; see autocast-onnx --help)", EXIT_INPUT
        )
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "autocast-onnx"
        _fail(f"{' '.join(exc.format_message().split())} (see {command} --help)", EXIT_INPUT)
    except click.ClickException as exc:
        _fail(" ".join(exc.format_message().split()), EXIT_INPUT)
    except click.Abort as exc:  # an interrupt outside a command's body (click makes it Abort)
        cause = exc.__cause__
        _fail(_interruption(cause) if isinstance(cause, Terminated) else "aborted", _interrupted_code(cause))
    except Exception as exc:
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        _fail(f"internal error: {_one_line(exc)} ({BUG_HINT})", EXIT_INTERNAL)
    sys.exit(EXIT_OK)


# Under run() (the console entry): objects a command body hands to _outlive, kept until the
# process ends, so that they are not freed one by one when the body returns
_KEPT_UNTIL_EXIT: list | None = None


def _outlive(obj) -> None:
    """Keep `obj` (a conversion's result: its model, plan and index) until the process ends,
    when it runs under run(): freeing a 100k-node result when the command's body returns takes
    0.03 s of a process that is ending anyway. Under main() (tests, callers) nothing is kept."""
    if _KEPT_UNTIL_EXIT is not None:
        _KEPT_UNTIL_EXIT.append(obj)


class Terminated(KeyboardInterrupt):
    """SIGTERM, under run(): raised where the process is, as SIGINT raises KeyboardInterrupt, so
    that a supervisor's stop ends a command as Ctrl-C does (its workers stopped, its temporaries
    and the outputs it wrote removed), then one line and exit code 143 (128 + SIGTERM)."""


def _terminate_as_interrupt() -> None:
    """Under run(): SIGTERM raises Terminated (once: a second one does not cut short the
    cleanup of the first). Left alone where signals cannot be set (not the main thread)."""
    import signal

    raised: list[int] = []

    def raise_terminated(signum, frame) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated

    try:
        signal.signal(signal.SIGTERM, raise_terminated)
    except (ValueError, OSError, AttributeError):
        pass


def _interruption(exc: BaseException | None) -> str:
    """What stopped the command, in words: a SIGTERM, or an interrupt (Ctrl-C)."""
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def _interrupted_code(exc: BaseException | None) -> int:
    """The exit code of an interrupted command: 128 + the signal, as a shell reports it."""
    return 143 if isinstance(exc, Terminated) else 130


def run() -> None:
    """Console entry point (`autocast-onnx`, `python -m autocast_onnx`): main(), then, once
    stdout and stderr are flushed, an exit that skips freeing every object one by one: the
    index of a 100k-node model takes ~0.3 s to tear down, for a process that is ending anyway.
    Every output is complete and closed by then (atomic renames); tests call main()."""
    global _KEPT_UNTIL_EXIT
    _KEPT_UNTIL_EXIT = []
    _terminate_as_interrupt()
    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # sys.exit("message"): printed, as the interpreter would
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the reader went away (| head) or the stream is closed: nothing left to say
    logging.shutdown()
    os._exit(code or 0)


if __name__ == "__main__":
    run()
