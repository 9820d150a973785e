"""Converted weights go to the output's external-data file as they are produced (memory does not
grow with the weights; benchmarks/bench_memory.py measures that): the file is right, named as
the output, and a failure in the middle leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.io import PayloadSpill


def external_mlp(folder: Path) -> tuple[Path, dict]:
    """Three MatMul layers with 64x64 fp32 weights (16 KiB each) in ext.onnx.data, and a tiny bias
    that stays in the model (under the 1 KiB external threshold)."""
    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32) for i in range(3)}
    nodes, x = [], "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"fc{i}"))
        x = f"h{i}"
    nodes.append(helper.make_node("Add", [x, "bias"], ["y"], name="bias_add"))
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    inits.append(numpy_helper.from_array(np.full(64, 0.5, np.float32), "bias"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        inits,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "ext.onnx", save_as_external_data=True, location="ext.onnx.data", size_threshold=1024)
    return folder / "ext.onnx", weights


def test_converted_weights_stream_into_the_output_data_file(tmp_path):
    src, weights = external_mlp(tmp_path / "in")
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    autocast_onnx.convert_file(src, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.onnx", "o.onnx.data"]  # no temporary left
    stored = onnx.load(str(out), load_external_data=False)
    for t in stored.graph.initializer:
        if t.name in weights:
            assert t.data_type == TensorProto.FLOAT16 and t.data_location == TensorProto.EXTERNAL
            assert {e.key: e.value for e in t.external_data}["location"] == "o.onnx.data"
    loaded = onnx.load(str(out))
    for t in loaded.graph.initializer:
        if t.name in weights:
            np.testing.assert_array_equal(numpy_helper.to_array(t), weights[t.name].astype(np.float16))
    onnx.checker.check_model(str(out), full_check=True)


def test_a_failure_while_streaming_leaves_nothing(tmp_path, monkeypatch):
    src, _ = external_mlp(tmp_path / "in")
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    calls = []
    original = PayloadSpill.put

    def put_then_fail(self, tensor, payload):
        calls.append(tensor.name)
        if len(calls) == 2:
            raise AutocastError("cannot write output: No space left on device", str(self.out_path), "free space")
        return original(self, tensor, payload)

    monkeypatch.setattr(PayloadSpill, "put", put_then_fail)
    with pytest.raises(AutocastError, match="No space left"):
        autocast_onnx.convert_file(src, out)
    assert list(out.parent.iterdir()) == []  # neither the model, its data nor the temporary
    assert len(calls) == 2


def test_an_output_folder_that_is_missing_is_refused_before_streaming(tmp_path):
    src, _ = external_mlp(tmp_path / "in")
    with pytest.raises(AutocastError, match="does not exist"):
        autocast_onnx.convert_file(src, tmp_path / "missing" / "o.onnx")


def test_to_half_matches_numpy_on_both_paths():
    from autocast_onnx import dtypes

    rng = np.random.default_rng(0)
    for size in (17, dtypes.PARALLEL_MIN + 3):  # one thread, then two
        x = (rng.standard_normal(size) * 1e3).astype(np.float32)
        x[:4] = [7e4, -7e4, np.nan, 1e-9]  # overflow to inf, NaN, flush to 0
        with np.errstate(over="ignore"):
            expected = x.astype(np.float16)
        np.testing.assert_array_equal(dtypes.to_half(x), expected)
