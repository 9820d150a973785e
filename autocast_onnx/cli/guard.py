"""The exit codes and the guard every command body runs under: 0 success, 1 a failed threshold
or findings, 2 bad input or usage (one line, no traceback), 3 internal error (a bug; one line, the
traceback with AUTOCAST_ONNX_DEBUG=1), 130/143 an interrupt or a SIGTERM.

Every command checks all its option values and outputs before any work, writes '-' outputs to
stdout (then its human-readable text goes to stderr), and leaves none of its outputs behind when
it ends in exit 2 or 3 after writing them (run_guarded)."""

from __future__ import annotations

import os
import sys
import traceback

import click

from ..errors import AutocastError, InternalCheckError, one_line

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
BUG_HINT = "this is a bug in autocast-onnx; rerun with AUTOCAST_ONNX_DEBUG=1 for a traceback and please report it"


def _say(kind: str, message: str) -> None:
    """Print 'autocast-onnx: KIND: MESSAGE' on stderr as exactly one line: a newline or other
    control character in the message (a name from a model, a rule file or a path) is escaped,
    so it can neither split the line nor forge another."""
    click.echo(f"autocast-onnx: {kind}: {one_line(message)}", err=True)


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


# Under run() (the console entry): objects a command body hands to _outlive, kept until the
# process ends, so that they are not freed one by one when the body returns
_KEPT_UNTIL_EXIT: list | None = None


def _outlive(obj) -> None:
    """Keep `obj` (a conversion's result: its model, plan and index) until the process ends,
    when it runs under run(): freeing a 100k-node result when the command's body returns takes
    0.03 s of a process that is ending anyway. Under main() (tests, callers) nothing is kept."""
    if _KEPT_UNTIL_EXIT is not None:
        _KEPT_UNTIL_EXIT.append(obj)


def _keep_until_exit() -> None:
    """Under run(): from now on, _outlive keeps what it is handed until the process ends."""
    global _KEPT_UNTIL_EXIT
    _KEPT_UNTIL_EXIT = []


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
