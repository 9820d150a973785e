"""Outputs against a hostile file system: a FIFO where the external data file goes, the stale
temporaries a killed run leaves, an output spelled as a folder ('out/'), an external data file
with nothing to hold (and a stale one from an earlier run), and .npz inputs that inflate far
beyond their size on disk.

Tests run as root: no FIFO made here is opened by the test without O_NONBLOCK, so a regression
that writes into one cannot hang the test (the write is seen instead).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from bad_input_helpers import (
    assert_ok,
    assert_one_error,
    external_model,
    invoke,
    isolated_cwd,
    small_model,
    snapshot,
    write_model,
)
from helpers import F32, init, model, tensor
from onnx import helper

import autocast_onnx.io as aio
import autocast_onnx.validate.inputs as inputs
from autocast_onnx.errors import AutocastError

isolated = pytest.fixture(autouse=True)(isolated_cwd)


@pytest.fixture
def m(tmp_path) -> Path:
    return write_model(small_model(), tmp_path / "model" / "m.onnx")


@pytest.fixture
def batched(tmp_path) -> Path:
    """small_model with a symbolic batch dimension: x is [batch, 64]."""
    m = small_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    return write_model(m, tmp_path / "model" / "b.onnx")


@pytest.fixture
def out(tmp_path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


class NonBlockingFifo:
    """A FIFO with its read end held open (O_NONBLOCK): a writer never blocks, and what anything
    wrote into it can be read back."""

    def __init__(self, path: Path):
        self.path = path
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def written(self) -> bytes:
        try:
            return os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.fd)


# =============================================================================================
# 1. A FIFO (or another special file) where the external data file goes
# =============================================================================================
@pytest.mark.parametrize("external", [True, False], ids=["external_input", "plain_input"])
def test_fifo_at_the_data_file_is_refused_never_replaced(tmp_path, m, out, external):
    source = external_model(tmp_path / "ext") if external else m
    fifo = NonBlockingFifo(out / "o.onnx.data")
    try:
        before = snapshot(tmp_path)
        args = ["convert", source, "-o", out / "o.onnx"] + (["--external-data"] if not external else [])
        assert_one_error(invoke(args), "o.onnx.data", "is a FIFO", "external data must be a regular file")
        assert stat.S_ISFIFO(os.lstat(out / "o.onnx.data").st_mode), "the FIFO was replaced"
        assert fifo.written() == b"", "something was written into the FIFO"
        assert snapshot(tmp_path) == before
    finally:
        fifo.close()


def test_save_model_refuses_a_special_data_file(tmp_path, out):
    (out / "o.onnx.data").mkdir()
    with pytest.raises(AutocastError, match=r"is a directory.*must be a regular file"):
        aio.save_model(small_model(), out / "o.onnx", external_data=True)
    assert not (out / "o.onnx").exists() and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_check_outputs_refuses_a_special_data_file(out):
    os.mkfifo(out / "o.onnx.data")
    with pytest.raises(AutocastError, match="is a FIFO"):
        aio.check_outputs([("-o", out / "o.onnx")], models=["-o"])
    aio.check_outputs([("--plan-out", out / "o.onnx")], models=["-o"])  # only a model has a data file


# =============================================================================================
# 2. Stale temporaries of a killed run
# =============================================================================================
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_are_named_for_their_file_and_process(tmp_path):
    made = aio._temp_path(tmp_path, "o.onnx")
    assert made.name.startswith(f".o.onnx{aio.TEMP_MARK}") and made.name.startswith(aio.temp_prefix("o.onnx"))
    assert f"-{os.getpid()}." in made.name


def test_a_later_save_removes_the_stale_temporaries_of_dead_processes(m, out):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = dead_pid()
        stale = [
            out / (aio.temp_prefix("o.onnx", dead) + "abcd_123"),
            out / (aio.temp_prefix("o.onnx.data", dead) + "zz99zz99"),
        ]
        kept = [
            out / (aio.temp_prefix("o.onnx", sleeper.pid) + "abcd_123"),  # its process still runs
            out / (aio.temp_prefix("o.onnx", dead).replace(aio._MACHINE, "0" * 8) + "abcd_123"),  # another machine
            out / (aio.temp_prefix("other.onnx", dead) + "abcd_123"),  # another file's
            out / f".o.onnx{aio.TEMP_MARK}{aio._MACHINE}-{dead}.abcd_123.tmp",  # not our exact pattern
            out / f".o.onnx.{dead}.tmp",
        ]
        for path in stale + kept:
            path.write_bytes(b"\0" * 1000)
        assert_ok(invoke(["convert", m, "-o", out / "o.onnx"]))
        assert not [p for p in stale if p.exists()]
        assert all(p.exists() for p in kept)
        assert sorted(p.name for p in out.iterdir()) == sorted(["o.onnx", *(p.name for p in kept)])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_temporary_that_is_a_link_or_a_folder_stays(tmp_path, m, out):
    dead = dead_pid()
    target = tmp_path / "precious"
    target.write_text("keep")
    link = out / (aio.temp_prefix("o.onnx", dead) + "abcdefgh")
    link.symlink_to(target)
    folder = out / (aio.temp_prefix("o.onnx", dead) + "hgfedcba")
    folder.mkdir()
    assert_ok(invoke(["convert", m, "-o", out / "o.onnx"]))
    assert link.is_symlink() and target.read_text() == "keep" and folder.is_dir()


# =============================================================================================
# 3. Outputs spelled as folders
# =============================================================================================
def spelled(path: Path) -> str:
    return str(path) + os.sep


@pytest.mark.parametrize(
    "case",
    ["convert -o", "convert --plan-out", "validate --report-json", "lint -o", "check --sarif", "emulate -o"],
)
@pytest.mark.parametrize("state", ["missing", "folder", "file"])
def test_output_spelled_as_a_folder_is_refused(tmp_path, m, out, case, state):
    target = out / "dest"
    if state == "folder":
        target.mkdir()
    elif state == "file":
        target.write_bytes(b"keep")
    dest = spelled(target)
    args = {
        "convert -o": ["convert", m, "-o", dest],
        "convert --plan-out": ["convert", m, "-o", out / "o.onnx", "--plan-out", dest],
        "validate --report-json": ["validate", m, m, "--no-speed", "--report-json", dest],
        "lint -o": ["lint", m, "-o", dest],
        "check --sarif": ["check", m, "--no-validate", "--sarif", dest],
        "emulate -o": ["emulate", m, "-o", dest],
    }[case]
    before = snapshot(tmp_path)
    fragment = {
        "missing": "output folder does not exist",
        "folder": "output path is a folder",
        "file": "output path ends in a separator but is not a folder",
    }[state]
    assert_one_error(invoke(args), f"{target}{os.sep}: {fragment}")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["convert", "emulate"])
def test_a_folder_output_may_end_in_a_separator(tmp_path, command):
    """An onnxruntime-training artifacts folder is converted (or emulated) into the -o folder,
    which may be spelled 'new/' and is created."""
    src = tmp_path / "mlp"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "training" / "mlp", src)
    assert_ok(invoke([command, src, "-o", spelled(tmp_path / "new")]))
    assert (tmp_path / "new" / "training_model.onnx").is_file()


def test_check_outputs_reads_a_string_ending_in_a_separator_as_a_folder(out):
    with pytest.raises(AutocastError, match="output folder does not exist"):
        aio.check_outputs([("-o", str(out / "missing") + "/")])
    with pytest.raises(AutocastError, match="output path is a folder"):
        aio.check_outputs([("--plan-out", str(out) + "/")])
    aio.check_outputs([("-o", str(out / "o.onnx"))])  # a file name is fine


def test_an_input_spelled_as_a_folder_is_no_output(tmp_path, out):
    """A trailing separator marks the path it was given to, not another one with the same name."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    np.savez(folder / "b.npz", x=np.ones((2, 64), np.float32))
    m = write_model(small_model(), tmp_path / "m.onnx")
    outcome = invoke(["validate", m, m, "--no-speed", "--inputs", spelled(folder), "--report-json", out / "r.json"])
    assert_ok(outcome)
    assert (out / "r.json").is_file()


# =============================================================================================
# 4. An external data file with nothing in it
# =============================================================================================
def small_external_model(folder: Path) -> Path:
    """Two 8x8 fp32 weights (256 bytes each, under io.EXTERNAL_MIN_BYTES), stored as external data."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2"),
    ]
    weights = [init(f"w{k}", np.full((8, 8), 0.1 * k, np.float32)) for k in (1, 2)]
    small = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], weights)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(small, folder / "s.onnx", save_as_external_data=True, location="s.onnx.data", size_threshold=0)
    return folder / "s.onnx"


def inline_only(path: Path) -> onnx.ModelProto:
    loaded = onnx.load(str(path), load_external_data=False)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    return loaded


@pytest.mark.parametrize("args", [[], ["--external-data"], ["--precision", "bf16"]], ids=["auto", "forced", "bf16"])
def test_no_empty_data_file(tmp_path, out, args):
    source = small_external_model(tmp_path / "src")
    assert_ok(invoke(["convert", source, "-o", out / "o.onnx", *args]))
    assert sorted(p.name for p in out.iterdir()) == ["o.onnx"]
    inline_only(out / "o.onnx")


def test_small_external_tensors_kept_fp32_are_read_into_the_model(tmp_path, out):
    source = small_external_model(tmp_path / "src")
    assert_ok(invoke(["convert", source, "-o", out / "o.onnx", "--exclude-op", "MatMul"]))
    assert sorted(p.name for p in out.iterdir()) == ["o.onnx"]
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in inline_only(out / "o.onnx").graph.initializer}
    assert np.array_equal(weights["w2"], np.full((8, 8), 0.2, np.float32))


def test_a_stale_data_file_of_an_earlier_run_is_removed(tmp_path, m, out):
    assert_ok(invoke(["convert", m, "-o", out / "o.onnx", "--external-data"]))
    assert (out / "o.onnx.data").stat().st_size > 0
    assert_ok(invoke(["convert", m, "-o", out / "o.onnx", "--no-external-data"]))
    assert sorted(p.name for p in out.iterdir()) == ["o.onnx"]
    inline_only(out / "o.onnx")


def test_a_data_file_this_save_reads_is_never_removed(tmp_path):
    """save_model with the model's own data file as NAME.data: read in, and kept."""
    source = small_external_model(tmp_path / "src")
    loaded = onnx.load(str(source), load_external_data=False)
    data = source.with_name("s.onnx.data")
    before = data.read_bytes()
    link = tmp_path / "src" / "t.onnx.data"
    link.hardlink_to(data)
    aio.save_model(loaded, tmp_path / "src" / "t.onnx", external_data=False, source_dir=source.parent)
    assert link.read_bytes() == before and data.read_bytes() == before


# =============================================================================================
# 5. .npz inputs that inflate
# =============================================================================================
def write_forged_npz(path: Path, name: str, shape: tuple, dtype=np.float32, data_bytes: int = 0) -> None:
    """An .npz whose array `name` has a header declaring `shape`, followed by `data_bytes` of zeros."""
    from numpy.lib import format as npy

    header = {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, archive.open(f"{name}.npy", "w") as fh:
        npy.write_array_header_1_0(fh, header)
        fh.write(b"\0" * data_bytes)


@pytest.mark.parametrize("command", ["validate", "convert --calibration-data", "diagnose"])
def test_npz_that_inflates_past_the_limit_is_refused_before_loading(tmp_path, batched, out, monkeypatch, command):
    m = batched
    monkeypatch.setattr(inputs, "GENERATED_LIMIT", 2**20)  # 1 MiB: the test stays small
    data = tmp_path / "big.npz"
    np.savez_compressed(data, x=np.zeros((4100, 64), np.float32))  # just over 1 MiB of zeros, a few KB on disk
    assert data.stat().st_size < 20_000
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("np.load was reached"))
    args = {
        "validate": ["validate", m, m, "--no-speed", "--inputs", data],
        "convert --calibration-data": ["convert", m, "-o", out / "o.onnx", "--calibration-data", data],
        "diagnose": ["diagnose", m, m, "--inputs", data],
    }[command]
    before = snapshot(tmp_path)
    assert_one_error(invoke(args), "big.npz", "'x'", "[4100, 64]", "limit")
    assert snapshot(tmp_path) == before


def test_npz_whose_header_declares_more_than_it_holds(tmp_path, batched):
    m = batched
    data = tmp_path / "forged.npz"
    write_forged_npz(data, "x", (10**9, 64), data_bytes=512)
    assert_one_error(invoke(["validate", m, m, "--no-speed", "--inputs", data]), "forged.npz", "'x'", "512 bytes")


def test_npz_just_under_the_limit_loads(tmp_path, batched, monkeypatch):
    m = batched
    monkeypatch.setattr(inputs, "GENERATED_LIMIT", 2**20)
    data = tmp_path / "ok.npz"
    np.savez_compressed(data, x=np.zeros((4095, 64), np.float32))
    specs = inputs.describe_inputs(onnx.load(str(m)))
    assert inputs.load_batches(data, specs)[0]["x"].shape == (4095, 64)


def test_check_archive_size_covers_every_array(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "GENERATED_LIMIT", 2**20)
    data = tmp_path / "t.npz"
    np.savez_compressed(data, input=np.zeros((2, 2), np.float32), labels=np.zeros(2**19, np.int64))
    with pytest.raises(AutocastError, match="'labels'"):
        inputs.check_archive_size(data)
    write_forged_npz(tmp_path / "f.npz", "input", (10**6,))
    with pytest.raises(AutocastError, match="declares shape"):
        inputs.check_archive_size(tmp_path / "f.npz")


def test_temporary_name_fits_for_a_long_output_name(out):
    """The temporary for a 245-byte name (the limit is 255) is named by the name's digest."""
    name = "n" * 240 + ".onnx"
    try:
        (out / name).write_bytes(b"")
    except OSError as exc:  # pragma: no cover - a file system with a shorter limit
        assert exc.errno == errno.ENAMETOOLONG
        pytest.skip("this file system refuses 245-byte names")
    (out / name).unlink()
    aio.save_model(small_model(), out / name)
    assert [p.name for p in out.iterdir()] == [name]
