"""--help in named option groups with help text for every option; honest progress on stderr;
-q quiet on a terminal too."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import autocast_onnx
from autocast_onnx.cli import convert as cli_convert
from autocast_onnx.cli import groups as cli_groups
from autocast_onnx.cli import validate as cli_validate
from autocast_onnx.cli.app import OPTION_GROUPS
from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "models" / "resnet_tiny.onnx"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_option_has_help_and_a_named_group(name):
    command = cli.commands[name]
    grouped = {n for _, names in OPTION_GROUPS for n in names}
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts}: no help text"
            assert param.name in grouped, f"{name} {param.opts}: in no OPTION_GROUPS group"
    text = invoke(name, "--help").stdout
    assert "General:" in text and "Other options:" not in text


def test_convert_help_lists_options_under_their_groups():
    text = invoke("convert", "--help").stdout
    titles = [t for t, _ in OPTION_GROUPS if f"\n{t}:\n" in text]
    assert titles[:4] == ["Input and output", "Precision and rules", "Node selection", "Data-driven planning"]
    node_selection = text.split("Node selection:")[1].split("\n\n")[0]
    assert "--exclude-op" in node_selection and "--precision" not in node_selection


@pytest.mark.slow
def test_a_command_without_arguments_prints_one_usage_line(tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "convert"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "autocast-onnx: error: Missing argument 'MODELS...'. (see autocast-onnx convert --help)"
    ]


def test_long_stages_say_so_in_one_line_without_a_terminal(tmp_path, monkeypatch):
    conv = tmp_path / "r16.onnx"
    autocast_onnx.convert_file(RESNET, conv)
    # quick stages stay quiet: with the threshold out of reach, whatever this machine's speed (a busy
    # 2-core runner once took 1.1 s to load the two models, over the real 1.0 s threshold)
    monkeypatch.setattr(cli_groups, "LONG_STAGE_S", math.inf)
    quick = invoke("validate", RESNET, conv, "--iterations", "2", "--warmup", "0")
    assert quick.exit_code == 0 and quick.stderr == ""
    monkeypatch.setattr(cli_groups, "LONG_STAGE_S", 0.0)
    slow = invoke("validate", RESNET, conv, "--speed", "--iterations", "2", "--warmup", "0", "--batches", "2")
    lines = slow.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "loading both models into ONNX Runtime",
        "comparing outputs on 2 batch(es)",
        "timing both models (2 runs each)",
    ]
    assert all(line.endswith(" s") and ": done in " in line for line in lines)


def test_quiet_prints_nothing_on_a_terminal_either(tmp_path, monkeypatch):
    conv = tmp_path / "r16.onnx"
    autocast_onnx.convert_file(RESNET, conv)
    monkeypatch.setattr(cli_groups, "LONG_STAGE_S", 0.0)
    shown = []
    for module in (cli_validate, cli_convert):  # where the commands look _progress up
        monkeypatch.setattr(module, "_progress", lambda label, total: shown.append(label))
    result = invoke("validate", RESNET, conv, "--iterations", "2", "--warmup", "0", "--batches", "2", "-q")
    assert result.exit_code == 0 and result.output == "" and shown == []
    out = tmp_path / "o.onnx"
    result = invoke("convert", RESNET, "-o", out, "--validate", "--batches", "2", "--iterations", "2", "-q")
    assert result.exit_code == 0 and result.output == "" and shown == []


def test_progress_bar_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli_groups._progress("one step", 1) is None  # nothing moves in one step
    bar = cli_groups._progress("comparing outputs on 3 batch(es)", 3)
    bar.update(3)
    bar.finish()
    assert "comparing outputs on 3 batch(es)" in capsys.readouterr().err
