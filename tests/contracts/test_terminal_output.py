"""The text the commands print (issue 36, defect 1c): a model's file name, node names, tensor
names and metadata that hold a newline followed by `::error file=...::` (a forged CI
annotation), a carriage return, a terminal escape (`\\x1b]0;...\\x07` retitles the terminal,
`\\x1b[2J` clears it) or a NUL reach stdout and stderr escaped, as errors already are: each name
stays inside its own line, written as its Python escape, and no raw control character but the
line breaks of the layout is printed.

Each command runs in its own process (`python -m autocast_onnx`), its raw bytes read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import F16, F32, init, model, tensor
from onnx import helper

# whole-process tests: each runs the command line in a process of its own
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "\n::error file=forged.onnx,line=1::forged\r\x1b]0;pwned\x07\x1b[2J\x00"
RAW = ("\r", "\x1b", "\x07", "\x00", "\u2028")


def hostile_fp32(folder: Path) -> Path:
    """MatMul -> Softmax, every name hostile; metadata with hostile values."""
    w = init(f"w{HOSTILE}", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", [f"x{HOSTILE}", w.name], [f"h{HOSTILE}"], name=f"mm{HOSTILE}"),
        helper.make_node("Softmax", [f"h{HOSTILE}"], [f"y{HOSTILE}"], name=f"sm{HOSTILE}", axis=-1),
    ]
    m = model(nodes, [tensor(f"x{HOSTILE}", F32, [2, 8])], [tensor(f"y{HOSTILE}", F32, [2, 8])], [w])
    onnx.helper.set_model_props(m, {f"author{HOSTILE}": f"someone{HOSTILE}"})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"m{HOSTILE.replace(chr(0), '')}.onnx"
    onnx.save_model(m, path)
    return path


def hostile_fp16(folder: Path) -> Path:
    """An fp16 Softmax (lint finds AC101 on it), its names hostile."""
    nodes = [helper.make_node("Softmax", [f"x{HOSTILE}"], [f"y{HOSTILE}"], name=f"sm{HOSTILE}", axis=-1)]
    m = model(nodes, [tensor(f"x{HOSTILE}", F16, [2, 12])], [tensor(f"y{HOSTILE}", F16, [2, 12])])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"h{HOSTILE.replace(chr(0), '')}.onnx"
    onnx.save_model(m, path)
    return path


def run(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autocast_onnx", *map(str, args)], cwd=cwd, capture_output=True)


def assert_escaped(result: subprocess.CompletedProcess) -> None:
    """No raw control character but newlines; no printed line starts with a forged annotation;
    the hostile text is shown as its escape."""
    for stream in (result.stdout, result.stderr):
        text = stream.decode("utf-8", "surrogateescape")
        for raw in RAW:
            assert raw not in text, (raw, text)
        for line in text.split("\n"):
            assert not line.lstrip().startswith("::"), line
    both = (result.stdout + result.stderr).decode("utf-8", "surrogateescape")
    assert "\\n::error file=forged.onnx,line=1::forged\\r\\x1b]0;pwned\\x07\\x1b[2J" in both, both


@pytest.fixture
def models(tmp_path):
    return hostile_fp32(tmp_path / "in"), hostile_fp16(tmp_path / "in16")


def test_convert_summary(models, tmp_path):
    fp32, _ = models
    result = run("convert", fp32, "-o", tmp_path / "out.onnx", "-v", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_escaped(result)


def test_convert_table_of_several_models(models, tmp_path):
    fp32, _ = models
    second = fp32.parent / "plain.onnx"
    second.write_bytes(fp32.read_bytes())
    result = run("convert", fp32.parent, "-o", tmp_path / "out", "-j", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_escaped(result)


@pytest.mark.parametrize("which", [0, 1])
def test_lint_text(models, tmp_path, which):
    result = run("lint", models[which], cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert_escaped(result)


def test_lint_text_of_a_converted_model_with_its_provenance(models, tmp_path):
    out = tmp_path / f"c{HOSTILE.replace(chr(0), '')}.onnx"
    assert run("convert", models[0], "-o", out, "-q", cwd=tmp_path).returncode == 0
    result = run("lint", out, models[1], cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert_escaped(result)


def test_explain(models, tmp_path):
    result = run("explain", models[0], "^mm", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_escaped(result)


def test_check(models, tmp_path):
    result = run("check", models[0], "--no-speed", cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert_escaped(result)


def test_validate_and_diagnose(models, tmp_path):
    out = tmp_path / f"c{HOSTILE.replace(chr(0), '')}.onnx"
    assert run("convert", models[0], "-o", out, "-q", cwd=tmp_path).returncode == 0
    for args in (("validate", models[0], out, "--no-speed"), ("diagnose", models[0], out)):
        result = run(*args, cwd=tmp_path)
        assert result.returncode in (0, 1), result.stderr
        assert_escaped(result)


def test_emulate(models, tmp_path):
    out = tmp_path / f"c{HOSTILE.replace(chr(0), '')}.onnx"
    assert run("convert", models[0], "-o", out, "-q", cwd=tmp_path).returncode == 0
    result = run("emulate", out, "-o", tmp_path / "emu.onnx", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_escaped(result)
