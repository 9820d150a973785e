"""Every option of every command, given hostile values: negative, zero (where invalid), NaN,
infinity, huge, not a number, empty, malformed. The contract for each: exit code 2, one stderr
line "autocast-onnx: error: ...", no traceback, nothing on stdout, and nothing written (no
-o / --plan-out / report file, no MODEL.fp16.onnx beside the input, nothing changed anywhere
under the test's folder).

The options are read from the click command objects, so a new option without an entry in
HOSTILE below fails test_every_option_has_hostile_values (with a message saying to add one).
Each entry lists, per kind of value, the hostile value(s), or Valid("why") where that kind is
legitimately accepted (e.g. --seed 0), or NO_VALUE for a flag (then '--flag=abc' is attacked).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import F32, init, model, tensor
from onnx import helper

from autocast_onnx.cli.main import cli

PREFIX = "autocast-onnx: error: "
COMMANDS = ["convert", "validate", "lint", "check", "explain", "rules", "emulate", "diagnose"]


@dataclass(frozen=True)
class Valid:
    """This kind of value is legitimately accepted by the option (not attacked)."""

    why: str


NO_VALUE = "flag: no value to attack; '--flag=abc' is attacked instead"

# kinds every option of a type must answer (a value to attack, or Valid)
NUMBER_KINDS = ("negative", "zero", "nan", "inf", "huge", "not_a_number", "empty")
CHOICE_KINDS = ("unknown", "empty")
PATH_KINDS = ("empty", "directory")
TEXT_KINDS = ("empty",)

# Placeholders, filled per test: {model} the tiny model, {out} the (empty) output folder,
# {missing} a path that does not exist, {dir} an empty folder, {text} a text file, {bad_rules}
# a broken rule file, {bad_config} a broken configuration file, {npz_text} an .npz whose 'x' is
# a string array, {npz_rank} one whose 'x' has the wrong rank.
OUTPUT = {"empty": "", "directory": "{out}", "missing_folder": "{out}/nope/file", "input": "{model}"}
INPUT_FILE = {"empty": "", "directory": "{dir}", "missing": "{missing}", "not_onnx": "{text}"}
BATCHES = {
    "empty": "",
    "directory": "{dir}",
    "missing": "{missing}",
    "text_array": "{npz_text}",
    "wrong_rank": "{npz_rank}",
    "not_npz": "{text}",
}
RULES = {"empty": "", "directory": "{dir}", "missing": "{missing}", "invalid": "{bad_rules}"}
CONFIG = {"empty": "", "directory": "{dir}", "missing": "{missing}", "invalid": "{bad_config}"}
REGEX = {"empty": "", "blank": "   ", "bad_regex": "(["}
IO_REGEX = REGEX | {"matches_nothing": "nosuch.*", "matches_no_float": "input_ids"}
OP = {"empty": "", "blank": "   "}
# --opset: a whole number the installed onnx knows, not below the model's (17)
JOBS = {  # -j: 1 to cli.main.MAX_JOBS worker processes
    "negative": "-1",
    "zero": "0",
    "nan": "nan",
    "inf": "inf",
    "huge": ["1025", str(10**30)],
    "not_a_number": "abc",
    "empty": "",
    "fraction": "1.5",
}
OPSET = {
    "negative": "-1",
    "zero": "0",
    "nan": "nan",
    "inf": "inf",
    "huge": ["999", str(10**30)],
    "not_a_number": "abc",
    "empty": "",
    "fraction": "1.5",
    "downgrade": "5",
}
SELECTOR = {"empty": "", "blank": " ", "unknown": "ZZ999"}
PLAN_FILE = {"empty": "", "directory": "{dir}", "missing": "{missing}", "not_a_plan": "{text}", "a_model": "{model}"}


def choice(*_):
    return {"unknown": "nope", "empty": "", "wrong_case": "NOPE"}


def threshold(low_is_valid: bool, huge_is_valid: bool, negative: str, huge: str = "1e30"):
    return {
        "negative": Valid("any value >= -1 is a valid minimum cosine") if low_is_valid else negative,
        "zero": Valid("0 is a legitimate threshold"),
        "nan": "nan",
        "inf": "inf",
        "huge": Valid("a huge tolerance means no limit") if huge_is_valid else huge,
        "not_a_number": "abc",
        "empty": "",
        "minus_inf": "-inf",
    }


VALIDATION = {
    "inputs": BATCHES,
    "dims": {
        "empty": "",
        "no_equals": "batch",
        "no_name": "=2",
        "negative": "batch=-1",
        "zero": "batch=0",
        "nan": "batch=nan",
        "inf": "batch=inf",
        "huge": "batch=" + "9" * 30,
        "not_a_number": "batch=abc",
        "fraction": "batch=1.5",
        "unknown_name": "nosuch=2",
        "too_large_to_generate": "batch=100000000",
    },
    "ranges": {
        "empty": "",
        "malformed": "x",
        "reversed": "x=1:0",
        "equal": "x=1:1",
        "nan": "x=nan:1",
        "inf": "x=0:inf",
        "overflow": "x=0:1e999",
        "huge": "x=0:1e39",
        "not_a_number": "x=abc:1",
        "unknown_name": "nosuch=0:1",
    },
    "batches": {
        "negative": "-1",
        "zero": "0",
        "nan": "nan",
        "inf": "inf",
        "huge": ["10001", str(10**30)],
        "not_a_number": "abc",
        "empty": "",
        "fraction": "1.5",
    },
    "seed": {
        "negative": "-1",
        "zero": Valid("seed 0 is the default"),
        "nan": "nan",
        "inf": "inf",
        "huge": [str(2**32), str(10**30)],
        "not_a_number": "abc",
        "empty": "",
        "fraction": "1.5",
    },
    "device": choice(),
    "numerics": choice(),
    "atol": threshold(False, True, "-1"),
    "rtol": threshold(False, True, "-0.5") | {"unknown_output": "nosuch=0.1", "no_output_name": "=0.1"},
    "min_cosine": threshold(True, False, "-2") | {"below_minus_one": "-1.5", "above_one": "1.5"},
    "min_top1": threshold(False, False, "-0.5") | {"above_one": "1.5"},
    "min_iou": threshold(False, False, "-0.5") | {"above_one": "1.5"},
    "map_threshold": threshold(False, False, "-0.5") | {"above_one": "1.5"},
    "compare_padded": NO_VALUE,
    "class_outputs": {"empty": "", "blank": " ", "unknown": "nosuch"},
    "speed": NO_VALUE,
    "generate": {
        "negative": "-1",
        "zero": Valid("no greedy continuation is legitimate"),
        "nan": "nan",
        "inf": "inf",
        "huge": ["1025", str(10**30)],
        "not_a_number": "abc",
        "empty": "",
        "fraction": "1.5",
    },
    "iterations": {
        "negative": "-1",
        "zero": "0",
        "nan": "nan",
        "inf": "inf",
        "huge": ["1000001", str(10**30)],
        "not_a_number": "abc",
        "empty": "",
    },
    "warmup": {
        "negative": "-1",
        "zero": Valid("no warm-up runs is legitimate"),
        "nan": "nan",
        "inf": "inf",
        "huge": ["100001", str(10**30)],
        "not_a_number": "abc",
        "empty": "",
    },
    "report_json": OUTPUT | {"same_as_other": "{out}/r.html"},
    "report_html": OUTPUT | {"same_as_other": "{out}/r.json"},
    "save_inputs": OUTPUT | {"stdout": "-"},
}

HOSTILE = {
    "convert": {
        "models": INPUT_FILE,
        "output": OUTPUT | {"same_as_other": "{out}/plan.json", "stdout": "-"},
        "jobs": JOBS,
        "gpu": {"empty": "", "unknown": "V100"},
        "precision": choice(),
        "rules": RULES,
        "keep_io_types": NO_VALUE,
        "low_precision_io": IO_REGEX,
        "exclude_op": OP,
        "include_op": OP,
        "opset": OPSET,
        "runtime": choice(),
        "precise": NO_VALUE,
        "exclude_node": REGEX,
        "include_node": REGEX,
        "plan_out": OUTPUT | {"same_as_other": "{out}/o.onnx", "data_file_of_output": "{out}/o.onnx.data"},
        "external_data": NO_VALUE,
        "check": choice(),
        "quiet": NO_VALUE,
        "loss_scale": {
            "empty": "",
            "blank": " ",
            "negative": "-1",
            "zero": "0",
            "nan": "nan",
            "inf": "inf",
            "huge": "1e39",
            "not_a_number": "abc",
            "on_an_inference_model": "dynamic",
        },
        "calibration_data": BATCHES,
        "targets": {
            "empty": "",
            "no_value": "cosine",
            "unknown_key": "speed=2",
            "not_a_number": "cosine=abc",
            "nan": "cosine=nan",
            "inf": "atol=inf",
            "negative": "atol=-1",
            "huge": "cosine=1e30",
            "zero": Valid("atol=0 (exact results) is a legitimate target"),
        },
        "run_validate": NO_VALUE,
        "strict": NO_VALUE,
        "plan_file": PLAN_FILE,
        "config": CONFIG,
        "verbose": NO_VALUE,
        **VALIDATION,
    },
    "validate": {
        "reference": INPUT_FILE,
        "converted": INPUT_FILE,
        "quiet": NO_VALUE,
        "strict": NO_VALUE,
        "config": CONFIG,
        "verbose": NO_VALUE,
        **VALIDATION,
    },
    "lint": {
        "models": INPUT_FILE,
        "jobs": JOBS,
        "fmt": choice(),
        "statistics": NO_VALUE,
        "exit_zero": NO_VALUE,
        "show_protected": NO_VALUE,
        "output": dict(OUTPUT.items()),
        "select": SELECTOR,
        "ignore": SELECTOR,
        "fail_on": choice(),
        "precision": choice(),
        "rules": RULES,
        "exclude_op": OP,
        "include_op": OP,
        "opset": OPSET,
        "runtime": choice(),
        "precise": NO_VALUE,
        "exclude_node": REGEX,
        "include_node": REGEX,
        "config": CONFIG,
        "verbose": NO_VALUE,
    },
    "check": {
        "model": INPUT_FILE,
        "output": OUTPUT | {"same_as_other": "{out}/s.sarif", "stdout": "-"},
        "precision": choice(),
        "rules": RULES,
        "select": SELECTOR,
        "ignore": SELECTOR,
        "fail_on": choice(),
        "baseline": {
            "empty": "",
            "directory": "{dir}",
            "missing": "{missing}",
            "not_a_report": "{model}",
            "text": "{text}",
        },
        "sarif": OUTPUT | {"same_as_other": "{out}/r.json"},
        "config": CONFIG,
        "skip_validate": NO_VALUE,
        "strict": NO_VALUE,
        "keep_io_types": NO_VALUE,
        "low_precision_io": IO_REGEX,
        "exclude_op": OP,
        "include_op": OP,
        "opset": OPSET,
        "runtime": choice(),
        "precise": NO_VALUE,
        "exclude_node": REGEX,
        "include_node": REGEX,
        "verbose": NO_VALUE,
        **VALIDATION,
    },
    "explain": {
        "model": INPUT_FILE,
        "node": {"empty": "", "blank": " ", "unknown": "nosuch", "negative_id": "#-1", "huge_id": "#" + "9" * 30},
        "op_type": {"empty": "", "blank": " ", "unknown": "Softmaxx", "absent_from_model": "Conv"},
        "islands": NO_VALUE,
        "frontier": NO_VALUE,
        "gpu": {"empty": "", "unknown": "V100"},
        "precision": choice(),
        "rules": RULES,
        "exclude_op": OP,
        "include_op": OP,
        "opset": OPSET,
        "runtime": choice(),
        "precise": NO_VALUE,
        "exclude_node": REGEX,
        "include_node": REGEX,
        "calibration_data": BATCHES,
        "keep_io_types": NO_VALUE,
        "low_precision_io": IO_REGEX,
        "plan_file": PLAN_FILE,
        "config": CONFIG,
        "verbose": NO_VALUE,
    },
    "rules": {
        "codes": SELECTOR,
        "fmt": choice(),
    },
    "emulate": {
        "model": INPUT_FILE,
        "output": dict(OUTPUT.items()),
        "quiet": NO_VALUE,
        "verbose": NO_VALUE,
    },
    "diagnose": {
        "reference": INPUT_FILE,
        "converted": INPUT_FILE,
        "inputs": BATCHES,
        "dims": VALIDATION["dims"],
        "ranges": VALIDATION["ranges"],
        "seed": VALIDATION["seed"],
        "plan_file": PLAN_FILE,
        "top": {
            "negative": "-1",
            "zero": "0",
            "nan": "nan",
            "inf": "inf",
            "huge": str(10**30),
            "not_a_number": "abc",
            "empty": "",
        },
        "report_json": OUTPUT | {"same_as_other": "{out}/r.html"},
        "report_html": OUTPUT | {"same_as_other": "{out}/r.json"},
        "quiet": NO_VALUE,
        "verbose": NO_VALUE,
    },
}

# The valid run each hostile value is put into (one value replaced or added at a time): fast
# (tiny model, no speed measurement) and exercising every option (convert validates).
BASE = {
    "convert": {
        "models": "{model}",
        "output": "{out}/o.onnx",
        "plan_out": "{out}/plan.json",
        "run_validate": True,
        "speed": False,
        "report_json": "{out}/r.json",
        "report_html": "{out}/r.html",
    },
    "validate": {
        "reference": "{model}",
        "converted": "{model}",
        "speed": False,
        "report_json": "{out}/r.json",
        "report_html": "{out}/r.html",
    },
    "lint": {"models": "{model}", "output": "{out}/lint.txt"},
    "check": {
        "model": "{model}",
        "output": "{out}/o.onnx",
        "speed": False,
        "report_json": "{out}/r.json",
        "report_html": "{out}/r.html",
        "sarif": "{out}/s.sarif",
    },
    "explain": {"model": "{model}", "node": "fc"},
    "rules": {},
    "emulate": {"model": "{model}", "output": "{out}/emu.onnx"},
    "diagnose": {
        "reference": "{model}",
        "converted": "{model}",
        "report_json": "{out}/r.json",
        "report_html": "{out}/r.html",
    },
}


def kind_of(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    t = param.type
    if isinstance(t, click.Choice):
        return "choice"
    if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)):
        return "number"
    if isinstance(t, click.Path):
        return "path"
    return "text"


REQUIRED = {"number": NUMBER_KINDS, "choice": CHOICE_KINDS, "path": PATH_KINDS, "text": TEXT_KINDS}


def params(command: str):
    return [p for p in cli.commands[command].params if p.name != "help"]


def argv(command: str, values: dict) -> list[str]:
    """The command line for `values` (param name -> value; True/False for flags)."""
    args, options = [command], []
    for p in params(command):
        if p.name not in values:
            continue
        value = values[p.name]
        if isinstance(p, click.Argument):
            args.append(value)
        elif p.is_flag:
            if value is True:
                options.append(p.opts[0])
            elif value is False:
                options.append(p.secondary_opts[0])
            else:  # a hostile value given to a flag
                options.append(value)
        else:
            options += [p.opts[-1] if p.opts[-1].startswith("--") else p.opts[0], value]
    return args + options


def cases():
    for command in COMMANDS:
        for p in params(command):
            entry = HOSTILE.get(command, {}).get(p.name)
            if entry is None:
                continue  # reported by test_every_option_has_hostile_values
            if entry == NO_VALUE:
                long = next(o for o in p.opts if o.startswith("--"))
                yield pytest.param(
                    command, p.name, "value_given_to_a_flag", f"{long}=abc", id=f"{command}-{p.name}-flag=abc"
                )
                continue
            for kind, values in entry.items():
                if isinstance(values, Valid):
                    continue
                for value in values if isinstance(values, list) else [values]:
                    yield pytest.param(command, p.name, kind, value, id=f"{command}-{p.name}-{kind}-{value[:20]}")


def test_every_option_has_hostile_values():
    """Adding an option means adding its hostile values to HOSTILE (or marking a kind Valid)."""
    problems = []
    for command in COMMANDS:
        assert command in cli.commands, f"command {command} is gone: update COMMANDS"
        table = HOSTILE.get(command)
        if table is None:
            problems.append(f"add HOSTILE[{command!r}] for the new command {command!r}")
            continue
        names = {p.name for p in params(command)}
        for p in params(command):
            entry = table.get(p.name)
            label = f"{command} {'/'.join(p.opts) if isinstance(p, click.Option) else p.name.upper()}"
            if entry is None:
                problems.append(
                    f"{label}: no hostile values; add HOSTILE[{command!r}][{p.name!r}] in "
                    "tests/contracts/test_hostile_options.py"
                )
                continue
            kind = kind_of(p)
            if kind == "flag":
                if entry != NO_VALUE:
                    problems.append(f"{label} is a flag: its entry must be NO_VALUE")
                continue
            if entry == NO_VALUE:
                problems.append(f"{label} takes a value: list hostile values instead of NO_VALUE")
                continue
            for required in REQUIRED[kind]:
                if required not in entry:
                    problems.append(
                        f"{label} ({kind}): add a hostile '{required}' value, or Valid('why') if that "
                        "kind of value is legitimate"
                    )
        for stale in set(table) - names:
            problems.append(f"HOSTILE[{command!r}][{stale!r}] names no option of {command}: remove it")
    for command in set(cli.commands) - set(COMMANDS):
        problems.append(f"new command {command!r}: add it to COMMANDS, HOSTILE and BASE")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory):
    """Read-only inputs shared by every case (the tests check that they stay unchanged)."""
    root = tmp_path_factory.mktemp("hostile")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, ["batch", 8])],
        [tensor("y", F32, ["batch", 8])],
        [init("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )
    files = {
        "model": root / "m.onnx",
        "dir": root / "empty_dir",
        "missing": root / "missing.onnx",
        "text": root / "notes.txt",
        "bad_rules": root / "bad_rules.toml",
        "bad_config": root / "bad_config.toml",
        "npz_text": root / "text.npz",
        "npz_rank": root / "rank.npz",
    }
    onnx.save(m, files["model"])
    files["dir"].mkdir()
    files["text"].write_text("not a model, not a report\n")
    files["bad_rules"].write_text("[ops.keep_fp32]\nMatMul = 1\n")
    files["bad_config"].write_text('colour = "red"\n')
    np.savez(files["npz_text"], x=np.array([["hello"] * 8] * 2))
    np.savez(files["npz_rank"], x=np.ones((2, 8, 1), np.float32))
    return root, files


def snapshot(root: Path) -> dict:
    out = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        out[str(path.relative_to(root))] = path.read_bytes() if stat.S_ISREG(st.st_mode) else stat.S_IFMT(st.st_mode)
    return out


def run(args) -> tuple[int, str, str]:
    from autocast_onnx.cli.main import main

    with CliRunner().isolation() as (out, err, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return code, out.getvalue().decode(), err.getvalue().decode()


@pytest.fixture
def setting(tmp_path, fixture_files, monkeypatch):
    """(fill: str -> str, snapshot roots, out folder): run from an empty folder."""
    root, files = fixture_files
    out = tmp_path / "out"
    out.mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("AUTOCAST_ONNX_DEBUG", raising=False)
    names = {k: str(v) for k, v in files.items()} | {"out": str(out)}

    def fill(value):
        return value.format(**names) if isinstance(value, str) else value

    return fill, (root, tmp_path), out


@pytest.mark.parametrize("command", COMMANDS)
def test_base_run_is_valid(setting, command):
    """Control: without a hostile value every base command line succeeds (0, or 1 for findings)."""
    fill, _, _ = setting
    code, stdout, stderr = run([fill(a) for a in argv(command, BASE[command])])
    assert code in (0, 1) and "Traceback" not in stderr, (code, stderr, stdout[-2000:])


@pytest.mark.parametrize("command, name, kind, value", list(cases()))
def test_hostile_value(setting, fixture_files, command, name, kind, value):
    fill, roots, out = setting
    values = dict(BASE[command])
    param = next(p for p in params(command) if p.name == name)
    if isinstance(param, click.Option) and param.is_flag:
        values = dict(values)
        values.pop(name, None)
        args = [fill(a) for a in argv(command, values)] + [value]
    else:
        values[name] = value
        args = [fill(a) for a in argv(command, values)]
    before = [snapshot(r) for r in roots]
    code, stdout, stderr = run(args)
    assert "Traceback" not in stderr, stderr
    assert code == 2, f"{args}: exit {code}, stderr {stderr!r}, stdout {stdout[-500:]!r}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(PREFIX), stderr
    assert stdout == "", stdout
    assert list(out.iterdir()) == [], "an output was written"
    _, files = fixture_files
    assert not files["model"].with_name("m.fp16.onnx").exists(), "the default output appeared"
    assert [snapshot(r) for r in roots] == before, "something changed on disk"
