"""Validation inputs (issue 28, item 6): a run that fails on its inputs says what it fed (shapes
and value ranges); unnamed dynamic dimensions are set with --dim INPUT:AXIS=N; --save-inputs
writes the generated batch (kept when the run fails) for --inputs to replay; an .npz that stacks
batches along a fixed batch-1 axis is split into batches."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, isolated_cwd
from helpers import parse, randn, reshaped_to_fixed_rows
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.inputs import describe_inputs, load_batches, plan_inputs

isolated = pytest.fixture(autouse=True)(isolated_cwd)


def fixed_batch_one() -> onnx.ModelProto:
    return parse(
        """
        g (float[1,8] x) => (float[1,8] y) {
            h = MatMul(x, w)
            y = Relu(h)
        }""",
        w=randn([8, 8], 3),
    )


@pytest.fixture
def refusing(tmp_path):
    ref, conv = tmp_path / "r.onnx", tmp_path / "r.fp16.onnx"
    onnx.save(reshaped_to_fixed_rows(2), ref)
    autocast_onnx.convert_file(ref, conv)
    return ref, conv


def test_a_failed_run_shows_the_shapes_and_ranges_it_generated(refusing):
    ref, conv = refusing
    line = assert_one_error(invoke(["validate", ref, conv]), "ONNX Runtime failed to run the reference model")
    assert "generated inputs" in line and "x float32 [3, 8] in -" in line, line
    assert "--save-inputs" in line


def test_an_unnamed_dynamic_dimension_is_set_by_input_and_axis(refusing, tmp_path):
    ref, conv = refusing
    report = tmp_path / "r.json"
    assert_ok(invoke(["validate", ref, conv, "--dim", "x:0=2", "--report-json", report]))
    data = json.loads(report.read_text())
    assert data["inputs"]["specs"][0]["shape"] == [2, 8] and data["inputs"]["dims"] == {"x:0": 2}
    assert autocast_onnx.validate(ref, conv, dims={"x:0": 2}).passed


@pytest.mark.parametrize(
    "dim, fragment",
    [
        ("x:1=4", "axis 1 of input 'x' has the fixed size 8"),
        ("x:2=4", "input 'x' has 2 axes"),
        ("y:0=4", "--dim names no symbolic dimension of the inputs: y:0"),
        ("batch=4", "an unnamed dynamic dimension is set as INPUT:AXIS=N"),
    ],
)
def test_bad_input_axis_dims_are_refused(refusing, dim, fragment):
    ref, conv = refusing
    assert_one_error(invoke(["validate", ref, conv, "--dim", dim]), fragment)


def test_a_named_axis_is_set_by_its_name():
    specs = describe_inputs(parse("g (float[n,8] x) => (float[n,8] y) { y = Relu(x) }"))
    with pytest.raises(AutocastError, match=r"symbolic dimension 'n'.*--dim n=N"):
        plan_inputs(specs, {"x:0": 4})


def test_save_inputs_round_trips_through_inputs(tmp_path):
    ref, conv = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(fixed_batch_one(), ref)
    autocast_onnx.convert_file(ref, conv)
    saved, first, second = tmp_path / "in.npz", tmp_path / "a.json", tmp_path / "b.json"
    assert_ok(invoke(["validate", ref, conv, "--seed", "7", "--save-inputs", saved, "--report-json", first]))
    with np.load(saved) as data:
        assert sorted(data) == ["x"] and data["x"].shape == (1, 8) and data["x"].dtype == np.float32
    assert_ok(invoke(["validate", ref, conv, "--inputs", saved, "--report-json", second]))
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["outputs"] == b["outputs"]  # the same batch, the same comparison


def test_saved_inputs_are_kept_when_the_run_fails_and_replay_the_failure(refusing, tmp_path):
    ref, conv = refusing
    saved = tmp_path / "failing.npz"
    line = assert_one_error(invoke(["validate", ref, conv, "--save-inputs", saved]), f"(saved to {saved})")
    assert saved.is_file()
    replay = assert_one_error(invoke(["validate", ref, conv, "--inputs", saved]), f"the batch of {saved}")
    assert line.split("; it was fed")[0].split("model: ")[-1] in replay  # ONNX Runtime's same complaint


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--batches", "2"], "--save-inputs writes one batch, and --batches is 2"),
        (["--save-inputs", "-"], "--save-inputs needs a file name"),
    ],
)
def test_save_inputs_refusals(refusing, tmp_path, extra, fragment):
    ref, conv = refusing
    args = ["validate", ref, conv, "--dim", "x:0=2", *extra]
    if "-" not in extra:
        args += ["--save-inputs", tmp_path / "s.npz"]
    assert_one_error(invoke(args), fragment)
    assert not (tmp_path / "s.npz").exists()


def test_stacked_batches_along_a_fixed_batch_one_axis_are_split(tmp_path):
    ref, conv = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(fixed_batch_one(), ref)
    autocast_onnx.convert_file(ref, conv)
    stacked = tmp_path / "stacked.npz"
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.savez(stacked, x=x)
    batches = load_batches(stacked, describe_inputs(onnx.load(ref)))
    assert len(batches) == 4 and all(b["x"].shape == (1, 8) for b in batches)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), x)
    report = tmp_path / "r.json"
    assert_ok(invoke(["validate", ref, conv, "--inputs", stacked, "--report-json", report]))
    assert json.loads(report.read_text())["inputs"]["batches"] == 4


def test_a_stack_that_does_not_fit_stays_refused(tmp_path):
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        )
    )
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 8), np.float32))
    with pytest.raises(AutocastError, match="declares size 2 for dimension 0"):
        load_batches(bad, describe_inputs(m))
