"""The option groups the commands share (each owns its options; a command stacks the groups it
needs), the parameter types, and the helpers several commands use: safe echo, progress, the
configuration and plan options read once, the refusal of options that would do nothing, the
validation reports and the training-step validation."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

from ..errors import AutocastError, one_line, printable_text
from ..runtimes import RUNTIME_CHOICES
from ..validate.options import CHOICES, COUNTS, GENERATING, SEED_MAX, refuse_generating_with_inputs
from ..validate.thresholds import threshold_fields
from .guard import _FOLDER_SPELLINGS, _say


def _echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """click.echo for the commands' text: every control character but the line breaks escaped
    (printable_text), so that a name from a model or a path can neither move, clear or retitle
    the terminal nor, in a CI log, hide in a carriage return. The text reports escape each name
    where they place it (printable_lines); this is the guard behind them."""
    click.echo(printable_text(text), err=err, nl=nl)


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
# the validation counts' highest values, as ValidateOptions' fields declare them (validate/options.py)
MAX_BATCHES, MAX_ITERATIONS, MAX_WARMUP = (COUNTS[key][2] for key in ("batches", "iterations", "warmup"))
MAX_GENERATE = COUNTS["generate"][
    2
]  # tokens of greedy continuation: beyond a small model's positions ONNX Runtime says so


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
            type=click.Choice(list(RUNTIME_CHOICES)),  # runtimes.py
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
        refuse_generating_with_inputs(_given(ctx, GENERATING), "--inputs")


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
            type=click.IntRange(0, SEED_MAX),
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
                help=f"Generated batches when no --inputs [default: {COUNTS['batches'][0]}, or the configuration's].",
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
                type=click.Choice(list(CHOICES["device"])),
                default="auto",
                show_default=True,
                help="Where to run: CUDA when onnxruntime-gpu and a GPU are there (auto), or force one.",
            ),
            click.option(
                "--numerics",
                type=click.Choice(list(CHOICES["numerics"])),
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
                help=f"Timed runs per model [default: {COUNTS['iterations'][0]}, or the configuration's].",
            ),
            click.option(
                "--warmup",
                type=click.IntRange(0, MAX_WARMUP),
                default=None,
                help=f"Untimed runs first [default: {COUNTS['warmup'][0]}, or the configuration's].",
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

    def threshold(declared):
        default = "off" if declared.default is None else f"{declared.default:g}"
        text = f"{declared.metadata['help']} [{default}]."
        flag = "--" + declared.name.replace("_", "-")
        return click.option(flag, multiple=True, type=TEXT, metavar="[NAME=]X", help=text + per_output)

    return [
        *(threshold(declared) for declared in threshold_fields()),  # validate/thresholds.py declares each
        click.option(
            "--compare-padded",
            is_flag=True,
            default=False,
            help="Also compare the positions an attention-mask input marks as padding (left out by default).",
        ),
    ]


# validation options by what uses them: the comparison alone, or also the --target search's inputs
_COMPARE_ONLY = (
    *(f.name for f in threshold_fields() if f.metadata["target"]),  # the search takes these from --target
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


def _jobs_without_effect(jobs) -> None:
    """Nothing silent: -j with one model does nothing, said in a warning."""
    if jobs is not None:
        _say("warning", "-j has no effect with one model: it sets how many models are worked on at once")


def _write_or_echo(text: str, output) -> None:
    from ..io import is_stdout, write_text_atomic

    if output is None or is_stdout(output):
        click.echo(text)
    else:
        write_text_atomic(Path(output), text + "\n")


# ---- a training step's validation (validate, convert --validate) -------------------------------


def _is_training_model(path) -> bool:
    """Whether `path` (or the ModelProto read from it) is an onnxruntime-training training model
    (its validation is one step)."""
    import onnx

    from ..graph.training import recognise
    from ..io import load_model

    if isinstance(path, onnx.ModelProto):
        training = recognise(path)
        return training is not None and bool(training.accumulations)
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
