"""Outputs of every command: two outputs naming one file, special files (FIFOs, devices, '-' for
stdout), crashes that must not read as accuracy failures, and all-or-nothing outputs.

Tests run as root, where a bug that replaces a device with a regular file would really replace
it: no test hands a real /dev path to code that writes. FIFOs are made in tmp_path (and read
from a thread); /dev/null is only given to the functions that decide how to write (they do not
write).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import F32, init, model, tensor
from onnx import helper

import autocast_onnx.io as aio
from autocast_onnx.errors import AutocastError

PREFIX = "autocast-onnx: error: "


# ---- running the CLI -------------------------------------------------------------------------
@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    def lines(self):
        return [line for line in self.stderr.splitlines() if line.strip()]


def run(*args, env=None) -> Outcome:
    """The real entry point (main(): usage errors are one line too) in-process, stdout and
    stderr captured apart."""
    from autocast_onnx.cli.main import main

    with CliRunner().isolation(env=env) as (out, err, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return Outcome(code, stdout, stderr)


def one_error(outcome: Outcome, code: int = 2, *fragments: str) -> str:
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.code == code, (outcome.code, outcome.stderr, outcome.stdout[-2000:])
    lines = outcome.lines()
    assert len(lines) == 1, outcome.stderr
    assert lines[0].startswith(PREFIX), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def listing(folder: Path) -> dict:
    """name -> (kind, bytes) of everything under `folder`."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            out[str(path.relative_to(folder))] = ("file", path.read_bytes())
        else:
            out[str(path.relative_to(folder))] = (
                stat.filemode(st.st_mode)[0],
                os.readlink(path) if path.is_symlink() else None,
            )
    return out


# ---- models and data -------------------------------------------------------------------------
def tiny_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax"),
    ]
    return model(
        nodes,
        [tensor("x", F32, ["batch", 8])],
        [tensor("y", F32, ["batch", 8])],
        [init("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Run from an empty folder (no configuration found, and a stray file named '-' would show)."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("AUTOCAST_ONNX_DEBUG", raising=False)
    return work


@pytest.fixture
def m(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(tiny_model(), path)
    return path


@pytest.fixture
def out(tmp_path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


# ---- FIFOs -----------------------------------------------------------------------------------
class FifoReader:
    """A FIFO in a folder, read to the end by a thread (so a writer never blocks)."""

    def __init__(self, path: Path):
        self.path = path
        os.mkfifo(path)
        self.data = b""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        with open(self.path, "rb") as fh:
            self.data = fh.read()

    def close(self, timeout=20) -> bytes:
        self._thread.join(timeout=0.2)
        if self._thread.is_alive():
            # nothing opened it for writing: open and close it once so the reader sees the end
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
            self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), "the FIFO reader never finished"
        return self.data


def assert_fifo(path: Path) -> None:
    assert stat.S_ISFIFO(os.lstat(path).st_mode), f"{path} is no longer a FIFO"


# =============================================================================================
# 1. Two outputs, one file
# =============================================================================================
# name -> argv builder (model, out folder); every case names one file twice
SAME_FILE = {
    "convert -o = --plan-out": lambda m, o: ["convert", m, "-o", o / "x.onnx", "--plan-out", o / "x.onnx"],
    "convert --plan-out = data file of -o": lambda m, o: [
        "convert",
        m,
        "-o",
        o / "x.onnx",
        "--plan-out",
        o / "x.onnx.data",
    ],
    "convert --report-json = -o": lambda m, o: [
        "convert",
        m,
        "-o",
        o / "x.onnx",
        "--validate",
        "--no-speed",
        "--report-json",
        o / "x.onnx",
    ],
    "convert --report-json = --plan-out": lambda m, o: [
        "convert",
        m,
        "-o",
        o / "x.onnx",
        "--plan-out",
        o / "r",
        "--validate",
        "--no-speed",
        "--report-json",
        o / "r",
    ],
    "convert default -o = --plan-out": lambda m, o: ["convert", m, "--plan-out", m.with_name("m.fp16.onnx")],
    "validate --report-json = --report-html": lambda m, o: [
        "validate",
        m,
        m,
        "--no-speed",
        "--report-json",
        o / "r",
        "--report-html",
        o / "r",
    ],
    "validate by another spelling": lambda m, o: [
        "validate",
        m,
        m,
        "--no-speed",
        "--report-json",
        o / "r",
        "--report-html",
        o / "sub" / ".." / "r",
    ],
    "check -o = --sarif": lambda m, o: ["check", m, "--no-speed", "-o", o / "x.onnx", "--sarif", o / "x.onnx"],
    "check --sarif = data file of -o": lambda m, o: [
        "check",
        m,
        "--no-speed",
        "-o",
        o / "x.onnx",
        "--sarif",
        o / "x.onnx.data",
    ],
    "check --report-json = --sarif": lambda m, o: [
        "check",
        m,
        "--no-speed",
        "--report-json",
        o / "r",
        "--sarif",
        o / "r",
    ],
    "check --report-json = --report-html": lambda m, o: [
        "check",
        m,
        "--no-speed",
        "--report-json",
        o / "r",
        "--report-html",
        o / "r",
    ],
}


@pytest.mark.parametrize("case", sorted(SAME_FILE))
def test_two_outputs_naming_one_file_are_refused(tmp_path, m, out, case):
    (out / "sub").mkdir()
    before = listing(tmp_path)
    outcome = run(*SAME_FILE[case](m, out))
    one_error(outcome, 2, "give each output its own path")
    assert outcome.stdout == ""
    assert listing(tmp_path) == before


@pytest.mark.parametrize("command", ["convert", "validate", "check"])
@pytest.mark.parametrize("link", ["symlink", "dangling symlink", "hard link"])
def test_two_outputs_that_are_one_file_through_a_link(tmp_path, m, out, command, link):
    """A symlink (to an existing or a not yet existing file) or a hard link is the same file."""
    target = out / "report.txt"
    alias = out / "alias.txt"
    if link == "hard link":
        target.write_text("old\n")
        os.link(target, alias)
    else:
        if link == "symlink":
            target.write_text("old\n")
        alias.symlink_to(target.name)
    args = {
        "convert": [
            "convert",
            m,
            "-o",
            out / "x.onnx",
            "--plan-out",
            target,
            "--validate",
            "--no-speed",
            "--report-json",
            alias,
        ],
        "validate": ["validate", m, m, "--no-speed", "--report-json", target, "--report-html", alias],
        "check": ["check", m, "--no-speed", "--sarif", target, "--report-json", alias],
    }[command]
    before = listing(tmp_path)
    one_error(run(*args), 2, "same file")
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "{m}", "{m}", "--no-speed", "--report-json", "-", "--report-html", "-"],
        ["convert", "{m}", "-o", "{out}/x.onnx", "--plan-out", "-", "--validate", "--no-speed", "--report-json", "-"],
        ["check", "{m}", "--no-speed", "--sarif", "-", "--report-json", "-"],
    ],
    ids=["validate", "convert", "check"],
)
def test_two_outputs_on_stdout_are_refused(tmp_path, m, out, args):
    before = listing(tmp_path)
    outcome = run(*[a.format(m=m, out=out) for a in args])
    one_error(outcome, 2, "stdout")
    assert outcome.stdout == ""
    assert listing(tmp_path) == before


def test_output_that_is_the_input_by_a_hard_link(tmp_path, m, out):
    hard = out / "hard.onnx"
    os.link(m, hard)
    before = listing(tmp_path)
    one_error(run("convert", m, "-o", out / "x.onnx", "--plan-out", hard), 2, "input")
    one_error(run("lint", m, "-o", hard), 2, "input")
    assert listing(tmp_path) == before


def test_inputs_folder_files_are_protected(tmp_path, m, out):
    """A report into the --inputs folder must not replace one of its batches."""
    batches = out / "batches"
    batches.mkdir()
    np.savez(batches / "b0.npz", x=np.ones((2, 8), np.float32))
    before = listing(tmp_path)
    one_error(run("validate", m, m, "--no-speed", "--inputs", batches, "--report-json", batches / "b0.npz"), 2, "input")
    assert listing(tmp_path) == before


def test_check_outputs_directly():
    """The one function every command calls, on paths that need not exist."""
    aio.check_outputs(
        [("-o", "a.onnx"), ("--plan-out", "b.json"), ("--report-json", None), ("--sarif", "-")], models=["-o"]
    )
    with pytest.raises(AutocastError, match="--plan-out names the external data file of -o"):
        aio.check_outputs([("-o", "a.onnx"), ("--plan-out", "a.onnx.data")], models=["-o"])
    with pytest.raises(AutocastError, match="-o and --plan-out name the same file"):
        aio.check_outputs([("-o", "a.onnx"), ("--plan-out", "./a.onnx")])
    with pytest.raises(AutocastError, match="both write to stdout"):
        aio.check_outputs([("--report-json", "-"), ("--sarif", "-")])
    with pytest.raises(AutocastError, match="cannot write the model to stdout"):
        aio.check_outputs([("-o", "-")], models=["-o"])
    # several outputs may go to the null device (nothing is written here: this only checks)
    aio.check_outputs([("-o", os.devnull), ("--plan-out", os.devnull)], models=["-o"])
    with pytest.raises(AutocastError, match="regular file"):
        aio.check_outputs([("-o", os.devnull)], models=["-o"], read_back=["-o"])


# =============================================================================================
# 2. Special files
# =============================================================================================
def test_how_outputs_are_written():
    """The decision function: devices and FIFOs are written in place, never replaced."""
    assert aio.stat_output_kind(os.stat(os.devnull)) == "stream"
    assert aio.output_kind(os.devnull) == "stream"
    assert aio.output_kind("-") == "stdout"
    fake = [0] * 10
    for mode, word in (
        (stat.S_IFBLK | 0o600, "block device"),
        (stat.S_IFSOCK | 0o600, "socket"),
        (stat.S_IFDIR | 0o700, "directory"),
    ):
        fake[0] = mode
        with pytest.raises(AutocastError, match=word):
            aio.stat_output_kind(os.stat_result(fake), "x")
    fake[0] = stat.S_IFREG | 0o644
    assert aio.stat_output_kind(os.stat_result(fake)) == "file"
    fake[0] = stat.S_IFIFO | 0o644
    assert aio.stat_output_kind(os.stat_result(fake)) == "stream"


def test_write_text_to_a_fifo_keeps_the_fifo(out):
    tmp_path = out
    reader = FifoReader(tmp_path / "pipe")
    aio.write_text_atomic(tmp_path / "pipe", "hello\n")
    assert reader.close() == b"hello\n"
    assert_fifo(tmp_path / "pipe")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary left


def test_write_text_to_stdout(capsys, tmp_path):
    aio.write_text_atomic(Path("-"), "report\n")
    assert capsys.readouterr().out == "report\n"
    assert not Path("-").exists()


@pytest.mark.parametrize(
    "case",
    [
        "validate --report-json",
        "validate --report-html",
        "lint -o",
        "check --sarif",
        "convert --plan-out",
        "convert -o",
    ],
)
def test_outputs_into_a_fifo(tmp_path, m, out, case):
    pipe = out / "pipe"
    reader = FifoReader(pipe)
    args = {
        "validate --report-json": ["validate", m, m, "--no-speed", "--report-json", pipe],
        "validate --report-html": ["validate", m, m, "--no-speed", "--report-html", pipe],
        "lint -o": ["lint", m, "--format", "json", "-o", pipe],
        "check --sarif": ["check", m, "--no-speed", "--sarif", pipe],
        "convert --plan-out": ["convert", m, "-o", out / "x.onnx", "--plan-out", pipe],
        "convert -o": ["convert", m, "-o", pipe],
    }[case]
    outcome = run(*args)
    data = reader.close()
    assert outcome.code in (0, 1) and "Traceback" not in outcome.stderr, outcome.stderr
    assert_fifo(pipe)
    if case == "convert -o":
        converted = onnx.ModelProto.FromString(data)
        onnx.checker.check_model(converted)
        assert not list(out.glob(".*"))  # no temporary beside it
    elif "html" in case:
        assert data.decode().lstrip().lower().startswith("<!doctype html")
    else:
        json.loads(data)


@pytest.mark.parametrize("case", ["check -o", "convert --validate -o", "convert -o external data"])
def test_fifo_refused_where_it_cannot_work(tmp_path, m, out, case):
    """check and convert --validate read the model back; external data cannot go beside a FIFO."""
    pipe = out / "pipe"
    reader = FifoReader(pipe)
    if case == "check -o":
        args, fragment = ["check", m, "--no-speed", "-o", pipe], "regular file"
    elif case == "convert --validate -o":
        args, fragment = ["convert", m, "-o", pipe, "--validate", "--no-speed"], "regular file"
    else:
        args, fragment = ["convert", m, "-o", pipe, "--external-data"], "external data"
    one_error(run(*args), 2, fragment)
    assert reader.close() == b""
    assert_fifo(pipe)
    assert sorted(p.name for p in out.iterdir()) == ["pipe"]


def test_socket_output_is_refused(tmp_path, m):
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(sock_path))
        one_error(run("validate", m, m, "--no-speed", "--report-json", sock_path), 2, "socket")
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    finally:
        sock.close()


def report_checks():
    def plan(text):
        assert json.loads(text)["target"] == "fp16"

    def validation(text):
        assert json.loads(text)["passed"] is True

    def html(text):
        assert text.lstrip().lower().startswith("<!doctype html")

    def check_report(text):
        assert "gate" in json.loads(text)

    def sarif(text):
        assert json.loads(text)["version"] == "2.1.0"

    def lint(text):
        json.loads(text)

    return {
        "convert --plan-out": (["convert", "{m}", "-o", "{out}/x.onnx", "--plan-out", "-"], plan, "converted to fp16"),
        "convert --report-json": (
            ["convert", "{m}", "-o", "{out}/x.onnx", "--validate", "--no-speed", "--report-json", "-"],
            validation,
            "result: PASS",
        ),
        "convert --report-html": (
            ["convert", "{m}", "-o", "{out}/x.onnx", "--validate", "--no-speed", "--report-html", "-"],
            html,
            "result: PASS",
        ),
        "validate --report-json": (
            ["validate", "{m}", "{m}", "--no-speed", "--report-json", "-"],
            validation,
            "result: PASS",
        ),
        "validate --report-html": (
            ["validate", "{m}", "{m}", "--no-speed", "--report-html", "-"],
            html,
            "result: PASS",
        ),
        "check --report-json": (["check", "{m}", "--no-speed", "--report-json", "-"], check_report, "result: PASS"),
        "check --report-html": (["check", "{m}", "--no-speed", "--report-html", "-"], html, "result: PASS"),
        "check --sarif": (["check", "{m}", "--no-speed", "--sarif", "-"], sarif, "result: PASS"),
        "lint -o": (["lint", "{m}", "--format", "json", "-o", "-"], lint, None),
    }


REPORTS = report_checks()


@pytest.mark.parametrize("case", sorted(REPORTS))
def test_dash_is_stdout_for_every_report(tmp_path, isolated, m, out, case):
    """stdout holds exactly the report; the human summary goes to stderr; no file named '-'."""
    args, parse, summary = REPORTS[case]
    outcome = run(*[a.format(m=m, out=out) for a in args])
    assert outcome.code in (0, 1) and "Traceback" not in outcome.stderr, outcome.stderr
    parse(outcome.stdout)
    if summary is not None:
        assert summary in outcome.stderr, outcome.stderr
        assert summary not in outcome.stdout
    assert not (isolated / "-").exists() and not (out / "-").exists()


# =============================================================================================
# 3. Crashes are exit 3, bad option values and bad data exit 2, and nothing is left behind
# =============================================================================================
@pytest.mark.parametrize(
    "args",
    [
        ["validate", "{m}", "{m}", "--no-speed", "--seed", "-1"],
        ["validate", "{m}", "{m}", "--no-speed", "--seed", str(2**32)],
        ["convert", "{m}", "-o", "{out}/x.onnx", "--validate", "--no-speed", "--seed", "-1"],
        ["check", "{m}", "--no-speed", "-o", "{out}/x.onnx", "--seed", "-1"],
    ],
    ids=["validate -1", "validate 2**32", "convert --validate", "check"],
)
def test_bad_seed_is_exit_2(tmp_path, m, out, args):
    before = listing(tmp_path)
    one_error(run(*[a.format(m=m, out=out) for a in args]), 2, "--seed")
    assert listing(tmp_path) == before


def test_generate_refuses_a_negative_seed():
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

    plan = plan_inputs(describe_inputs(tiny_model()))
    with pytest.raises(AutocastError, match="seed"):
        generate(plan, seed=-1)
    assert generate(plan, seed=2**32 - 1)["x"].shape == (3, 8)


def bad_npz(case, folder: Path) -> tuple[Path, str]:
    """(.npz path, a fragment of the error) for one broken batch of tiny_model's input 'x'."""
    path = folder / f"{case}.npz"
    if case == "text":
        np.savez(path, x=np.array([["hello"] * 8] * 2))
        return path, "'x'"
    if case == "bytes":
        np.savez(path, x=np.array([[b"ab"] * 8] * 2))
        return path, "'x'"
    if case == "complex":
        np.savez(path, x=np.ones((2, 8), np.complex64))
        return path, "'x'"
    if case == "object":
        np.savez(path, x=np.array([[{"a": 1}] * 8] * 2, dtype=object))
        return path, "'x'"
    if case == "wrong_rank":
        np.savez(path, x=np.ones((2, 8, 1), np.float32))
        return path, "'x'"
    if case == "wrong_size":
        np.savez(path, x=np.ones((2, 5), np.float32))
        return path, "'x'"
    if case == "missing":
        np.savez(path, other=np.ones((2, 8), np.float32))
        return path, "x"
    if case == "not_npz":
        path.write_text("not an archive\n")
        return path, "npz"
    raise ValueError(case)


NPZ_CASES = ["text", "bytes", "complex", "object", "wrong_rank", "wrong_size", "missing", "not_npz"]


@pytest.mark.parametrize(
    "command", ["validate", "convert --validate", "check", "convert --calibration-data", "explain --calibration-data"]
)
@pytest.mark.parametrize("case", NPZ_CASES)
def test_bad_npz_is_exit_2_naming_file_and_array(tmp_path, m, out, case, command):
    data, fragment = bad_npz(case, tmp_path / "model")
    args = {
        "validate": ["validate", m, m, "--no-speed", "--inputs", data, "--report-json", out / "r.json"],
        "convert --validate": [
            "convert",
            m,
            "-o",
            out / "x.onnx",
            "--plan-out",
            out / "p.json",
            "--validate",
            "--no-speed",
            "--inputs",
            data,
        ],
        "check": ["check", m, "--no-speed", "-o", out / "x.onnx", "--inputs", data],
        "convert --calibration-data": ["convert", m, "-o", out / "x.onnx", "--calibration-data", data],
        "explain --calibration-data": ["explain", m, "fc", "--calibration-data", data],
    }[command]
    before = listing(tmp_path)
    outcome = run(*args)
    one_error(outcome, 2, data.name, fragment)
    assert outcome.stdout == ""
    assert listing(tmp_path) == before


def boom(*args, **kwargs):
    raise ValueError("boom\nsecond line of the message")


# name -> (module, attribute to break, argv, subject named in the message)
CRASHES = {
    "convert (after writing)": (
        "autocast_onnx.report",
        "conversion_summary",
        ["convert", "{m}", "-o", "{out}/x.onnx", "--plan-out", "{out}/p.json"],
        "converting",
    ),
    "convert --validate": (
        "autocast_onnx.validate.core",
        "validate",
        [
            "convert",
            "{m}",
            "-o",
            "{out}/x.onnx",
            "--plan-out",
            "{out}/p.json",
            "--validate",
            "--no-speed",
            "--report-json",
            "{out}/r.json",
        ],
        "converting",
    ),
    "validate (second report)": (
        "autocast_onnx.report.html",
        "validation_html",
        ["validate", "{m}", "{m}", "--no-speed", "--report-json", "{out}/r.json", "--report-html", "{out}/r.html"],
        "validating",
    ),
    "check": (
        "autocast_onnx.report.checkgate",
        "check_summary",
        ["check", "{m}", "--no-speed", "-o", "{out}/x.onnx", "--sarif", "{out}/s.sarif"],
        "checking",
    ),
    "lint": ("autocast_onnx.lint.report", "lint_text", ["lint", "{m}", "-o", "{out}/l.txt"], "linting"),
    "explain": ("autocast_onnx.pipeline", "plan_model", ["explain", "{m}", "fc"], "explaining"),
    "rules": ("autocast_onnx.lint.report", "rules_text", ["rules"], "listing"),
}


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_unexpected_exception_is_exit_3_in_one_line_and_leaves_nothing(tmp_path, m, out, monkeypatch, case):
    import importlib

    module, name, args, doing = CRASHES[case]
    monkeypatch.setattr(importlib.import_module(module), name, boom)
    before = listing(tmp_path)
    line = one_error(
        run(*[a.format(m=m, out=out) for a in args]),
        3,
        f"internal error while {doing}",
        "ValueError: boom second line of the message",
        "this is a bug in autocast-onnx",
        "AUTOCAST_ONNX_DEBUG=1",
    )
    if case != "rules":
        assert "m.onnx" in line
    assert listing(tmp_path) == before


def test_debug_shows_the_traceback_and_still_exits_3(tmp_path, m, out, monkeypatch):
    from autocast_onnx import report

    monkeypatch.setattr(report, "conversion_summary", boom)
    outcome = run("convert", m, "-o", out / "x.onnx", env={"AUTOCAST_ONNX_DEBUG": "1"})
    assert outcome.code == 3
    assert "Traceback" in outcome.stderr and "ValueError: boom" in outcome.stderr
    assert outcome.lines()[-1].startswith(PREFIX + "internal error while converting")
    assert list(out.iterdir()) == []


def test_memory_error_is_named_as_such(tmp_path, m, out, monkeypatch):
    from autocast_onnx import pipeline

    def no_memory(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(pipeline, "save_model", no_memory)
    one_error(run("convert", m, "-o", out / "x.onnx"), 2, "out of memory while converting", "m.onnx")
    assert list(out.iterdir()) == []


def test_failure_after_writing_keeps_files_it_did_not_write(tmp_path, m, out, monkeypatch):
    """A report file that existed and was not yet written stays; the model this run replaced
    is removed (it is this run's, and incomplete without the rest)."""
    from autocast_onnx.validate import core

    (out / "x.onnx").write_bytes(b"an older model")
    (out / "r.json").write_text("an older report\n")
    monkeypatch.setattr(core, "validate", boom)
    one_error(
        run("convert", m, "-o", out / "x.onnx", "--validate", "--no-speed", "--report-json", out / "r.json"),
        3,
        "internal error while converting",
    )
    assert sorted(p.name for p in out.iterdir()) == ["r.json"]
    assert (out / "r.json").read_text() == "an older report\n"


def test_a_validation_that_cannot_run_keeps_the_converted_model_and_its_plan(tmp_path, m, out, monkeypatch):
    """convert --validate whose validation fails with bad input (exit 2) after the model was
    written keeps the model and the plan (the conversion succeeded) and says they are not
    validated; the reports it did not write are not left behind (tests/cli/test_convert_validate_keeps.py)."""
    from autocast_onnx.validate import core

    def refuse(*a, **k):
        raise AutocastError("the runtime refused it", "x.onnx", "do something")

    monkeypatch.setattr(core, "validate", refuse)
    one_error(
        run("convert", m, "-o", out / "x.onnx", "--plan-out", out / "p.json", "--validate", "--no-speed"),
        2,
        "runtime refused",
    )
    assert sorted(p.name for p in out.iterdir()) == ["p.json", "x.onnx"]


def test_output_snapshot(out):
    tmp_path = out
    new, kept, replaced = tmp_path / "new", tmp_path / "kept", tmp_path / "replaced"
    kept.write_text("kept")
    replaced.write_text("old")
    link = tmp_path / "link"
    link.symlink_to("kept")
    reader = FifoReader(tmp_path / "pipe")
    snapshot = aio.OutputSnapshot([new, kept, replaced, link, tmp_path / "pipe", "-", None])
    new.write_text("new")
    tmp = tmp_path / "tmp"
    tmp.write_text("replacement")
    os.replace(tmp, replaced)
    aio.write_text_atomic(tmp_path / "pipe", "into the pipe")
    assert sorted(p.name for p in snapshot.discard()) == ["new", "replaced"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "link", "pipe"]
    assert reader.close() == b"into the pipe"
    assert_fifo(tmp_path / "pipe")


@pytest.mark.parametrize(
    "case",
    ["convert --plan-out", "convert --validate --report-json", "validate --report-html", "lint -o", "check --sarif"],
)
def test_report_over_the_inputs_external_data_is_refused(tmp_path, out, case):
    folder = tmp_path / "model"
    folder.mkdir()
    stored = tiny_model()
    onnx.save(stored, folder / "ext.onnx", save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    path, data = folder / "ext.onnx", folder / "ext.onnx.data"
    args = {
        "convert --plan-out": ["convert", path, "-o", out / "x.onnx", "--plan-out", data],
        "convert --validate --report-json": [
            "convert",
            path,
            "-o",
            out / "x.onnx",
            "--validate",
            "--no-speed",
            "--report-json",
            data,
        ],
        "validate --report-html": ["validate", path, path, "--no-speed", "--report-html", data],
        "lint -o": ["lint", path, "-o", data],
        "check --sarif": ["check", path, "--no-speed", "--sarif", data],
    }[case]
    before = listing(tmp_path)
    one_error(run(*args), 2, "would overwrite a file of the input model", "ext.onnx.data")
    assert listing(tmp_path) == before


def run_with_stdout_into(fifo: FifoReader, *args) -> subprocess.CompletedProcess:
    """`python -m autocast_onnx ARGS` in a real process whose stdout is the FIFO."""
    with open(fifo.path, "wb") as stdout:
        return subprocess.run(
            [sys.executable, "-m", "autocast_onnx", *map(str, args)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.mark.slow
def test_report_into_the_file_stdout_goes_to(tmp_path, m, out):
    """A report given the path stdout is connected to counts as stdout: the summary goes to
    stderr, so stdout holds the report alone (and the FIFO stays a FIFO)."""
    fifo = FifoReader(out / "stdout")
    proc = run_with_stdout_into(fifo, "validate", m, m, "--no-speed", "--report-json", fifo.path)
    data = fifo.close()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(data)["passed"] is True
    assert "result: PASS" in proc.stderr
    assert_fifo(fifo.path)


@pytest.mark.slow
def test_dash_and_the_file_stdout_goes_to_are_one_output(tmp_path, m, out):
    fifo = FifoReader(out / "stdout")
    proc = run_with_stdout_into(fifo, "validate", m, m, "--no-speed", "--report-json", "-", "--report-html", fifo.path)
    assert fifo.close() == b""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "stdout" in lines[0], proc.stderr
    assert_fifo(fifo.path)


def test_interrupt_after_writing_leaves_nothing(tmp_path, m, out, monkeypatch):
    from autocast_onnx import report

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "conversion_summary", interrupt)
    one_error(run("convert", m, "-o", out / "x.onnx", "--plan-out", out / "p.json"), 130, "interrupted")
    assert list(out.iterdir()) == []


def test_the_check_reads_the_bytes_that_are_written(tmp_path, m, out, monkeypatch):
    """A model in one piece is checked from its serialized bytes while a thread writes them:
    the check is given exactly what lands in the file (and, with large converted weights, their
    stand-in: tests/fast/test_splice.py)."""
    from autocast_onnx import pipeline

    seen = []
    real = pipeline.check_result

    def recording(payload, full=True):
        seen.append(bytes(payload))
        return real(payload, full)

    monkeypatch.setattr(pipeline, "check_result", recording)
    assert run("convert", m, "-o", out / "x.onnx", "-q").code == 0
    assert len(seen) == 1 and seen[0] == (out / "x.onnx").read_bytes()


def test_a_failed_check_writes_nothing_and_keeps_the_older_model(tmp_path, m, out, monkeypatch):
    """When the check fails, the temporary the thread was writing is removed and the file
    already at -o stays as it was."""
    from autocast_onnx import pipeline
    from autocast_onnx.errors import InternalCheckError

    seen = []

    def failing(payload, full=True):
        seen.append(onnx.ModelProto.FromString(payload))
        raise InternalCheckError("the converted model fails onnx.checker: planted")

    monkeypatch.setattr(pipeline, "check_result", failing)
    (out / "x.onnx").write_bytes(b"an older model")
    one_error(run("convert", m, "-o", out / "x.onnx"), 3, "fails onnx.checker: planted")
    assert sorted(p.name for p in out.iterdir()) == ["x.onnx"]
    assert (out / "x.onnx").read_bytes() == b"an older model"
    assert [n.op_type for n in seen[0].graph.node if n.op_type == "Cast"]  # it saw the converted model


def test_a_failed_write_beside_the_check_is_one_line_and_leaves_nothing(tmp_path, m, out, monkeypatch):
    """The thread writing the model fails (a full disk) while the check passes: exit 2 naming
    the output, no temporary left, the older file untouched."""
    import errno

    def full_disk(fh, payload):
        fh.write(payload[: len(payload) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(aio, "_write_and_sync", full_disk)
    (out / "x.onnx").write_bytes(b"an older model")
    one_error(run("convert", m, "-o", out / "x.onnx"), 2, "cannot write output: No space left on device", "x.onnx")
    assert sorted(p.name for p in out.iterdir()) == ["x.onnx"]
    assert (out / "x.onnx").read_bytes() == b"an older model"
