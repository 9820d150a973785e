"""Workers that outlived their parent (issue 36, defect 3).

`convert DIR -j N` and `lint DIR -j N` fork worker processes that talk to the parent over pipes.
When the parent died (SIGKILL, the OOM killer, a supervisor's SIGTERM), its workers stayed
blocked for ever: each held a copy of the parent's end of its own pipe (and of the pipes of
the workers forked before it), so it never read the end of it, and one busy with a model never
looked. They held their memory and the command's stdout and stderr, so a CI step never ended.
A SIGTERM to the parent killed it at once, leaving the workers, their half-written temporaries
(`.OUT.autocast-tmp.*`) and the outputs the batch had written so far; a SIGINT to the parent
alone (not to its process group) had the workers killed by SIGTERM, their temporaries left.

Now a worker ends with its parent: the kernel sends it SIGTERM when the parent ends (Linux's
parent-death signal), or where it cannot, a thread of the worker notices; and its pipe reads as
closed, since it keeps no copy of the parent's ends. A SIGTERM to the parent ends the batch as
Ctrl-C does: the workers are stopped and remove their temporaries, the outputs the batch wrote
are removed, one line, exit code 143 (130 for SIGINT). The fast path's worker
(`fast/worker.py`, forked by a conversion of a large model) ends with the process that forked it.

The tests run the command line in a real process (`driver.py` below, the console entry run())
with a model's work made to wait where the test needs it (the way tests/cli/test_convert_many.py
makes workers fail: by replacing the function they call, before the workers fork), then signal
that process and poll /proc for its workers, with generous deadlines and no timing asserted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# whole-process tests: each runs a batch in a driver process of its own and stops it
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists(),
        reason="forks workers and reads /proc (Linux)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "digits_cnn.onnx"
DEADLINE = 60  # seconds any one step may take before the test gives up on it (never asserted)

# The command line, in a process of its own, with a model's work made to wait (MODE):
#   save          the save of a model named slow*: part of its temporary written, then it waits
#   lint          linting any model waits
#   after-parent  converting a model waits until the process that ran the batch is gone, then
#                 goes on (its worker then reads the end of its pipe, or waits on it for ever)
# A worker that reaches the wait writes its pid to MARKS/PID. DISABLE turns off the ways a
# worker learns that its parent ended: "pdeathsig" (the kernel's signal: the watching thread
# stands in), "all" (the signal and the thread: only the end of the pipe is left).
DRIVER = """
import os, signal, sys, time
from pathlib import Path

signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, where the shell may have ignored it

marks, mode, disable, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
from autocast_onnx import io, pipeline, lint as lint_package
from autocast_onnx.cli import batch, main

PARENT = os.getpid()


def mark():
    (marks / f"{os.getpid()}.tmp").write_text("")
    os.replace(marks / f"{os.getpid()}.tmp", marks / str(os.getpid()))


if mode == "save":
    real_write = io._write_model_file

    def slow_write(tmp, payload, verify):
        if Path(tmp).name.startswith(".slow"):
            with open(tmp, "wb") as fh:
                fh.write(bytes(payload)[:100])
            mark()
            time.sleep(600)
        return real_write(tmp, payload, verify)

    io._write_model_file = slow_write
elif mode == "lint":
    def slow_lint(path, options=None):
        mark()
        time.sleep(600)

    lint_package.lint = slow_lint
elif mode == "after-parent":
    real_convert = pipeline.convert_file

    def late(path, *rest, **kw):
        mark()
        while os.getppid() == PARENT:
            time.sleep(0.05)
        return real_convert(path, *rest, **kw)

    pipeline.convert_file = late
if disable in ("pdeathsig", "all"):
    batch.end_with_parent = lambda sig, parent: False
if disable == "all":
    batch._watch = lambda parent: None
sys.argv = ["autocast-onnx", *args]
main.run()
"""


class Batch:
    """The driver running one command line, the workers that reached their wait, and the folder
    of the models (a.onnx, slow1.onnx, slow2.onnx: copies of an example model)."""

    def __init__(self, tmp_path: Path, mode: str, args: list[str], disable: str = "none"):
        self.models = tmp_path / "models"
        self.models.mkdir()
        for name in ("a", "slow1", "slow2"):
            shutil.copy(MODEL, self.models / f"{name}.onnx")
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)
        argv = [sys.executable, str(driver), str(self.marks), mode, disable, *[str(a) for a in args]]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("AUTOCAST_ONNX_DEBUG", None)
        self.proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own, as a shell gives a command
        )
        self.workers: list[int] = []

    def wait_for_workers(self, count: int) -> list[int]:
        """The pids of `count` workers once that many wait (the test fails if they never do)."""
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            self.workers = sorted(int(p.name) for p in self.marks.iterdir() if p.name.isdigit())
            if len(self.workers) >= count:
                return self.workers
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate(timeout=DEADLINE)
        pytest.fail(f"{len(self.workers)} of {count} workers reached their wait; rc={self.proc.returncode} {err}")

    def signal(self, sig: int, group: bool = False) -> tuple[int, str, str]:
        """Send `sig` to the command's process (not its workers), or with `group` to its whole
        process group (as Ctrl-C at a terminal does); its exit code, stdout and stderr."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=DEADLINE)
        return self.proc.returncode, out, err

    def close(self) -> None:
        """Whatever the test found: no process of it is left running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pid in self.workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether `pid` runs: it has a /proc entry and is not a zombie (an ended process that no one
    has reaped yet, as an orphan may stay under a container's init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def still_running(pids: list[int]) -> list[int]:
    """The pids among `pids` that still run after up to DEADLINE seconds of polling."""
    end = time.monotonic() + DEADLINE
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = [pid for pid in left if alive(pid)]
    return left


def leftovers(folder: Path, names=("a.onnx", "slow1.onnx", "slow2.onnx")) -> list[str]:
    """What is in `folder` beside the models: outputs and temporaries (.OUT.autocast-tmp.*)."""
    return sorted(set(os.listdir(folder)) - set(names))


@pytest.fixture
def start(tmp_path):
    started: list[Batch] = []

    def make(mode: str, args: list, disable: str = "none") -> Batch:
        run = Batch(tmp_path, mode, args, disable)
        started.append(run)
        return run

    yield make
    for run in started:
        run.close()


# ---- the parent killed -------------------------------------------------------------------------


@pytest.mark.parametrize("disable", ["none", "pdeathsig"])
def test_killed_parent_takes_its_busy_workers_with_it(start, disable):
    """Both workers wait in the middle of a save, a temporary half written; the parent is
    SIGKILLed. They end (by the kernel's signal, or by their own watching thread where that is
    off), and each removes its temporary on the way out."""
    batch = start("save", ["convert", "models", "-j", "2", "-q"], disable)
    workers = batch.wait_for_workers(2)
    assert any(name.startswith(".slow") for name in os.listdir(batch.models))  # a temporary is there
    code, _, _ = batch.signal(signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert still_running(workers) == []
    # a.onnx was converted before the parent died, so its output stays; no temporary is left
    assert leftovers(batch.models) == ["a.fp16.onnx"]


def test_killed_parent_leaves_no_worker_waiting_on_its_pipe(start):
    """The kernel's signal and the watching thread both off: a worker that finishes its model
    after the parent is gone sends its result and reads its pipe again. It used to wait there
    for ever, since it held a copy of the parent's end itself (as the second worker held the
    first's); now it reads the end of the pipe and exits."""
    batch = start("after-parent", ["convert", "models/a.onnx", "models/slow1.onnx", "-j", "2", "-q"], "all")
    workers = batch.wait_for_workers(2)
    code, _, _ = batch.signal(signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert still_running(workers) == []


def test_killed_lint_parent_takes_its_workers_with_it(start):
    batch = start("lint", ["lint", "models", "-j", "2"])
    workers = batch.wait_for_workers(2)
    batch.signal(signal.SIGKILL)
    assert still_running(workers) == []


# ---- the parent stopped: SIGTERM, as Ctrl-C ----------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "code", "words"),
    [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
)
@pytest.mark.parametrize("jobs", ["2", "1"])
def test_stopped_parent_ends_the_batch_cleanly(start, sig, code, words, jobs):
    """SIGTERM (or SIGINT) to the parent alone while models are mid-save: the command ends with
    one line and 128 + the signal, no process of it is left, and nothing is left beside the
    models: no temporary, and not a.fp16.onnx either, which was written before (all or nothing,
    as on Ctrl-C). With -j 1 the conversion runs in the parent itself."""
    batch = start("save", ["convert", "models", "-j", jobs, "-q"])
    workers = batch.wait_for_workers(2 if jobs == "2" else 1)
    if jobs == "2":
        assert batch.proc.pid not in workers
    else:
        assert workers == [batch.proc.pid]
    got, out, err = batch.signal(sig)
    assert (got, err.splitlines()) == (code, [f"autocast-onnx: error: {words}; nothing was written"])
    assert "Traceback" not in err and out == ""
    assert still_running(workers) == []
    assert leftovers(batch.models) == []


@pytest.mark.parametrize(
    ("sig", "code", "words"),
    [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
)
def test_signal_to_the_whole_process_group_ends_the_batch_cleanly(start, sig, code, words):
    """Ctrl-C at a terminal, or a supervisor that signals the group: the workers get it too (a
    SIGTERM used to kill them where they stood, their temporaries left)."""
    batch = start("save", ["convert", "models", "-j", "2", "-q"])
    workers = batch.wait_for_workers(2)
    got, _, err = batch.signal(sig, group=True)
    assert (got, err.splitlines()) == (code, [f"autocast-onnx: error: {words}; nothing was written"])
    assert still_running(workers) == []
    assert leftovers(batch.models) == []


def test_sigterm_to_lint_ends_its_workers_and_writes_no_report(start, tmp_path):
    report = tmp_path / "lint.txt"
    batch = start("lint", ["lint", "models", "-j", "2", "-o", report])
    workers = batch.wait_for_workers(2)
    got, _, err = batch.signal(signal.SIGTERM)
    assert (got, err.splitlines()) == (143, ["autocast-onnx: error: terminated (SIGTERM); nothing was written"])
    assert still_running(workers) == []
    assert not report.exists() and leftovers(batch.models) == []


# ---- the fast path's worker --------------------------------------------------------------------

FAST_DRIVER = """
import sys, time
from autocast_onnx.fast import worker

worker._run = lambda *args: time.sleep(600)  # a walk that takes its time
forked = worker.fork(sys.argv[1], min_bytes=0, max_parent_bytes=2**62)
print(forked.pid if forked is not None else "none", flush=True)
time.sleep(600)
"""


def test_fast_worker_ends_with_the_process_that_forked_it(tmp_path):
    """The worker a conversion of a large model forks (fast/worker.py) walked on when the
    conversion's process was killed: it now ends with it."""
    driver = tmp_path / "fast_driver.py"
    driver.write_text(FAST_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(MODEL)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pid = None
    try:
        line = proc.stdout.readline().strip() if proc.stdout is not None else ""
        assert line.isdigit(), (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        pid = int(line)
        assert alive(pid)
        proc.kill()
        proc.communicate(timeout=DEADLINE)
        assert still_running([pid]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
