"""Helpers for tests/contracts/test_bad_inputs.py: small models (plain, with external data, broken in
chosen ways), the argv of each command for one model, the one-line error contract, snapshots of
a folder (to prove inputs are byte-identical and nothing was written), and fault injection for
writes (ENOSPC) and file opens (to prove a file outside the model folder is never read)."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from helpers import F32, init, model, tensor
from onnx import helper

ROOT = Path(__file__).resolve().parent.parent
BERT = ROOT / "examples" / "models" / "bert_tiny.onnx"
PREFIX = "autocast-onnx: error: "

# Set AUTOCAST_BAD_INPUTS_LOG=FILE to append every call's (case, argv, exit code, stderr line) as
# JSON lines: tools can turn it into the table of docs/robustness.md ("Bad inputs").
LOG = os.environ.get("AUTOCAST_BAD_INPUTS_LOG")
CURRENT_CASE = {"id": "", "root": ""}  # set per test by an autouse fixture: logged case id, tmp root


# ---- the test's folder ------------------------------------------------------------------------
def isolated_cwd(tmp_path, monkeypatch, request):
    """Body of the autouse fixture of the bad-input test files: run from an empty folder (no
    configuration is discovered unless a test writes one), with AUTOCAST_ONNX_DEBUG unset, and
    name the case for the optional log. Use: `isolated = pytest.fixture(autouse=True)(isolated_cwd)`."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("AUTOCAST_ONNX_DEBUG", raising=False)
    CURRENT_CASE.update(id=request.node.name, root=str(tmp_path))
    yield work
    CURRENT_CASE.update(id="", root="")


# ---- models ----------------------------------------------------------------------------------
def weights(seed=0, n=64):
    return (np.random.default_rng(seed).standard_normal((n, n)) * 0.1).astype(np.float32)


def small_model(n=64) -> onnx.ModelProto:
    """x -> MatMul(fc) -> Relu(act) -> MatMul(fc2) -> y, two n x n fp32 weights."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    return model(
        nodes,
        [tensor("x", F32, [2, n])],
        [tensor("y", F32, [2, n])],
        [init("w1", weights(0, n)), init("w2", weights(1, n))],
    )


def write_model(m: onnx.ModelProto, path: Path) -> Path:
    """Write the proto as is (no checker, no external data handling)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(m.SerializeToString())
    return path


def external_model(folder: Path, name="ext.onnx", location="ext.onnx.data") -> Path:
    """small_model saved with every initializer in `folder/location`."""
    folder.mkdir(parents=True, exist_ok=True)
    stored = onnx.ModelProto()
    stored.CopyFrom(small_model())  # onnx.save moves the weights of the model it saves out
    onnx.save(stored, folder / name, save_as_external_data=True, location=location, size_threshold=0)
    return folder / name


def edit_external(path: Path, **entries) -> None:
    """Set external_data keys (location, offset, length) of every external initializer of the
    model at `path`, rewriting only the .onnx file. A value of None removes the key."""
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        kept = [(e.key, e.value) for e in t.external_data if e.key not in entries]
        kept += [(k, str(v)) for k, v in entries.items() if v is not None]
        del t.external_data[:]
        for k, v in kept:
            e = t.external_data.add()
            e.key, e.value = k, v
    path.write_bytes(m.SerializeToString())


# ---- commands ----------------------------------------------------------------------------------
def argv(command: str, model_path: Path, out: Path, *, good: Path | None = None, node="fc") -> list[str]:
    """The argv of `command` run on `model_path`, writing whatever it writes under `out`."""
    m = str(model_path)
    if command == "convert":
        return ["convert", m, "-o", str(out / "o.onnx"), "--plan-out", str(out / "plan.json")]
    if command == "lint":
        return ["lint", m, "-o", str(out / "lint.txt")]
    if command == "validate":  # the bad model as the reference (and as the converted one)
        return ["validate", m, m, "--no-speed", "--report-json", str(out / "r.json")]
    if command == "validate-converted":  # a good reference, the bad model as the converted one
        return ["validate", str(good), m, "--no-speed", "--report-json", str(out / "r.json")]
    if command == "check":
        return ["check", m, "--no-speed", "-o", str(out / "o.onnx"), "--report-json", str(out / "r.json")]
    if command == "explain":
        return ["explain", m, node]
    raise ValueError(command)


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    def lines(self):
        return [line for line in self.stderr.splitlines() if line.strip()]


def invoke(args, case: str = "") -> Outcome:
    """The CLI in-process (click's CliRunner on `cli`): fast, and monkeypatches apply."""
    from autocast_onnx.cli.main import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    exc = result.exception
    stderr = result.stderr
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback

        stderr += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    outcome = Outcome(result.exit_code, result.stdout, stderr, None if isinstance(exc, SystemExit) else exc)
    _log(case, args, outcome)
    return outcome


def run_process(args, case: str = "", cwd=None, preexec_fn=None, timeout=120) -> Outcome:
    """`python -m autocast_onnx ...` in a real process (real stderr, real exit code)."""
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        preexec_fn=preexec_fn,
        timeout=timeout,
    )
    outcome = Outcome(proc.returncode, proc.stdout, proc.stderr)
    _log(case, args, outcome)
    return outcome


def _log(case, args, outcome: Outcome) -> None:
    case = case or CURRENT_CASE["id"]
    if not LOG or not case:
        return
    root = CURRENT_CASE["root"]

    def clean(text):
        return text.replace(root + "/", "").replace(root, ".") if root else text

    lines = outcome.lines()
    with open(LOG, "a", encoding="utf-8") as fh:
        fh.write(
            json.dumps(
                {
                    "case": case,
                    "argv": [clean(str(a)) for a in args],
                    "code": outcome.code,
                    "line": clean(lines[0] if len(lines) == 1 else " | ".join(lines[-3:])),
                    "n_lines": len(lines),
                }
            )
            + "\n"
        )


def assert_one_error(outcome: Outcome, *fragments: str) -> str:
    """Exit 2, exactly one stderr line 'autocast-onnx: error: ...' with every fragment, no traceback."""
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.exception is None, repr(outcome.exception)
    assert outcome.code == 2, (outcome.code, outcome.stderr)
    lines = outcome.lines()
    assert len(lines) == 1, outcome.stderr
    line = lines[0]
    assert line.startswith(PREFIX), line
    assert len(line) > len(PREFIX) + 10, line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def assert_ok(outcome: Outcome, code: int = 0) -> None:
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.exception is None, repr(outcome.exception)
    assert outcome.code == code, (outcome.code, outcome.stderr, outcome.stdout[-2000:])


# ---- snapshots ---------------------------------------------------------------------------------
def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def snapshot(root: Path) -> dict:
    """Every entry under `root`, by os.lstat (no symlink followed): regular files by sha256,
    symlinks by target, folders by name, and FIFOs, sockets and devices by kind, never opened
    (opening a FIFO to read blocks until a writer comes). Equal snapshots mean the inputs are
    byte-identical and nothing (no output, no temporary) appeared or disappeared."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):  # symlinked folders are listed, not walked
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = _entry_state(path)
    return out


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "char device"),
    (stat.S_ISBLK, "block device"),
)


def _entry_state(path: Path) -> str:
    """What snapshot records for one entry: its kind, and a regular file's sha256."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "link -> " + os.readlink(path)
    if stat.S_ISDIR(mode):
        return "dir"
    if not stat.S_ISREG(mode):
        return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), f"special {stat.S_IFMT(mode):o}")
    try:
        return sha(path)
    except OSError as exc:  # e.g. a file without read permission
        return f"unreadable: {exc.strerror}"


# ---- fault injection -------------------------------------------------------------------------
class OpenSpy:
    """Records every path opened through open(), io.open() and os.open() while installed."""

    def __init__(self, monkeypatch):
        self.paths: list[str] = []
        real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

        def note(file):
            if isinstance(file, (str, bytes, os.PathLike)):
                try:
                    self.paths.append(os.path.realpath(os.fsdecode(file)))
                except (TypeError, ValueError):
                    pass

        def spy_open(file, *a, **kw):
            note(file)
            return real_open(file, *a, **kw)

        def spy_io_open(file, *a, **kw):
            note(file)
            return real_io_open(file, *a, **kw)

        def spy_os_open(path, *a, **kw):
            note(path)
            return real_os_open(path, *a, **kw)

        monkeypatch.setattr(builtins, "open", spy_open)
        monkeypatch.setattr(io, "open", spy_io_open)
        monkeypatch.setattr(os, "open", spy_os_open)

    def opened(self, path: Path) -> bool:
        return os.path.realpath(path) in self.paths


def enospc():
    return OSError(errno.ENOSPC, "No space left on device")


def fail_nth(monkeypatch, module, name: str, n: int):
    """Make the n-th call (1-based) of module.name raise ENOSPC; other calls go through."""
    real = getattr(module, name)
    calls = {"n": 0}

    def fake(*a, **kw):
        calls["n"] += 1
        if calls["n"] == n:
            raise enospc()
        return real(*a, **kw)

    monkeypatch.setattr(module, name, fake)
    return calls


class _FullDisk:
    """A binary file object whose writes stop after `budget` bytes with ENOSPC (the part that
    fits is written, as a real full disk does)."""

    def __init__(self, fh, budget):
        self._fh = fh
        self._budget = budget

    def write(self, data):
        if len(data) > self._budget:
            self._fh.write(bytes(data[: self._budget]))
            self._budget = 0
            raise enospc()
        self._budget -= len(data)
        return self._fh.write(data)

    def writev(self, buffers):
        """os.writev on this file's descriptor (how io.Pieces are written), within the budget."""
        written = self.write(b"".join(bytes(b) for b in buffers))
        self._fh.flush()  # the caller writes to the descriptor next
        return written

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()
        return False


def full_disk_on_write(monkeypatch, module, which, budget=100):
    """Files that `module` opens for writing whose name satisfies `which(name)` fill up after
    `budget` bytes. Patches the module's global `open` (module globals come before builtins),
    and os.writev for the descriptors of those files."""
    real_open, real_writev = builtins.open, os.writev
    full: dict[int, _FullDisk] = {}  # descriptor -> its file, while open

    def fake_open(file, mode="r", *a, **kw):
        fh = real_open(file, mode, *a, **kw)
        if "w" in mode and which(os.path.basename(os.fsdecode(file))):
            full[fh.fileno()] = _FullDisk(fh, budget)
            return full[fh.fileno()]
        return fh

    def fake_writev(fd, buffers):
        filling = full.get(fd)
        if filling is None or filling.closed:
            return real_writev(fd, buffers)
        return filling.writev(buffers)

    monkeypatch.setattr(module, "open", fake_open, raising=False)
    monkeypatch.setattr(os, "writev", fake_writev)
