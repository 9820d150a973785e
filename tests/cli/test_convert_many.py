"""`convert` on several models or a folder (issue 31, item 5): each written beside its input or
into the -o folder, one table at the end, one model's failure not stopping the others, the
exit code the worst outcome, -j N worker processes (for lint too), progress on stderr, clashing
outputs refused up front."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import parse, randn

from autocast_onnx.cli import batch
from autocast_onnx.cli.main import cli

PREFIX = "autocast-onnx: error: "


def mlp(seed: int):
    return parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            [fc] h = MatMul(x, w)
            [act] a = Relu(h)
            [fc2] y = MatMul(a, v)
        }""",
        w=randn([8, 8], seed=seed),
        v=randn([8, 8], seed=seed + 1),
    )


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def folder(tmp_path):
    """models/a.onnx, models/b.onnx, models/sub/c.onnx: three small MLPs."""
    root = tmp_path / "models"
    (root / "sub").mkdir(parents=True)
    for k, rel in enumerate(("a.onnx", "b.onnx", "sub/c.onnx")):
        onnx.save(mlp(10 * k), root / rel)
    return root


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(PREFIX)]


def test_folder_converts_each_model_beside_it_and_prints_one_table(folder):
    result = invoke("convert", folder, "-j", "1")
    assert result.exit_code == 0, result.stderr
    for rel in ("a.fp16.onnx", "b.fp16.onnx", "sub/c.fp16.onnx"):
        assert (folder / rel).is_file()
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "model",
        "nodes",
        "low/fp32",
        "casts",
        "size",
        "before",
        "->",
        "after",
        "time",
        "status",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    assert set(rows) == {str(folder / "a.onnx"), str(folder / "b.onnx"), str(folder / "sub" / "c.onnx")}
    assert all(r[1] == "3/0" and r[-1] == "ok" for r in rows.values())  # both MatMuls and the Relu low
    assert lines[4].startswith("3 model(s) in ") and lines[4].endswith(": 3 ok")
    # the bytes of each are those of convert on that model alone
    alone = folder.parent / "alone.onnx"
    assert invoke("convert", folder / "b.onnx", "-o", alone, "-q").exit_code == 0
    assert (folder / "b.fp16.onnx").read_bytes() == alone.read_bytes()


def test_progress_lines_on_stderr_count_models_done(folder):
    result = invoke("convert", folder, "-j", "1")
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert progress == [
        f"[1/3] {folder / 'a.onnx'} ok",
        f"[2/3] {folder / 'b.onnx'} ok",
        f"[3/3] {folder / 'sub/c.onnx'} ok",
    ]
    assert "[1/3]" not in invoke("convert", folder, "-j", "1", "-q").stderr


def test_output_folder_mirrors_the_input_folders(folder, tmp_path):
    out = tmp_path / "out"
    result = invoke("convert", folder, folder.parent / "models" / "a.onnx", "-o", out, "-j", "1")
    assert result.exit_code == 2  # a.onnx twice: both would write out/a.fp16.onnx
    assert errors(result.stderr) and "would both be written to" in result.stderr and not out.exists()
    result = invoke("convert", folder, "-o", out, "-j", "1", "--precision", "bf16")
    assert result.exit_code == 0, result.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.onnx")) == [
        "a.bf16.onnx",
        "b.bf16.onnx",
        "sub/c.bf16.onnx",
    ]
    assert not (folder / "a.bf16.onnx").exists()


def test_output_that_is_a_file_is_refused_with_several_models(folder, tmp_path):
    target = tmp_path / "one.onnx"
    target.write_bytes(b"keep")
    result = invoke("convert", folder / "a.onnx", folder / "b.onnx", "-o", target)
    assert result.exit_code == 2 and result.stdout == ""
    assert errors(result.stderr) == [
        f"{PREFIX}{target}: with several models, -o must be a folder, and this is a file "
        "(give a folder (created if missing), or convert one model to write it to a file)"
    ]
    assert target.read_bytes() == b"keep" and not (folder / "a.fp16.onnx").exists()


def test_a_bad_model_does_not_stop_the_others_and_exits_2(folder):
    (folder / "b.onnx").write_bytes(b"not a model")
    result = invoke("convert", folder, "-j", "1")
    assert result.exit_code == 2
    assert (folder / "a.fp16.onnx").is_file() and (folder / "sub" / "c.fp16.onnx").is_file()
    assert not (folder / "b.fp16.onnx").exists()
    row = next(line for line in result.stdout.splitlines() if line.startswith(str(folder / "b.onnx")))
    assert row.split()[1:] == ["-", "-", "-", "-", "error"]
    (line,) = errors(result.stderr)
    assert line.startswith(f"{PREFIX}{folder / 'b.onnx'}: ")
    assert "2 ok, 1 error" in result.stdout


def test_an_unexpected_failure_is_the_worst_exit_and_the_others_are_written(folder, monkeypatch):
    from autocast_onnx import pipeline

    real = pipeline.convert_file

    def flaky(path, *args, **kwargs):
        if Path(path).name == "a.onnx":
            raise RuntimeError("boom")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "convert_file", flaky)
    (folder / "b.onnx").write_bytes(b"not a model")  # bad input (2) beside an internal error (3): 3
    result = invoke("convert", folder, "-j", "1")
    assert result.exit_code == 3
    assert (folder / "sub" / "c.fp16.onnx").is_file() and not (folder / "a.fp16.onnx").exists()
    lines = errors(result.stderr)
    assert len(lines) == 2
    assert any(
        line.startswith(f"{PREFIX}internal error while converting {folder / 'a.onnx'}: RuntimeError: boom (")
        for line in lines
    )
    assert "1 ok, 1 error, 1 internal error" in result.stdout


def test_a_failed_validation_threshold_exits_1_and_keeps_the_models(folder):
    result = invoke(
        "convert", folder / "a.onnx", folder / "b.onnx", "--validate", "--atol", "1e-12", "--no-speed", "-j", "1"
    )
    assert result.exit_code == 1, result.stderr
    assert (folder / "a.fp16.onnx").is_file() and (folder / "b.fp16.onnx").is_file()
    assert "2 failed" in result.stdout and f"{folder / 'a.onnx'}: validation failed: y: " in result.stdout
    passed = invoke("convert", folder / "a.onnx", folder / "b.onnx", "--validate", "--no-speed", "-j", "1")
    assert passed.exit_code == 0 and "2 ok" in passed.stdout


def test_parallel_workers_give_the_same_files_and_table(folder, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    first = invoke("convert", folder, "-o", one, "-j", "1")
    second = invoke("convert", folder, "-o", two, "-j", "2")
    assert first.exit_code == second.exit_code == 0
    for path in one.rglob("*.onnx"):
        assert (two / path.relative_to(one)).read_bytes() == path.read_bytes()

    def columns(text):  # the table without the times
        return [line.split()[:-3] + line.split()[-1:] for line in text.splitlines()[1:4]]

    assert columns(first.stdout) == columns(second.stdout)
    assert sorted(line for line in second.stderr.splitlines() if line.startswith("[")) != []


@pytest.mark.parametrize("dies", ["b.onnx", "c.onnx"])  # with a model left to convert, and the last one
def test_a_worker_that_dies_is_an_internal_error_of_its_model(folder, monkeypatch, dies):
    from autocast_onnx import pipeline

    real = pipeline.convert_file

    def crash(path, *args, **kwargs):
        if Path(path).name == dies:
            os._exit(9)  # as a native crash would end the worker: no answer
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "convert_file", crash)
    result = invoke("convert", folder, "-j", "2")
    assert result.exit_code == 3
    (line,) = errors(result.stderr)
    model = next(folder.rglob(dies))
    assert f"internal error while converting {model}: its worker process ended (exit code 9)" in line
    written = sorted(p.name for p in folder.rglob("*.fp16.onnx"))
    assert written == sorted(n.replace(".onnx", ".fp16.onnx") for n in {"a.onnx", "b.onnx", "c.onnx"} - {dies})
    assert "2 ok, 1 internal error" in result.stdout


def test_a_folder_converted_again_skips_the_earlier_outputs_with_a_warning(folder):
    assert invoke("convert", folder, "-j", "1").exit_code == 0
    again = invoke("convert", folder, "-j", "1")
    assert again.exit_code == 0
    assert "autocast-onnx: warning: skipped 3 file(s) named like converted models" in again.stderr
    assert not list(folder.rglob("*.fp16.fp16.onnx"))


def test_options_of_one_model_are_refused_with_several(folder, tmp_path):
    result = invoke("convert", folder, "--plan-out", tmp_path / "p.json")
    assert result.exit_code == 2
    assert errors(result.stderr) == [
        f"{PREFIX}{folder}: --plan-out has no effect with a directory of models: it names a file of one model "
        "(convert that model on its own to use them)"
    ]
    assert not (folder / "a.fp16.onnx").exists()


def test_one_model_output_is_unchanged_and_jobs_says_it_does_nothing(folder, tmp_path):
    plain = invoke("convert", folder / "a.onnx", "-o", tmp_path / "x.onnx")
    assert plain.exit_code == 0 and plain.stdout.startswith(f"{folder / 'a.onnx'} -> {tmp_path / 'x.onnx'}: converted")
    assert plain.stderr == ""
    with_jobs = invoke("convert", folder / "a.onnx", "-o", tmp_path / "y.onnx", "-j", "2")
    assert with_jobs.exit_code == 0
    assert (
        with_jobs.stderr
        == "autocast-onnx: warning: -j has no effect with one model: it sets how many models are worked on at once\n"
    )


def test_lint_of_several_models_shows_progress_at_a_terminal(folder, monkeypatch):
    """At a terminal lint counts the models done on stderr; elsewhere its stderr holds error lines only."""
    assert not [line for line in invoke("lint", folder, "-j", "1").stderr.splitlines() if line.startswith("[")]
    monkeypatch.setattr(batch, "interactive", lambda: True)
    result = invoke("lint", folder, "--format", "json", "-j", "1")
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert progress == [f"[{k}/3] {folder / n} ok" for k, n in enumerate(("a.onnx", "b.onnx", "sub/c.onnx"), 1)]
    assert json.loads(result.stdout)["models"]  # the report keeps stdout to itself
    single = invoke("lint", folder / "a.onnx", "--format", "json")
    assert "[1/1]" not in single.stderr


def test_lint_in_parallel_gives_the_report_of_one_process(folder):
    shutil.copy(folder / "a.onnx", folder / "d.onnx")
    first = invoke("lint", folder, "--format", "json", "-j", "1")
    second = invoke("lint", folder, "--format", "json", "-j", "2")
    assert first.exit_code == second.exit_code
    assert json.loads(first.stdout) == json.loads(second.stdout)
    assert [m["path"] for m in json.loads(second.stdout)["models"]] == [
        str(folder / n) for n in ("a.onnx", "b.onnx", "d.onnx", "sub/c.onnx")
    ]


def test_lint_reports_an_unexpected_failure_of_one_model_and_lints_the_others(folder, monkeypatch):
    from autocast_onnx import lint as lint_package
    from autocast_onnx.lint import engine

    real = engine.lint

    def flaky(path, options=None):
        if Path(path).name == "a.onnx":
            raise RuntimeError("boom")
        return real(path, options)

    monkeypatch.setattr(lint_package, "lint", flaky)
    result = invoke("lint", folder, "--format", "json", "-j", "1")
    assert result.exit_code == 3
    assert [m["path"] for m in json.loads(result.stdout)["models"]] == [
        str(folder / "b.onnx"),
        str(folder / "sub/c.onnx"),
    ]
    (line,) = errors(result.stderr)
    assert line.startswith(f"{PREFIX}internal error while linting {folder / 'a.onnx'}: RuntimeError: boom")
