"""The `autocast-onnx` click group and its help layout: the named option groups --help lists a
command's options in (OPTION_GROUPS), the Command and Group classes that format them, and
--version. The commands are registered on the group in cli/main.py."""

from __future__ import annotations

import sys

import click

from ..validate.thresholds import THRESHOLDS
from .groups import _echo

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
            *THRESHOLDS,  # validate/thresholds.py
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
