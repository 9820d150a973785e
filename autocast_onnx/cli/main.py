"""The command line's registry and entry points: every command registered on the `autocast-onnx`
group (cli/app.py), in the order `autocast-onnx` with no command lists them, and main() and run(),
which turn what escapes a command into one line and an exit code (cli/guard.py). Each command
lives in its own module (cli/convert.py, validate.py, lint.py, explain.py, check.py); the option
groups they share in cli/groups.py."""

from __future__ import annotations

import logging
import os
import sys
import traceback

import click

from .app import cli
from .check import check
from .convert import convert
from .explain import explain
from .guard import (
    BUG_HINT,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_OK,
    Terminated,
    _fail,
    _interrupted_code,
    _interruption,
    _keep_until_exit,
    _one_line,
    _terminate_as_interrupt,
)
from .lint import lint, rules_cmd
from .validate import diagnose, emulate, validate

# the commands, in the order `autocast-onnx` without one names them
cli.add_command(convert)
cli.add_command(emulate)
cli.add_command(validate)
cli.add_command(diagnose)
cli.add_command(lint)
cli.add_command(rules_cmd)
cli.add_command(explain)
cli.add_command(check)


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


def run() -> None:
    """Console entry point (`autocast-onnx`, `python -m autocast_onnx`): main(), then, once
    stdout and stderr are flushed, an exit that skips freeing every object one by one: the
    index of a 100k-node model takes ~0.3 s to tear down, for a process that is ending anyway.
    Every output is complete and closed by then (atomic renames); tests call main()."""
    _keep_until_exit()
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
