"""Every error and warning is exactly one stderr line, whatever the names it repeats hold.

A message repeats names from the model (op types, external-data locations), from rule files
(file names, keys) and from the command line (paths). A newline, carriage return, escape or NUL
in one of them must not split the line, nor forge a second 'autocast-onnx: error:' line: it is
written as its escape (`\\n`, `\\r`, `\\x1b`, `\\x00`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from bad_input_helpers import (
    PREFIX,
    assert_one_error,
    edit_external,
    external_model,
    invoke,
    isolated_cwd,
    small_model,
    write_model,
)
from helpers import F32, model, tensor
from onnx import helper

from autocast_onnx.errors import AutocastError, one_line

FORGED = "\nautocast-onnx: error: forged"
HOSTILE = ["\n", "\r", "\x1b[2K", "\x00", "\u2028"]  # each must come out as its escape


def assert_single_line(outcome, *fragments: str) -> str:
    """The one-line error contract, read on the raw stderr: one newline (the last character), and
    no carriage return, escape, NUL or line separator anywhere (a forged 'autocast-onnx: error:'
    stays text inside the one line)."""
    line = assert_one_error(outcome, *fragments)
    assert outcome.stderr.count("\n") == 1 and outcome.stderr.endswith("\n"), repr(outcome.stderr)
    for char in HOSTILE[1:]:
        assert char not in outcome.stderr, repr(outcome.stderr)
    return line


isolated = pytest.fixture(autouse=True)(isolated_cwd)


def op_model(op_type: str) -> onnx.ModelProto:
    nodes = [helper.make_node(op_type, ["x"], ["y"], name="n")]
    return model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])])


# ---- the escaping itself ---------------------------------------------------------------------
def test_one_line_escapes_every_control_character():
    assert one_line("plain text, é and 中") == "plain text, é and 中"
    assert one_line("a\nb\rc\x1b[31md\x00e\tf\u2028g\udcff") == "a\\nb\\rc\\x1b[31md\\x00e\\tf\\u2028g\\udcff"
    line = AutocastError("op 'A\nB' is unknown", "m\x1b.onnx", "fix\r it").line()
    assert line == "m\\x1b.onnx: op 'A\\nB' is unknown (fix\\r it)"


# ---- names from the model ------------------------------------------------------------------
@pytest.mark.parametrize("char", HOSTILE)
@pytest.mark.parametrize("command", ["convert", "explain"])
def test_op_type_with_a_control_character(tmp_path, command, char):
    op_type = f"Foo{char}autocast-onnx: error: forged"
    path = write_model(op_model(op_type), tmp_path / "m.onnx")
    args = ["convert", path, "-o", tmp_path / "o.onnx"] if command == "convert" else ["explain", path, "n"]
    line = assert_single_line(invoke(args), "Foo")  # (the checker's text may end the name at a NUL)
    assert not (tmp_path / "o.onnx").exists(), line


def test_external_data_location_that_forges_a_line(tmp_path):
    path = external_model(tmp_path / "ext")
    edit_external(path, location="w.data" + FORGED)
    outcome = invoke(["convert", path, "-o", tmp_path / "o.onnx"])
    assert_single_line(outcome, "w.data\\nautocast-onnx: error: forged")


@pytest.mark.slow
def test_external_data_location_in_a_real_process(tmp_path):
    """The real entry point and the real stderr (not click's test runner)."""
    path = external_model(tmp_path / "ext")
    edit_external(path, location="w.data\r\x1b[2K" + FORGED)
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "convert", str(path), "-o", str(tmp_path / "o.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(PREFIX), repr(proc.stderr)
    assert "\\r\\x1b[2K\\nautocast-onnx: error: forged" in proc.stderr


# ---- paths -----------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["-o", "--plan-out"])
def test_output_path_with_a_newline(tmp_path, flag):
    m = write_model(small_model(), tmp_path / "m.onnx")
    missing = tmp_path / ("no" + FORGED) / "o.onnx"
    args = ["convert", m, "-o", tmp_path / "o.onnx", flag, missing] if flag != "-o" else ["convert", m, "-o", missing]
    assert_single_line(invoke(args), "output folder does not exist", "no\\nautocast-onnx: error: forged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "m.onnx"]


@pytest.mark.slow
def test_input_path_that_is_not_utf8(tmp_path):
    """A file name that is not UTF-8 reaches Python as surrogates, which stderr cannot encode:
    escaped, it is one line too (in a real process, with the real stderr)."""
    name = os.fsencode(tmp_path) + b"/m\xff\n.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "convert", name], capture_output=True, timeout=120, check=False
    )
    stderr = proc.stderr.decode("utf-8")
    assert proc.returncode == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith(PREFIX), repr(stderr)
    assert "m\\udcff\\n.onnx" in stderr


def test_lint_lists_each_bad_model_on_one_line(tmp_path):
    good = write_model(small_model(), tmp_path / "good.onnx")
    outcome = invoke(["lint", good, tmp_path / ("gone" + FORGED + ".onnx")])
    assert outcome.code == 2, outcome.stderr
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), repr(outcome.stderr)
    assert "gone\\nautocast-onnx: error: forged.onnx" in lines[0]


# ---- rule files ------------------------------------------------------------------------------
def test_rules_file_name_and_key_with_a_newline(tmp_path):
    m = write_model(small_model(), tmp_path / "m.onnx")
    rules = tmp_path / ("r" + FORGED + ".toml")
    rules.write_text('[[nodes]]\nmatch = "fc"\n"bad\\nkey" = 1\n')
    outcome = invoke(["convert", m, "-o", tmp_path / "o.onnx", "--rules", rules])
    assert_single_line(outcome, "r\\nautocast-onnx: error: forged.toml", "bad\\nkey")


def test_rules_op_name_with_an_escape(tmp_path):
    m = write_model(small_model(), tmp_path / "m.onnx")
    rules = tmp_path / "r.toml"
    rules.write_text('[ops.low_precision]\n"Bad\\u001b[2KOp\\r" = "why"\n')
    outcome = invoke(["convert", m, "-o", tmp_path / "o.onnx", "--rules", rules])
    assert_single_line(outcome, "Bad\\x1b[2KOp\\r")


# ---- warnings and logs -----------------------------------------------------------------------
def test_emulate_warning_is_one_line(tmp_path):
    """emulate warns that a model with no fp16 tensor emulates nothing, naming the file."""
    path = write_model(small_model(), tmp_path / ("m" + FORGED + ".onnx"))
    outcome = invoke(["emulate", path, "-o", tmp_path / "e.onnx"])
    assert outcome.code == 0, outcome.stderr
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocast-onnx: warning: "), repr(outcome.stderr)
    assert "m\\nautocast-onnx: error: forged.onnx" in lines[0]


def test_verbose_log_records_are_one_line():
    from autocast_onnx.cli.groups import _OneLineFormatter

    record = logging.LogRecord("autocast_onnx.x", logging.INFO, __file__, 1, "output %r is %s", ("o", "a\nb\x1b"), None)
    assert _OneLineFormatter("autocast-onnx: %(name)s: %(message)s").format(record) == (
        "autocast-onnx: autocast_onnx.x: output 'o' is a\\nb\\x1b"
    )


def test_paths_in_messages_stay_as_they_were(tmp_path):
    """Printable names are shown unchanged (a backslash is not doubled)."""
    m = write_model(small_model(), tmp_path / "m.onnx")
    outcome = invoke(["convert", m, "-o", tmp_path / "a\\b é" / "o.onnx"])
    assert_single_line(outcome, f"{tmp_path}/a\\b é: output folder does not exist")
    assert Path(m).exists()
