"""Input files that are not files, and --save-inputs onto what is not one (issue 36, defect 6).

Given as the `--inputs` path itself, a FIFO or a device was refused (in the words "inputs path
not found"), but inside an inputs folder any entry named *.npz or *.json was opened as it was:
a FIFO made the command wait for a writer for ever, and a symlink to /dev/zero was read until
memory ran out. Now every file read from an inputs folder, in any format the folder form
takes, goes through the check the path itself gets (io.check_regular before, io.open_regular
on the open descriptor, so a file swapped for a FIFO in between is refused too), with one line
naming the file and what it is. The same goes for --calibration-data, which reads the same
forms, and for the one input file of a training step.

`--save-inputs` wrote a temporary and renamed it over the path: a FIFO or a character device
given to it was replaced by a regular file (a socket, through the Python API, too), and a path
ending in '/' was written as a file of that name, or over an existing file of that name. Now it
is written as every other output is (tests/io/test_outputs.py): a FIFO or character device in
place, never replaced; a socket, a block device or a folder refused; a path ending in '/'
refused for naming a folder.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, isolated_cwd, run_process
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate import inputs as inputs_module
from autocast_onnx.validate import polygraphy_json

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")

isolated = pytest.fixture(autouse=True)(isolated_cwd)

NOT_REGULAR = "not a regular file"


@pytest.fixture
def model(tmp_path) -> Path:
    """x float[2,8] -> MatMul -> y: validated against itself (no conversion needed)."""
    path = tmp_path / "m.onnx"
    onnx.save(parse("g (float[2,8] x) => (float[2,8] y) { [fc] y = MatMul(x, w) }", w=randn([8, 8])), path)
    return path


def batch(seed: int = 0) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)}


def write_batch(path: Path, seed: int = 0) -> Path:
    """One batch for `model`, as an .npz or (by its name) Polygraphy's JSON input file."""
    if polygraphy_json.is_json(path):
        path.write_text(polygraphy_json.encode([batch(seed)]))
    else:
        np.savez(path, **batch(seed))
    return path


def validate_argv(model: Path, *extra) -> list:
    return ["validate", model, model, "--no-speed", "-q", *extra]


class Unblock:
    """While inside, opens the FIFO for writing and closes it again every second (after the
    first), so a command that wrongly opened it for reading sees an empty file and fails the
    test instead of waiting for ever."""

    def __init__(self, fifo: Path):
        self.fifo = fifo
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(1):
            try:
                os.close(os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK))  # Linux: no reader needed
            except OSError:
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


# ---- files inside an inputs folder -------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".json"])
@pytest.mark.parametrize("flag", ["--inputs", "--calibration-data"])
def test_a_fifo_in_an_inputs_folder_is_refused_not_waited_on(model, tmp_path, suffix, flag):
    folder = tmp_path / "batches"
    folder.mkdir()
    write_batch(folder / f"0{suffix}")
    fifo = folder / f"1{suffix}"
    os.mkfifo(fifo)
    if flag == "--inputs":
        argv = validate_argv(model, "--inputs", folder)
    else:
        argv = ["convert", model, "-o", tmp_path / "o.onnx", "-q", "--calibration-data", folder]
    with Unblock(fifo):
        outcome = invoke(argv)
    assert_one_error(outcome, f"{fifo}: is a FIFO, {NOT_REGULAR}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not (tmp_path / "o.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_a_symlink_to_dev_zero_in_an_inputs_folder_is_refused_not_read(model, tmp_path, suffix):
    """In a real process under a 4 GiB address-space limit: reading /dev/zero would never end."""
    folder = tmp_path / "batches"
    folder.mkdir()
    write_batch(folder / f"0{suffix}")
    (folder / f"1{suffix}").symlink_to("/dev/zero")
    outcome = run_process(validate_argv(model, "--inputs", folder), preexec_fn=limit_memory, timeout=120)
    assert_one_error(outcome, f"{folder / f'1{suffix}'}: is a character device, {NOT_REGULAR}")


def test_a_folder_named_like_a_batch_in_an_inputs_folder_is_refused(model, tmp_path):
    folder = tmp_path / "batches"
    (folder / "1.npz").mkdir(parents=True)
    write_batch(folder / "0.npz")
    assert_one_error(invoke(validate_argv(model, "--inputs", folder)), f"{folder / '1.npz'}: is a directory")


def test_a_symlink_to_a_regular_file_in_an_inputs_folder_is_read(model, tmp_path):
    """The check refuses what is not a regular file, not links: a link to a batch is a batch."""
    folder = tmp_path / "batches"
    folder.mkdir()
    write_batch(folder / "0.npz")
    (folder / "1.npz").symlink_to(write_batch(tmp_path / "elsewhere.npz", seed=1))
    report = tmp_path / "r.json"
    assert_ok(invoke(validate_argv(model, "--inputs", folder, "--report-json", report)))
    assert json.loads(report.read_text())["inputs"]["batches"] == 2


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_an_inputs_path_that_is_not_a_file_says_what_it_is(model, tmp_path, kind):
    """Refused before too, but as "inputs path not found", which it is not."""
    path = Path("/dev/zero") if kind == "/dev/zero" else tmp_path / "in.npz"
    if kind == "fifo":
        os.mkfifo(path)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert_one_error(invoke(validate_argv(model, "--inputs", path)), f"{path}: is {what}, {NOT_REGULAR}")


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_the_input_file_of_a_training_step_may_not_be_a_fifo(tmp_path, suffix):
    """load_arrays (validate's training step, --inputs FILE) opened a FIFO and waited."""
    fifo = tmp_path / f"step{suffix}"
    os.mkfifo(fifo)
    with Unblock(fifo), pytest.raises(AutocastError, match="is a FIFO, not a regular file"):
        inputs_module.load_arrays(fifo)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_a_file_swapped_for_a_fifo_after_its_check_is_refused_when_opened(model, tmp_path, monkeypatch, suffix):
    """The race between looking at a file and opening it: the file is a batch when it is
    looked at, and a FIFO when it is opened. It is opened without waiting and refused on what
    the open descriptor is, never read."""
    from autocast_onnx import io as io_module

    path = write_batch(tmp_path / f"in{suffix}")
    real_check = io_module.check_regular

    def check_then_swap(where, hint):
        real_check(where, hint)
        if Path(where) == path and path.is_file():
            path.unlink()
            os.mkfifo(path)

    monkeypatch.setattr(io_module, "check_regular", check_then_swap)
    specs = inputs_module.describe_inputs(onnx.load(model))
    with Unblock(path), pytest.raises(AutocastError, match=f"{path}: is a FIFO, not a regular file"):
        inputs_module.load_batches(path, specs)


# ---- --save-inputs -----------------------------------------------------------------------------


class FifoReader:
    """A FIFO, read to its end by a thread (so the writer does not wait)."""

    def __init__(self, path: Path):
        self.path = path
        os.mkfifo(path)
        self.data = b""
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        with open(self.path, "rb") as fh:
            self.data = fh.read()

    def close(self) -> bytes:
        self.thread.join(0.5)
        if self.thread.is_alive():  # never opened for writing: let the reader see an end
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
            self.thread.join(20)
        return self.data


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_save_inputs_into_a_fifo_writes_it_in_place(model, tmp_path, suffix):
    plain = tmp_path / f"plain{suffix}"
    assert_ok(invoke(validate_argv(model, "--seed", "3", "--save-inputs", plain)))
    reader = FifoReader(tmp_path / f"pipe{suffix}")
    outcome = invoke(validate_argv(model, "--seed", "3", "--save-inputs", reader.path))
    data = reader.close()
    assert_ok(outcome)
    assert stat.S_ISFIFO(os.lstat(reader.path).st_mode), "the FIFO was replaced"
    if suffix == ".json":
        assert data == plain.read_bytes()  # what a regular file gets, byte for byte
    else:  # the same arrays (an archive's bytes hold the time it was written)
        copy = tmp_path / "copy.npz"
        copy.write_bytes(data)
        with np.load(copy) as got, np.load(plain) as want:
            assert sorted(got) == sorted(want) == ["x"]
            np.testing.assert_array_equal(got["x"], want["x"])
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # no temporary beside it


def test_save_inputs_into_a_character_device_leaves_it_a_device(model, tmp_path):
    """A character device of the null device's numbers, made in the test's folder (mknod needs
    privileges; never /dev/null itself, which the unfixed code would have replaced)."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a character device here: {exc}")
    assert_ok(invoke(validate_argv(model, "--save-inputs", device)))
    assert stat.S_ISCHR(os.lstat(device).st_mode), "the device was replaced by a file"


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ("missing/", "output folder does not exist (the path ends in a separator)"),
        ("file.npz/", "output path ends in a separator but is not a folder"),
        ("folder/", "output path is a folder"),
    ],
)
def test_save_inputs_ending_in_a_separator_is_refused(model, tmp_path, given, fragment):
    """'missing/' used to create a file named 'missing', and 'file.npz/' replaced file.npz."""
    (tmp_path / "file.npz").write_bytes(b"keep")
    (tmp_path / "folder").mkdir()
    before = sorted(os.listdir(tmp_path))
    outcome = invoke(validate_argv(model, "--save-inputs", f"{tmp_path}/{given}"))
    assert_one_error(outcome, fragment, "--save-inputs")
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "folder") == []
    assert (tmp_path / "file.npz").read_bytes() == b"keep"


def test_save_inputs_of_the_python_api_is_held_to_the_same_rules(model, tmp_path):
    """The API has no up-front output checks: the write refuses a path ending in '/' and a
    socket (which it used to replace by a file)."""
    with pytest.raises(AutocastError, match="output folder does not exist"):
        autocast_onnx.validate(model, model, save_inputs=f"{tmp_path}/missing/")
    assert not (tmp_path / "missing").exists()
    holder = socket.socket(socket.AF_UNIX)
    path = tmp_path / "s.npz"
    holder.bind(str(path))
    try:
        with pytest.raises(AutocastError, match="output path is a socket"):
            autocast_onnx.validate(model, model, save_inputs=path)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        holder.close()


def test_save_inputs_to_a_regular_file_leaves_no_temporary(model, tmp_path):
    """The regular case, written atomically as every output is (the temporaries are named as
    the others', `.NAME.autocast-tmp.*`, which a later save removes when a killed run left one)."""
    saved = tmp_path / "in.npz"
    saved.write_bytes(b"old")
    assert_ok(invoke(validate_argv(model, "--save-inputs", saved)))
    with np.load(saved) as data:
        assert sorted(data) == ["x"] and data["x"].shape == (2, 8)
    assert sorted(os.listdir(tmp_path)) == ["cwd", "in.npz", "m.onnx"]
