"""Stage: CLI. Many models at once, for `convert` and `lint`: the models a command line names
(files, and folders searched for .onnx files), run one by one in this process (-j 1) or by N
worker processes (-j N, default: the number of cores), each taking the next model as it
finishes one.

A model's failure is its own: bad input (exit-2 class) or an unexpected error (exit-3 class)
is caught where the model is worked on, said in one line and recorded as that model's outcome;
the other models go on. A worker process that dies without an answer (a crash in a native
library) is an unexpected error of its model. The command's exit code is the worst outcome.

A worker ends with its parent, however the parent ends (SIGKILL, the OOM killer): the kernel
sends it SIGTERM (Linux), or a thread of its own notices, and its pipe reads as closed, since no
worker keeps a copy of the parent's end. An interrupt of the parent (Ctrl-C, or SIGTERM under
the console entry, cli/main.py) stops the workers, each removing its temporaries, and the
command removes what the batch wrote: nothing is left half-written, nor left running.

`convert` on several models writes each beside its input (MODEL.<precision>.onnx) or under
`-o DIR` (the same name there), refuses up front two models that would write the same file, and
prints one table at the end (`convert_table`); each model's files are written atomically by the
pipeline, and the files of a model that fails after its save (a check of the written files) are
removed, as `convert` on one model removes them."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from ..errors import AutocastError, one_line, printable_lines
from ..filesys import end_with_parent

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
BUG_HINT = "this is a bug in autocast-onnx; rerun with AUTOCAST_ONNX_DEBUG=1 for a traceback and please report it"
STATUS = {EXIT_OK: "ok", EXIT_FAIL: "failed", EXIT_INPUT: "error", EXIT_INTERNAL: "internal error"}
CONVERTED_SUFFIXES = (".fp16.onnx", ".bf16.onnx")  # the default output names of convert


def default_jobs() -> int:
    """-j's default: the number of cores."""
    return os.cpu_count() or 1


@dataclass
class Outcome:
    """What working on one model gave: an exit-code class (0 ok, 1 a failed threshold, 2 bad
    input, 3 unexpected), the work's value (None on an error) and the error line (None when none)."""

    code: int
    value: Any = None
    error: str | None = None

    @property
    def status(self) -> str:
        return STATUS[self.code]


def internal_line(exc: BaseException, doing: str, subject) -> str:
    """The one line of an unexpected error while `doing` `subject` (as run_guarded words it)."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    kind = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"internal error while {doing} {subject}: {kind} ({BUG_HINT})"


def attempt(work: Callable[[Any], Outcome], item, doing: str, subject) -> Outcome:
    """`work(item)`, with bad input and unexpected errors made the model's outcome."""
    try:
        return work(item)
    except AutocastError as exc:
        return Outcome(EXIT_INPUT, error=exc.line())
    except MemoryError:
        return Outcome(
            EXIT_INPUT, error=f"out of memory while {doing} {subject}: the model is too large for this machine"
        )
    except Exception as exc:
        if os.environ.get("AUTOCAST_ONNX_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        return Outcome(EXIT_INTERNAL, error=internal_line(exc, doing, subject))


def run_all(
    work: Callable[[Any], Outcome],
    items: Sequence,
    *,
    jobs: int,
    doing: str,
    subjects: Sequence,
    done: Callable[[int, Outcome], None] | None = None,
) -> list[Outcome]:
    """Each item's Outcome, in the order of `items`: in this process with jobs=1 (or one item),
    else in up to `jobs` worker processes at once. `done(k, outcome)` is called as each finishes
    (in the order they finish)."""
    if jobs <= 1 or len(items) <= 1:
        outcomes = []
        for k, item in enumerate(items):
            outcomes.append(attempt(work, item, doing, subjects[k]))
            if done is not None:
                done(k, outcomes[-1])
        return outcomes
    return _in_processes(work, items, jobs, doing, subjects, done)


def _worker(conn, inherited: list, parent: int, work, items, doing: str, subjects) -> None:
    """A worker process: for each item index the parent sends, that item's outcome, until the
    parent sends None, its pipe closes, or it is stopped (SIGINT or SIGTERM: the work's
    `finally` blocks remove its temporaries). It ends with its parent (_as_child)."""
    try:
        _as_child(parent, inherited)
        while (k := conn.recv()) is not None:
            conn.send(attempt(work, items[k], doing, subjects[k]))
    except (KeyboardInterrupt, EOFError, OSError):  # stopped, or the parent is gone: it says why
        pass
    finally:
        conn.close()


def _as_child(parent: int, inherited: list) -> None:
    """A worker's first steps: SIGINT and SIGTERM become the interrupt (once: a second one does
    not cut short the cleanup of the first); the parent's ends of the pipes, which the fork
    copied, are closed, so that its own pipe reads as closed once the parent is gone; the kernel
    is asked to send SIGTERM when the parent ends (filesys.end_with_parent), or where it cannot
    be, a thread watches for the parent's end; then the signals the parent held back around the
    fork are let through."""
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _interrupt_once)
    for conn in inherited:
        conn.close()
    if not end_with_parent(signal.SIGTERM, parent):
        _watch(parent)
    _release(_HELD)


def _interrupt_once(signum, frame) -> None:
    """A worker's SIGINT and SIGTERM: the first raises KeyboardInterrupt, later ones are let be."""
    if not _STOPPING:
        _STOPPING.append(signum)
        raise KeyboardInterrupt


_STOPPING: list[int] = []  # in a worker: the signal that stopped it, once one has
_HELD = frozenset({signal.SIGINT, signal.SIGTERM})


def _watch(parent: int) -> None:
    """Where the kernel cannot tell a worker that its parent ended: a thread that looks twice a
    second, and stops the worker (SIGTERM, as the kernel would send) once the parent is gone."""

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=run, name="autocast-onnx-parent-watch", daemon=True).start()


@contextmanager
def _held(signals=_HELD) -> Iterator[None]:
    """SIGINT and SIGTERM held back while inside (delivered on leaving, where the platform can
    hold them): around a fork, so a worker never takes one before it can act on it, and while
    the workers are stopped, so that stopping them is not cut short."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    before = block(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, before)


def _release(signals) -> None:
    """Let `signals` through again (in a worker: those held back around its fork)."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is not None:
        block(signal.SIG_UNBLOCK, signals)


def _context():
    """fork where there is one (the worker starts with the parent's imports), else the default."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


@dataclass
class _Worker:
    """A worker process, its end of the pipe, and the item it works on (None: idle)."""

    process: Any
    conn: Any
    item: int | None = None


def _in_processes(work, items, jobs, doing, subjects, done) -> list[Outcome]:
    """run_all's worker processes: up to `jobs`, each taking the next item as it finishes one,
    so a worker pays its start once, not per model. A worker that dies without an answer is
    replaced; its item is an unexpected error. On an interrupt (or any other exception here)
    the workers are stopped (_stop) before it goes on to the caller."""
    ctx = _context()
    # the objects this process holds go to a generation the collector leaves alone: a forked
    # worker's collections then do not touch (and so copy) every page it shares with this one
    gc.freeze()
    outcomes: list[Outcome | None] = [None] * len(items)
    pending = list(range(len(items)))
    workers: list[_Worker] = []

    def start() -> _Worker:
        mine, theirs = ctx.Pipe()
        # a forked worker holds copies of this process's ends of every pipe: it closes them
        inherited = [mine, *(w.conn for w in workers)] if ctx.get_start_method() == "fork" else []
        process = ctx.Process(target=_worker, args=(theirs, inherited, os.getpid(), work, items, doing, subjects))
        with _held():
            process.start()
        theirs.close()
        return _Worker(process, mine)

    def give(worker: _Worker) -> None:
        worker.item = pending.pop(0) if pending else None
        worker.conn.send(worker.item)

    try:
        for _ in range(min(jobs, len(items))):
            workers.append(start())
            give(workers[-1])
        while any(w.item is not None for w in workers):
            busy = {w.conn: w for w in workers if w.item is not None}
            for conn in wait(list(busy)):
                worker = busy[conn]
                k = worker.item if worker.item is not None else -1
                outcomes[k] = outcome = _received(worker, doing, subjects[k])
                if done is not None:
                    done(k, outcome)
                if worker.conn.closed:  # it died: a new one takes the next item
                    worker.item = None
                    if not pending:
                        continue
                    workers[workers.index(worker)] = worker = start()
                give(worker)
    except BaseException:
        _stop(workers)
        raise
    finally:
        gc.unfreeze()
    for worker in workers:
        worker.process.join()
        worker.conn.close()
    return [o for o in outcomes if o is not None]


def _received(worker: _Worker, doing: str, subject) -> Outcome:
    """The outcome a worker sent, or, when it died first, an unexpected error naming how (its
    connection then closed)."""
    try:
        outcome = worker.conn.recv()
    except (EOFError, OSError):
        outcome = None
    if isinstance(outcome, Outcome):
        return outcome
    worker.conn.close()
    worker.process.join()
    code = worker.process.exitcode
    how = f"signal {-code}" if (code or 0) < 0 else f"exit code {code}"
    return Outcome(
        EXIT_INTERNAL,
        error=f"internal error while {doing} {subject}: its worker process ended ({how}) without a result ({BUG_HINT})",
    )


STOP_SECONDS = 10  # how long stopped workers have to remove their temporaries before SIGKILL


def _stop(workers: list) -> None:
    """Stop the workers, SIGINT and SIGTERM held back meanwhile: SIGTERM to each (an interrupt in
    a worker, which removes its temporaries; one already interrupted by Ctrl-C lets it be), up
    to STOP_SECONDS to end, then SIGKILL."""
    with _held():
        for worker in workers:
            if worker.process.is_alive():
                worker.process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()


def worst(outcomes: Sequence[Outcome]) -> int:
    """The command's exit code: the worst outcome (3 over 2 over 1 over 0)."""
    return max((o.code for o in outcomes), default=EXIT_OK)


# ---- the models a command line names -------------------------------------------------------


@dataclass
class Expanded:
    """The model files of a command line: `paths`, each with the folder it was found in (None:
    given as a file), the errors of arguments that give none, and what a folder held that
    is not taken (convert: files named like its own outputs)."""

    paths: list[Path] = field(default_factory=list)
    roots: list[Path | None] = field(default_factory=list)
    errors: list[AutocastError] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)


def expand_models(models, skip_converted: bool = False) -> Expanded:
    """Files as given, folders searched for *.onnx (sorted). With `skip_converted` (convert), a
    folder's files named like convert's outputs (NAME.fp16.onnx, NAME.bf16.onnx) are skipped and
    listed in `skipped`, so converting a folder twice does not convert the first run's outputs."""
    found = Expanded()
    for m in models:
        p = Path(m)
        if not p.is_dir():
            found.paths.append(p)
            found.roots.append(None)
            continue
        files = all_files = sorted(f for f in p.rglob("*.onnx") if f.is_file())
        if skip_converted:
            found.skipped.extend(f for f in files if f.name.endswith(CONVERTED_SUFFIXES))
            files = [f for f in files if not f.name.endswith(CONVERTED_SUFFIXES)]
        if not files:
            found.errors.append(
                AutocastError(
                    "is a directory holding no .onnx file" + (" but converted ones" if files != all_files else ""),
                    str(p),
                    "pass model files or a folder of them",
                )
            )
        found.paths.extend(files)
        found.roots.extend([p] * len(files))
    return found


def output_paths(expanded: Expanded, output: Path | None, precision: str) -> list[Path]:
    """Where convert writes each model of a batch: beside it as MODEL.<precision>.onnx, or under
    `output` (a folder) with that name, a model found in a folder at its place below that folder.
    Refuses an `output` that is not a folder and two models that would write one file."""
    from ..pipeline import default_output_path

    if output is not None and (output.exists() or output.is_symlink()) and not output.is_dir():
        raise AutocastError(
            "with several models, -o must be a folder, and this is a file",
            str(output),
            "give a folder (created if missing), or convert one model to write it to a file",
        )
    if output is not None and not output.exists() and output.suffix == ".onnx":
        raise AutocastError(
            "with several models, -o must be a folder, and this names a model file",
            str(output),
            "give a folder (created if missing), or convert one model to write it to a file",
        )
    outs = []
    for path, root in zip(expanded.paths, expanded.roots, strict=True):
        name = default_output_path(path, precision)
        if output is None:
            outs.append(name)
        else:
            below = path.parent.relative_to(root) if root is not None else Path()
            outs.append(output / below / name.name)
    seen: dict[Path, Path] = {}
    for path, out in zip(expanded.paths, outs, strict=True):
        key = Path(os.path.abspath(out))
        if key in seen:
            raise AutocastError(
                f"{seen[key]} and {path} would both be written to {out}",
                str(out),
                "convert them separately with their own -o, or into folders of their own",
            )
        seen[key] = path
    return outs


def make_folders(outs: Sequence[Path], output: Path) -> list[Path]:
    """Create the -o folder (its parent must exist) and the folders below it the outputs need;
    returns those created, deepest first (remove_folders takes them away again)."""
    if not output.parent.is_dir():
        raise AutocastError(
            "the folder for -o cannot be created: its parent folder does not exist",
            str(output),
            "create the parent folder first, or choose another -o",
        )
    created: list[Path] = []
    try:
        for folder in sorted({out.parent for out in outs}):
            missing = [p for p in [folder, *folder.parents] if not p.exists()]
            for p in reversed(missing):
                p.mkdir()
                created.insert(0, p)
    except OSError as exc:
        remove_folders(created)
        raise AutocastError(
            f"cannot create the output folder: {exc.strerror or exc}", str(output), "choose another -o"
        ) from None
    return created


def remove_folders(folders: Sequence[Path]) -> None:
    """Remove the folders make_folders created, those still empty (deepest first)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


# ---- convert on many models ------------------------------------------------------------------


@dataclass(frozen=True)
class ConvertJob:
    """One model of a batch conversion, with everything the worker needs (picklable)."""

    model: Path
    output: Path
    options: Any  # PlanOptions
    check: str
    external_data: bool | None
    loss_scale: str | None
    validation: Any = None  # ValidateOptions with --validate, else None
    verbose: bool = False


@dataclass
class ConvertRow:
    """One line of the batch table."""

    model: str
    output: str
    nodes: int = 0
    low: int = 0
    fp32: int = 0
    casts: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    notes: int = 0  # plan warnings the single-model summary would list
    failure: str | None = None  # the first failed threshold of --validate
    summary: str | None = None  # the single-model summary, with -v


def convert_one(job: ConvertJob) -> Outcome:
    """Convert one model of a batch (and validate it with --validate): its row of the table.
    A conversion that fails after writing removes what it wrote; a validation that cannot run
    keeps the converted model, as convert on one model does."""
    from ..io import OutputSnapshot
    from ..pipeline import convert_file

    start = time.perf_counter()
    written = OutputSnapshot([job.output, job.output.with_name(job.output.name + ".data")])
    if job.validation is not None:
        from ..validate.core import precheck

        precheck(job.model, job.validation)
    try:
        result = convert_file(
            job.model,
            job.output,
            external_data=job.external_data,
            check=job.check,
            loss_scale=job.loss_scale,
            options=job.options,
        )
    except BaseException:
        written.discard()
        raise
    row = _row(job, result)
    code = EXIT_OK
    if job.validation is not None:
        code, row.failure = _validated(job)
    row.seconds = time.perf_counter() - start
    return Outcome(code, row)


def _row(job: ConvertJob, result) -> ConvertRow:
    """The table's line for a converted model (and its single-model summary with -v)."""
    from ..report.summary import conversion_summary, summary_dict

    s = summary_dict(result)
    counts = s["precision"]
    low = sum(n for p, n in counts.items() if p in ("fp16", "bf16"))
    row = ConvertRow(str(job.model), str(job.output), nodes=s["nodes"], low=low, fp32=counts.get("fp32", 0))
    row.casts = s["casts_added"]
    row.bytes_before = _file_bytes([job.model, *(_data_files(job.model) if result.external_tensors > 0 else [])])
    row.bytes_after = _file_bytes(result.output_files or [job.output])
    row.notes = len(result.plan.warnings)
    if job.verbose:
        row.summary = conversion_summary(result, job.model, job.output, verbose=True)
    return row


def _data_files(model: Path) -> list[Path]:
    """The external-data files a model file names: its graph read again without the weights
    (only for a model with external data, whose weights are elsewhere: a small read)."""
    try:
        from ..io import load_model

        return [model.parent / f for f in load_model(model, load_external=False).external_files]
    except AutocastError:
        return []


def _file_bytes(paths) -> int:
    total = 0
    for path in paths:
        try:
            total += Path(path).stat().st_size
        except OSError:
            pass
    return total


def _validated(job: ConvertJob) -> tuple[int, str | None]:
    """--validate of one converted model: (0 or 1, the first failed threshold). Validation that
    cannot run is bad input that keeps the converted model."""
    from ..validate.core import validate as run_validation

    try:
        report = run_validation(job.model, job.output, job.validation)
    except AutocastError as exc:
        command = f"autocast-onnx validate {job.model} {job.output}"
        raise AutocastError(
            f"{exc.what}; the converted model was written to {job.output} but not validated",
            exc.where,
            f"{exc.hint}; then validate it with `{command}`" if exc.hint else f"validate it with `{command}`",
        ) from None
    if report["passed"]:
        return EXIT_OK, None
    failures = [f"{o['name']}: {f}" for o in report.get("outputs", []) for f in o.get("failures", [])]
    return EXIT_FAIL, failures[0] if failures else "a threshold failed"


def _size(n: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def convert_table(jobs: Sequence[ConvertJob], outcomes: Sequence[Outcome], seconds: float) -> str:
    """The table `convert` prints for several models: model, nodes low/fp32, casts added, size
    before -> after, time, status; then a line of totals, and the notes that the single-model
    summary would give (a failed threshold; plan warnings counted)."""
    header = ("model", "nodes low/fp32", "casts", "size before -> after", "time", "status")
    rows = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        row = outcome.value
        if row is None:
            rows.append((one_line(str(job.model)), "-", "-", "-", "-", outcome.status))
            continue
        status = outcome.status + (f" ({row.notes} note{'s' if row.notes != 1 else ''})" if row.notes else "")
        rows.append(
            (
                one_line(row.model),
                f"{row.low}/{row.fp32}",
                str(row.casts),
                f"{_size(row.bytes_before)} -> {_size(row.bytes_after)}",
                f"{row.seconds:.2f} s",
                status,
            )
        )
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    right = {1, 2, 3, 4}
    lines = [
        "  ".join(cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in [header, *rows]
    ]
    counted = {status: sum(o.status == status for o in outcomes) for status in STATUS.values()}
    tally = ", ".join(f"{n} {status}" for status, n in counted.items() if n)
    lines.append(f"{len(outcomes)} model(s) in {seconds:.2f} s: {tally}")
    for outcome in outcomes:
        row = outcome.value
        if row is not None and row.failure:
            lines.append(f"{row.model}: validation failed: {row.failure}")
    if any(o.value is not None and o.value.notes for o in outcomes):
        lines.append("notes: convert a model on its own (or add -v) to read its plan's notes")
    return printable_lines(lines)


def interactive() -> bool:
    """Whether stderr is a terminal (where lint shows its progress)."""
    return sys.stderr.isatty()


class Progress:
    """'[k/N] MODEL STATUS' on stderr as each model finishes: one line per model, or on a
    terminal one line rewritten in place (cleared by `finish`)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.count, self.enabled = total, 0, enabled
        self.tty = enabled and sys.stderr.isatty()

    def __call__(self, subject, outcome: Outcome) -> None:
        self.count += 1
        if not self.enabled:
            return
        line = one_line(f"[{self.count}/{self.total}] {subject} {outcome.status}")
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty and self.count:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
