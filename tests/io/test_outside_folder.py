"""Reads outside the model's folder (issue 26, defect 4) and model paths that are not files.

Every tensor that can hold external data follows the folder rule the loader applies to the main
graph's initializers: its location must lie inside the model's folder, or the model is refused
(exit 2, one line) before anything is read. Before the fix, a Constant whose `value` was external
data was read relative to the current folder (numpy_helper.to_array without a base folder): lint,
explain and convert read a file the model does not own, used its values, and exited 0.

A model path that is not a regular file (a character device such as /dev/zero or /dev/stdin, a
FIFO, a socket) is refused too: /dev/zero was read until memory ran out, and the default output
of /dev/stdin was /dev/stdin.fp16.onnx.
"""

from __future__ import annotations

import os
import resource
import socket
import threading

import bad_input_helpers as B
import numpy as np
import onnx
import pytest
from bad_input_helpers import argv, assert_ok, assert_one_error, invoke, run_process, snapshot, write_model
from helpers import F32, model, run, tensor
from onnx import TensorProto, helper, numpy_helper

OUTSIDE = "outside the model's folder"
ALL = ["convert", "lint", "explain", "validate", "check", "diagnose"]
SMALL = np.full((2, 4), 0.5, np.float32)  # what a decoy file outside the folder holds
BEYOND_FP16 = np.array([[1e5, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], np.float32)  # the model's own values


isolated = pytest.fixture(autouse=True)(B.isolated_cwd)


def external_value(location: str, values: np.ndarray = BEYOND_FP16, name="kv") -> TensorProto:
    """A tensor whose data is external at `location` (offset 0, the whole payload)."""
    t = numpy_helper.from_array(values, name)
    length = len(t.raw_data)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def constant_mul(value: TensorProto) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Constant", [], ["k"], name="k_const", value=value),
        helper.make_node("Mul", ["x", "k"], ["y"], name="mul"),
    ]


def main_graph_model(location: str) -> onnx.ModelProto:
    """y = Mul 'mul'(x, Constant 'k_const') with the Constant's value in external data."""
    return model(constant_mul(external_value(location)), [tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])])


def if_branch_model(location: str) -> onnx.ModelProto:
    """The Constant inside the then branch of If 'gate'."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], name="t_const", value=external_value(location)),
         helper.make_node("Mul", ["x", "k"], ["t_out"], name="t_mul")],
        "then", [], [tensor("t_out", F32, [2, 4])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"], name="e_id")], "else", [], [tensor("e_out", F32, [2, 4])]
    )
    node = helper.make_node("If", ["c"], ["y"], name="gate", then_branch=then, else_branch=other)
    return model([node], [tensor("c", TensorProto.BOOL, []), tensor("x", F32, [2, 4])], [tensor("y", F32, [2, 4])])


def function_model(location: str) -> onnx.ModelProto:
    """The Constant inside the body of local function 'Scale', which node 'mul' calls."""
    body = [
        helper.make_node("Constant", [], ["k"], name="f_const", value=external_value(location)),
        helper.make_node("Mul", ["i", "k"], ["o"], name="f_mul"),
    ]
    m = model(
        [helper.make_node("Scale", ["x"], ["y"], name="mul", domain="local")],
        [tensor("x", F32, [2, 4])],
        [tensor("y", F32, [2, 4])],
        extra_opsets=[("local", 1)],
    )
    m.functions.append(helper.make_function("local", "Scale", ["i"], ["o"], body, [helper.make_opsetid("", 17)]))
    return m


BUILDERS = {"main": main_graph_model, "if_branch": if_branch_model, "function": function_model}


def hostile(tmp_path, builder, location_of):
    """(model path, the secret outside the model's folder): the secret holds the model's own
    values, so reading it would 'work'. `location_of(secret)` is what the model names."""
    folder = tmp_path / "model"
    secret = tmp_path / "secret.bin"
    secret.write_bytes(BEYOND_FP16.tobytes())
    path = write_model(BUILDERS[builder](location_of(secret)), folder / "m.onnx")
    return path, secret


def refused_without_reading(tmp_path, monkeypatch, args, secret, *fragments) -> str:
    before = snapshot(tmp_path)
    with monkeypatch.context() as mp:
        spy = B.OpenSpy(mp)
        outcome = invoke(args)
    assert not spy.opened(secret), f"{secret} was opened"
    line = assert_one_error(outcome, *fragments)
    assert snapshot(tmp_path) == before
    return line


def command_argv(command, path, out, node="mul"):
    if command == "diagnose":
        return ["diagnose", path, path, "--report-json", out / "r.json"]
    return argv(command, path, out, node=node)


@pytest.mark.parametrize("command", ALL)
def test_constant_value_at_dotdot_is_refused_unread(tmp_path, monkeypatch, command):
    path, secret = hostile(tmp_path, "main", lambda s: "../secret.bin")
    out = tmp_path / "out"
    out.mkdir()
    line = refused_without_reading(tmp_path, monkeypatch, command_argv(command, path, out), secret, OUTSIDE, "m.onnx")
    assert "'kv'" in line and "k_const" in line, line


@pytest.mark.parametrize("command", ["convert", "lint", "explain"])
def test_constant_value_at_an_absolute_path_is_refused_unread(tmp_path, monkeypatch, command):
    path, secret = hostile(tmp_path, "main", str)
    out = tmp_path / "out"
    out.mkdir()
    refused_without_reading(tmp_path, monkeypatch, command_argv(command, path, out), secret, OUTSIDE, "k_const")


@pytest.mark.parametrize("builder", ["if_branch", "function"])
@pytest.mark.parametrize("command", ["convert", "lint", "explain"])
def test_constant_in_a_body_at_dotdot_is_refused_unread(tmp_path, monkeypatch, builder, command):
    path, secret = hostile(tmp_path, builder, lambda s: "../secret.bin")
    out = tmp_path / "out"
    out.mkdir()
    node = "t_mul" if builder == "if_branch" else "mul"
    const = "t_const" if builder == "if_branch" else "f_const"
    refused_without_reading(tmp_path, monkeypatch, command_argv(command, path, out, node), secret, OUTSIDE, const)


@pytest.mark.parametrize("command", ["convert", "lint", "explain"])
def test_a_location_is_never_looked_up_in_the_current_folder(tmp_path, monkeypatch, isolated, command):
    """The defect as found: 'secret.bin' is not beside the model but in the current folder,
    which is where the Constant's value used to be read from."""
    path = write_model(main_graph_model("secret.bin"), tmp_path / "model" / "m.onnx")
    decoy = isolated / "secret.bin"
    decoy.write_bytes(BEYOND_FP16.tobytes())
    out = tmp_path / "out"
    out.mkdir()
    refused_without_reading(tmp_path, monkeypatch, command_argv(command, path, out), decoy, "'secret.bin' is missing")


def valid_model(tmp_path, isolated, builder="main"):
    """The Constant's value in k.bin beside the model, and a decoy k.bin (small values) in the
    current folder: a reader that looked there would see values fp16 holds."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "k.bin").write_bytes(BEYOND_FP16.tobytes())
    (isolated / "k.bin").write_bytes(SMALL.tobytes())
    return write_model(BUILDERS[builder]("k.bin"), folder / "m.onnx")


@pytest.mark.parametrize("builder", ["main", "if_branch"])
def test_a_constant_in_external_data_inside_the_folder_is_read_from_there(tmp_path, isolated, builder):
    """The value beyond fp16 (1e5) keeps the Mul fp32: the tool read the model's k.bin, not the
    decoy. The converted model holds the Constant's values and computes x * k."""
    path = valid_model(tmp_path, isolated, builder)
    mul = "mul" if builder == "main" else "t_mul"
    outcome = invoke(["explain", path, mul])
    assert_ok(outcome)
    assert "precision: fp32" in outcome.stdout and "1e+05" in outcome.stdout, outcome.stdout
    out = tmp_path / "o.onnx"
    assert_ok(invoke(["convert", path, "-o", out, "-q"]))
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    gate = converted.graph.node[0]
    graph = converted.graph if builder == "main" else next(a.g for a in gate.attribute if a.name == "then_branch")
    const = next(n for n in graph.node if n.op_type == "Constant")
    np.testing.assert_array_equal(numpy_helper.to_array(const.attribute[0].t), BEYOND_FP16)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    feeds = {"x": x} if builder == "main" else {"x": x, "c": np.array(True)}
    np.testing.assert_allclose(run(converted, feeds)[0], x * BEYOND_FP16, rtol=1e-3)
    lint = invoke(["lint", path])
    assert_ok(lint, code=lint.code if lint.code in (0, 1) else 0)


# ---- model paths that are not regular files -----------------------------------------------------
def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def not_a_file_argv(command, path, out):
    if command == "diagnose":
        return ["diagnose", path, path]
    if command == "explain":
        return ["explain", path, "fc"]
    if command == "convert":
        return ["convert", path]  # no -o: there must be no default output beside it either
    return argv(command, path, out)


@pytest.mark.slow
@pytest.mark.parametrize("command", ALL)
def test_dev_zero_is_refused_not_read(tmp_path, command):
    """In a real process under a 4 GiB address-space limit: reading /dev/zero would never end."""
    out = tmp_path / "out"
    out.mkdir()
    outcome = run_process(not_a_file_argv(command, "/dev/zero", out), preexec_fn=_limit_memory, timeout=60)
    assert_one_error(outcome, "/dev/zero", "character device, not a regular file")
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_dev_stdin_is_refused_with_no_default_output(tmp_path):
    outcome = run_process(["convert", "/dev/stdin"], timeout=60)
    assert_one_error(outcome, "/dev/stdin", "not a regular file")


class _Unblock:
    """Opens the FIFO for writing after a while and closes it, so a command that wrongly opened
    it for reading sees an empty file instead of waiting forever."""

    def __init__(self, fifo):
        self._fifo = fifo
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        if self._stop.wait(10):
            return
        os.close(os.open(self._fifo, os.O_RDWR))  # Linux: does not wait for a reader

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("command", ALL)
def test_fifo_or_socket_is_refused(tmp_path, command, kind):
    folder = tmp_path / "models"
    folder.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    path = folder / "m.onnx"
    holder = None
    if kind == "fifo":
        os.mkfifo(path)
    else:
        holder = socket.socket(socket.AF_UNIX)
        holder.bind(str(path))
    try:
        with _Unblock(path) if kind == "fifo" else open(os.devnull):
            outcome = invoke(not_a_file_argv(command, path, out))
        what = "a FIFO" if kind == "fifo" else "a socket"
        assert_one_error(outcome, str(path), f"is {what}, not a regular file")
        # no m.fp16.onnx beside it, nothing in out/ (a snapshot would open the FIFO: names only)
        assert os.listdir(folder) == ["m.onnx"] and os.listdir(out) == []
    finally:
        if holder is not None:
            holder.close()
