"""Stage: CLI. Parses options, calls the pipeline, prints reports, maps errors to exit codes:
0 success, 2 bad input or usage (one line, no traceback), 3 internal error (a bug)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..errors import AutocastError, InternalCheckError

EXIT_OK, EXIT_INPUT, EXIT_INTERNAL = 0, 2, 3


def _fail(message: str, code: int) -> None:
    click.echo(f"autocast-onnx: error: {message}", err=True)
    sys.exit(code)


def run_guarded(fn, *args, **kwargs):
    """Run a command body; bad input becomes one line and exit 2."""
    try:
        return fn(*args, **kwargs)
    except AutocastError as exc:
        _fail(exc.line(), EXIT_INPUT)
    except InternalCheckError as exc:
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            raise
        _fail(f"internal error: {exc} (this is a bug in autocast-onnx; rerun with AUTOCAST_ONNX_DEBUG=1 "
              "for a traceback and please report it)", EXIT_INTERNAL)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was written", 130)
    except MemoryError:
        _fail("out of memory", EXIT_INPUT)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autocast-onnx")
def cli() -> None:
    """Automatic mixed precision for ONNX models, correct by default and explained node by node."""


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output model (default: MODEL.<precision>.onnx beside the input).")
@click.option("--precision", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True,
              help="Low-precision type for the nodes that can take it.")
@click.option("--rules", "rules", multiple=True, type=click.Path(path_type=Path),
              help="Extra rule file (TOML), applied over the default profile; repeatable, later wins.")
@click.option("--keep-io-types/--no-keep-io-types", default=True, show_default=True,
              help="Keep the types of the model's inputs and outputs.")
@click.option("--exclude-op", multiple=True, help="Keep every node of this op type in fp32 (repeatable).")
@click.option("--exclude-node", multiple=True, help="Keep nodes whose name matches this regex in fp32 (repeatable).")
@click.option("--include-node", multiple=True, help="Force nodes whose name matches this regex to low precision (repeatable).")
@click.option("--plan-out", type=click.Path(path_type=Path), help="Write the precision plan (JSON) here.")
@click.option("--external-data/--no-external-data", default=None,
              help="Write initializers to MODEL.onnx.data (default: when the input had external data or the model is over 2 GB).")
@click.option("--check", type=click.Choice(["full", "basic", "none"]), default="basic", show_default=True,
              help="Checks on the converted model: basic = onnx.checker; full = also ONNX shape/type inference.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
def convert(model, output, precision, rules, keep_io_types, exclude_op, exclude_node, include_node, plan_out,
            external_data, check, quiet) -> None:
    """Convert MODEL to mixed precision and print a summary."""
    from ..pipeline import convert_file, default_output_path
    from ..report import conversion_summary

    def body():
        out = output or default_output_path(model, precision)
        result = convert_file(model, out, plan_out=plan_out, external_data=external_data, precision=precision,
                              rules=list(rules), keep_io_types=keep_io_types, exclude_ops=list(exclude_op),
                              exclude_nodes=list(exclude_node), include_nodes=list(include_node),
                              check=check)
        if not quiet:
            click.echo(conversion_summary(result, model, out))
            if plan_out:
                click.echo(f"plan written to {plan_out}")

    run_guarded(body)


def main() -> None:
    cli(prog_name="autocast-onnx")


if __name__ == "__main__":
    main()
