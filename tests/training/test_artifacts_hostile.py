"""Hostile layouts of an onnxruntime-training artifacts folder and of its -o folder (issue 26):
an -o that holds, equals or sits in the input, an earlier output with foreign files in it,
symlinks that leave the folder, symlink loops, FIFOs and sockets, an -o that is a symlink, and
runs that fail half-way. Each refusal is one error line and exit 2, the input stays
byte-identical and nothing else appears or disappears (a snapshot of the whole tmp folder)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import bad_input_helpers
import numpy as np
import onnx
import pytest
from bad_input_helpers import ROOT, assert_one_error, invoke, run_process, snapshot
from onnx import numpy_helper

from autocast_onnx.errors import AutocastError

ARTIFACTS = ROOT / "tests" / "data" / "training"
MANIFEST = "autocast-manifest.json"
SECRET = b"the secret outside the folder\n"


@pytest.fixture
def src(tmp_path) -> Path:
    """A copy of the mlp artifacts folder, with a secret file beside it (outside it)."""
    folder = tmp_path / "mlp"
    shutil.copytree(ARTIFACTS / "mlp", folder)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    return folder


def earlier_output(src: Path, out: Path) -> dict:
    """Convert `src` into `out` (a real earlier output); returns the snapshot of `out`."""
    outcome = invoke(["convert", src, "-o", out, "-q"])
    assert outcome.code == 0, outcome.stderr
    return snapshot(out)


def refused(tmp_path: Path, args, *fragments) -> str:
    """Run the CLI, assert the one-line refusal and that nothing under tmp_path changed."""
    before = snapshot(tmp_path)
    line = assert_one_error(invoke(args), *fragments)
    assert snapshot(tmp_path) == before
    return line


def no_secret_anywhere(root: Path) -> None:
    for path in root.rglob("*"):
        if path.name != "secret.txt" and path.is_file() and not path.is_symlink():
            assert SECRET not in path.read_bytes(), path


# ---- -o and the input ---------------------------------------------------------------------------


def test_an_earlier_output_that_holds_the_input_is_refused_not_deleted(tmp_path, src):
    out = tmp_path / "out"
    earlier_output(src, out)
    inner = out / "mlp"
    shutil.copytree(ARTIFACTS / "mlp", inner)
    (out / "notes.txt").write_text("mine")
    refused(tmp_path, ["convert", inner, "-o", out], "holds the artifacts folder")


def test_an_output_holding_the_input_is_refused_even_with_only_manifested_entries(tmp_path, src):
    # the input's name is listed in the manifest, so only the containment check can refuse it
    out = tmp_path / "out"
    shutil.copytree(ARTIFACTS / "mlp", out / "mlp")
    (out / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {"mlp": {}}}))
    refused(tmp_path, ["convert", out / "mlp", "-o", out], "holds the artifacts folder")


def test_dot_output_in_the_folder_holding_the_input_is_refused(tmp_path, src, monkeypatch):
    (tmp_path / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {}}))
    monkeypatch.chdir(tmp_path)
    refused(tmp_path, ["convert", "mlp", "-o", "."], "holds the artifacts folder")


@pytest.mark.slow
def test_dot_output_in_the_folder_holding_the_input_in_a_real_process(tmp_path, src):
    (tmp_path / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {}}))
    before = snapshot(tmp_path)
    assert_one_error(run_process(["convert", "mlp", "-o", "."], cwd=tmp_path, timeout=60), "holds the artifacts folder")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "spell, fragment",
    [
        ("alias/mlp", "is the artifacts folder or inside it"),  # the input itself, through a folder symlink
        ("alias/mlp/sub", "is the artifacts folder or inside it"),
        ("alias", "holds the artifacts folder"),  # tmp_path itself (it holds a manifest below)
        ("mlp/..", "holds the artifacts folder"),
    ],
)
def test_an_output_equal_to_inside_or_holding_the_input_through_links_is_refused(tmp_path, src, spell, fragment):
    (tmp_path / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {}}))
    (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
    refused(tmp_path, ["convert", src, "-o", str(tmp_path) + "/" + spell], fragment)


def test_the_input_given_through_a_link_into_the_output_is_refused(tmp_path, src):
    out = tmp_path / "out"
    shutil.copytree(ARTIFACTS / "mlp", out / "mlp")
    (out / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {"mlp": {}}}))
    (tmp_path / "inlink").symlink_to(out / "mlp", target_is_directory=True)
    refused(tmp_path, ["convert", tmp_path / "inlink", "-o", out], "holds the artifacts folder")


def test_emulate_refuses_an_output_holding_its_input(tmp_path, src):
    (tmp_path / MANIFEST).write_text(json.dumps({"tool": "autocast-onnx", "files": {}}))
    refused(tmp_path, ["emulate", src, "-o", tmp_path], "holds the artifacts folder")


# ---- replacing an earlier output ---------------------------------------------------------------


def test_an_earlier_output_with_a_file_its_manifest_does_not_list_is_refused(tmp_path, src):
    out = tmp_path / "out"
    earlier_output(src, out)
    (out / "notes.txt").write_text("mine")
    refused(tmp_path, ["convert", src, "-o", out], "'notes.txt'", "does not list")


@pytest.mark.parametrize("text", ["not json", "[]", '{"files": []}', '{"tool": "autocast-onnx"}'])
def test_an_output_whose_manifest_is_not_ours_is_refused(tmp_path, src, text):
    out = tmp_path / "out"
    earlier_output(src, out)
    (out / MANIFEST).write_text(text)
    refused(tmp_path, ["convert", src, "-o", out], MANIFEST)


def test_an_earlier_output_is_replaced_and_nothing_is_left_beside_it(tmp_path, src):
    out = tmp_path / "out"
    earlier_output(src, out)
    before = snapshot(src)
    outcome = invoke(["convert", src, "-o", out, "--loss-scale", "512", "-q"])
    assert outcome.code == 0, outcome.stderr
    assert json.loads((out / MANIFEST).read_text())["loss_scale"]["mode"] == "512"
    assert snapshot(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp", "out", "secret.txt"]
    # the folder gets the usual permissions (not the owner-only ones of a temporary folder)
    assert (out.stat().st_mode & 0o777) == (0o777 & ~_umask())


def _with_subfolders(src: Path) -> None:
    (src / "sub" / "deeper" / "empty").mkdir(parents=True)
    (src / "sub" / "notes.txt").write_text("kept")
    (src / "sub" / "deeper" / "more.txt").write_text("kept too")
    (src / "sub" / "deeper" / "link").symlink_to("../notes.txt")


def test_the_manifest_lists_every_entry_of_a_copied_folder(tmp_path, src):
    _with_subfolders(src)
    out = tmp_path / "out"
    earlier_output(src, out)
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert files["sub"] == {
        "action": "copied unchanged",
        "contents": ["deeper", "deeper/empty", "deeper/link", "deeper/more.txt", "notes.txt"],
    }
    assert files["checkpoint"] == {"action": "copied unchanged"}  # a file's entry is as before
    # the second run replaces the first: everything in it is listed, at every depth
    outcome = invoke(["convert", src, "-o", out, "-q"])
    assert outcome.code == 0, outcome.stderr


@pytest.mark.parametrize(
    "added", ["sub/mine.txt", "sub/deeper/mine.txt", "sub/deeper/empty/mine.txt", "sub/deeper/mine/"]
)
def test_an_earlier_output_with_an_entry_added_in_a_copied_folder_is_refused(tmp_path, src, added):
    _with_subfolders(src)
    out = tmp_path / "out"
    earlier_output(src, out)
    if added.endswith("/"):
        (out / added).mkdir()
    else:
        (out / added).write_text("mine")
    refused(tmp_path, ["convert", src, "-o", out], f"'{added.rstrip('/')}'", "does not list")


def test_an_earlier_output_whose_listed_file_became_a_folder_is_refused(tmp_path, src):
    _with_subfolders(src)
    out = tmp_path / "out"
    earlier_output(src, out)
    (out / "sub" / "notes.txt").unlink()
    (out / "sub" / "notes.txt").mkdir()
    (out / "sub" / "notes.txt" / "mine").write_text("mine")
    refused(tmp_path, ["convert", src, "-o", out], "'sub/notes.txt/mine'", "does not list")


def _as_written_before(out: Path) -> None:
    """Rewrite the manifest of `out` as the command wrote it before it listed folders' contents."""
    manifest = json.loads((out / MANIFEST).read_text())
    for entry in manifest["files"].values():
        entry.pop("contents", None)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def test_an_earlier_output_with_an_older_manifest_is_replaced_when_its_folders_match_the_input(tmp_path, src):
    _with_subfolders(src)
    out = tmp_path / "out"
    earlier_output(src, out)
    _as_written_before(out)
    outcome = invoke(["convert", src, "-o", out, "-q"])
    assert outcome.code == 0, outcome.stderr
    assert "contents" in json.loads((out / MANIFEST).read_text())["files"]["sub"]


@pytest.mark.parametrize("change", ["added", "kind"])
def test_an_earlier_output_with_an_older_manifest_and_a_foreign_entry_in_a_folder_is_refused(tmp_path, src, change):
    _with_subfolders(src)
    out = tmp_path / "out"
    earlier_output(src, out)
    _as_written_before(out)
    if change == "added":
        (out / "sub" / "deeper" / "mine.txt").write_text("mine")
        name = "sub/deeper/mine.txt"
    else:  # same name as the input's entry, another kind: not what the earlier run copied
        (out / "sub" / "deeper" / "empty").rmdir()
        (out / "sub" / "deeper" / "empty").write_text("mine")
        name = "sub/deeper/empty"
    refused(tmp_path, ["convert", src, "-o", out], f"'{name}'", "does not list")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- symlinks in the input ---------------------------------------------------------------------


def _link_file_top(src: Path, tmp: Path) -> str:
    (src / "leak").symlink_to(tmp / "secret.txt")
    return "leak"


def _link_dir_top(src: Path, tmp: Path) -> str:
    (tmp / "outside").mkdir()
    (tmp / "outside" / "secret.txt").write_bytes(SECRET)
    (src / "extra").symlink_to(tmp / "outside", target_is_directory=True)
    return "extra"


def _link_deep(src: Path, tmp: Path) -> str:
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "sub" / "deeper" / "leak").symlink_to("../../../secret.txt")
    return "sub/deeper/leak"


def _link_as_checkpoint(src: Path, tmp: Path) -> str:
    (tmp / "secret.txt").write_bytes((src / "checkpoint").read_bytes())
    (src / "checkpoint").unlink()
    (src / "checkpoint").symlink_to(tmp / "secret.txt")
    return "checkpoint"


def _link_as_model(src: Path, tmp: Path) -> str:
    (tmp / "model.onnx").write_bytes((src / "eval_model.onnx").read_bytes())
    (src / "eval_model.onnx").unlink()
    (src / "eval_model.onnx").symlink_to(tmp / "model.onnx")
    return "eval_model.onnx"


@pytest.mark.parametrize("make", [_link_file_top, _link_dir_top, _link_deep, _link_as_checkpoint, _link_as_model])
def test_a_symlink_leading_out_of_the_folder_is_refused(tmp_path, src, make):
    name = make(src, tmp_path)
    line = refused(tmp_path, ["convert", src, "-o", tmp_path / "out"], "outside the artifacts folder")
    assert str(src / name) in line
    no_secret_anywhere(tmp_path)


@pytest.mark.parametrize("make", ["loop", "dangling", "self"])
def test_a_symlink_loop_or_dangling_symlink_is_refused(tmp_path, src, make):
    if make == "loop":
        (src / "a").symlink_to("b")
        (src / "b").symlink_to("a")
    elif make == "dangling":
        (src / "a").symlink_to("nowhere")
    else:
        (src / "a").symlink_to("a")
    refused(tmp_path, ["convert", src, "-o", tmp_path / "out"], str(src / "a"), "leads nowhere")


def test_a_symlink_inside_the_folder_is_copied_as_a_relative_symlink(tmp_path, src):
    (src / "sub").mkdir()
    (src / "sub" / "notes.txt").write_text("kept")
    (src / "relative").symlink_to("sub/notes.txt")
    (src / "absolute").symlink_to(src / "sub" / "notes.txt")  # into the input: must not stay so
    (src / "sub" / "up").symlink_to("..", target_is_directory=True)  # the folder itself: no recursion
    (src / "ckpt").symlink_to(src / "checkpoint")
    before = snapshot(src)
    out = tmp_path / "out"
    outcome = invoke(["convert", src, "-o", out, "-q"])
    assert outcome.code == 0, outcome.stderr
    assert snapshot(src) == before
    assert os.readlink(out / "relative") == "sub/notes.txt"
    assert os.readlink(out / "absolute") == "sub/notes.txt"
    assert os.readlink(out / "sub" / "up") == ".."
    assert os.readlink(out / "ckpt") == "checkpoint"
    assert (out / "absolute").read_text() == "kept"
    for link in ("relative", "absolute", "ckpt", "sub/up"):
        assert Path(os.path.realpath(out / link)).is_relative_to(out.resolve()), link
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert {"relative", "absolute", "ckpt", "sub"} <= set(files)


def test_a_models_external_data_is_the_converted_one_not_a_copy_of_the_input(tmp_path, src):
    (src / "eval_model.onnx").unlink()
    bad_input_helpers.external_model(src, name="eval_model.onnx", location="eval_model.onnx.data")
    source = onnx.load(str(src / "eval_model.onnx"))
    out = tmp_path / "out"
    for _ in range(2):  # the second run replaces the first: every file it wrote is in its manifest
        outcome = invoke(["convert", src, "-o", out, "-q"])
        assert outcome.code == 0, outcome.stderr
    converted = onnx.load(str(out / "eval_model.onnx"))
    for before, after in zip(source.graph.initializer, converted.graph.initializer, strict=True):
        assert after.data_type == onnx.TensorProto.FLOAT16
        np.testing.assert_allclose(numpy_helper.to_array(after), numpy_helper.to_array(before), atol=1e-3)
    files = json.loads((out / MANIFEST).read_text())["files"]
    assert files["eval_model.onnx.data"]["action"].startswith("written with eval_model.onnx")


# ---- special files -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("where", ["fifo", "sub/fifo", "eval_model.onnx", "autocast-manifest.json"])
def test_a_fifo_in_the_folder_is_refused_without_opening_it(tmp_path, src, where):
    (src / "sub").mkdir()
    (src / "eval_model.onnx").unlink(missing_ok=where != "eval_model.onnx")
    os.mkfifo(src / where)
    before = snapshot(tmp_path)
    # a real process with a timeout: opening the FIFO would block forever
    outcome = run_process(["convert", src, "-o", tmp_path / "out"], timeout=60)
    assert_one_error(outcome, str(src / where), "FIFO")
    assert snapshot(tmp_path) == before


def test_a_socket_in_the_folder_is_refused(tmp_path, src, monkeypatch):
    monkeypatch.chdir(src)  # a relative name: socket paths are limited to ~100 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        refused(tmp_path, ["convert", src, "-o", tmp_path / "out"], str(src / "sock"), "socket")


# ---- -o through a symlink ----------------------------------------------------------------------


def test_an_output_that_is_a_symlink_to_an_earlier_output_is_refused(tmp_path, src):
    earlier_output(src, tmp_path / "out")
    (tmp_path / "link").symlink_to(tmp_path / "out", target_is_directory=True)
    refused(tmp_path, ["convert", src, "-o", tmp_path / "link"], "symbolic link")


@pytest.mark.parametrize("target", ["empty", "nowhere"])
def test_an_output_that_is_a_symlink_to_an_empty_folder_or_nowhere_is_refused(tmp_path, src, target):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / target)
    refused(tmp_path, ["convert", src, "-o", tmp_path / "link"], "symbolic link")


# ---- failures half-way -------------------------------------------------------------------------


def _fail_on_eval(monkeypatch, exc):
    import autocast_onnx.pipeline as pipeline

    real = pipeline.convert_file

    def fake(source, target, **kw):
        if Path(source).name == "eval_model.onnx":
            raise exc
        return real(source, target, **kw)

    monkeypatch.setattr(pipeline, "convert_file", fake)


@pytest.mark.parametrize("exc, code", [(AutocastError("bad model", "eval_model.onnx"), 2), (KeyboardInterrupt(), 130)])
def test_a_failed_run_leaves_the_earlier_output_and_no_staging_folder(tmp_path, src, monkeypatch, exc, code):
    out = tmp_path / "out"
    earlier_output(src, out)
    before = snapshot(tmp_path)
    _fail_on_eval(monkeypatch, exc)
    outcome = invoke(["convert", src, "-o", out, "--loss-scale", "512"])
    assert outcome.code == code, outcome.stderr
    assert snapshot(tmp_path) == before


def test_a_failed_rename_into_place_restores_the_earlier_output(tmp_path, src, monkeypatch):
    out = tmp_path / "out"
    earlier_output(src, out)
    before = snapshot(tmp_path)
    real_rename = os.rename

    def rename(a, b, *args, **kw):
        if Path(b) == out and Path(a).name.startswith(".out.") and not Path(a).name.endswith(".old"):
            raise OSError(28, "No space left on device")
        return real_rename(a, b, *args, **kw)

    monkeypatch.setattr(os, "rename", rename)
    assert_one_error(invoke(["convert", src, "-o", out, "--loss-scale", "512"]), "No space left on device")
    assert snapshot(tmp_path) == before


def test_a_write_error_while_copying_is_one_line_and_leaves_nothing(tmp_path, src, monkeypatch):
    (src / "big.bin").write_bytes(b"x" * 1000)
    import shutil as shutil_module

    def copyfileobj(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil_module, "copyfileobj", copyfileobj)
    monkeypatch.setattr(shutil_module, "copyfile", copyfileobj)
    refused(tmp_path, ["convert", src, "-o", tmp_path / "out"], "No space left on device")


def _fail_in_summary(monkeypatch, exc):
    """Make the command fail after its folder is renamed into place: while it prints the summary."""
    import autocast_onnx.report as report

    def summary(*a, **kw):
        raise exc

    monkeypatch.setattr(report, "conversion_summary", summary)


@pytest.mark.parametrize("earlier", [True, False], ids=["over_an_earlier_output", "new_folder"])
@pytest.mark.parametrize(
    "exc, code", [(RuntimeError("boom"), 3), (AutocastError("bad", "x"), 2), (KeyboardInterrupt(), 130)]
)
def test_a_failure_after_the_rename_removes_the_new_folder_whole(tmp_path, src, monkeypatch, earlier, exc, code):
    # all or nothing: the new folder goes whole (not just its manifest) and the earlier output comes back
    out = tmp_path / "out"
    if earlier:
        earlier_output(src, out)
    before = snapshot(tmp_path)
    _fail_in_summary(monkeypatch, exc)
    outcome = invoke(["convert", src, "-o", out, "--loss-scale", "512"])
    assert outcome.code == code, outcome.stderr
    assert snapshot(tmp_path) == before
    if earlier:  # and it is still replaceable
        monkeypatch.undo()
        assert invoke(["convert", src, "-o", out, "-q"]).code == 0


@pytest.mark.slow
def test_a_closed_stdout_after_the_rename_keeps_the_new_folder_whole(tmp_path, src):
    # the reader of stdout stopped before the summary: a success, as for a model file; the folder
    # stays complete (a real process: its stdout is a pipe whose read end is closed)
    out = tmp_path / "out"
    earlier_output(src, out)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autocast_onnx", "convert", str(src), "-o", str(out), "--loss-scale", "512"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / MANIFEST).read_text())["loss_scale"]["mode"] == "512"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp", "out", "secret.txt"]


# ---- the snapshot helper ----------------------------------------------------------------------


def test_snapshot_records_special_files_by_kind_without_opening_them(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_text("x")
    os.mkfifo(tmp_path / "sub" / "fifo")
    (tmp_path / "link").symlink_to("sub", target_is_directory=True)
    (tmp_path / "dangling").symlink_to("nowhere")
    real_sha = bad_input_helpers.sha

    def sha(path):  # opening a FIFO would block: only regular files may be read
        assert stat.S_ISREG(os.lstat(path).st_mode), path
        return real_sha(path)

    monkeypatch.setattr(bad_input_helpers, "sha", sha)
    monkeypatch.chdir(tmp_path)  # a relative name: socket paths are limited to ~100 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sub/sock")
        assert snapshot(tmp_path) == {
            "sub": "dir",
            "link": "link -> sub",
            "dangling": "link -> nowhere",
            "sub/file": real_sha(tmp_path / "sub" / "file"),
            "sub/fifo": "fifo",
            "sub/sock": "socket",
        }
