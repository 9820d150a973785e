"""Small things of the command line (issue 28, item 15): --version names the onnx and
onnxruntime versions beside the tool's; `autocast-onnx` with nothing is one short line."""

from __future__ import annotations

from importlib import metadata

import pytest

from autocast_onnx._version import __version__
from autocast_onnx.cli.main import main


def test_version_names_onnx_and_onnxruntime(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"autocast-onnx {__version__} (onnx {metadata.version('onnx')}, ")
    assert f"onnxruntime {metadata.version('onnxruntime')}" in out and out.count("\n") == 1


def test_no_command_is_one_short_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 200, lines
    assert lines[0].startswith("autocast-onnx: error: no command given") and "convert" in lines[0]
