"""Weights given as sparse initializers (graph.sparse_initializer): valid ONNX, which onnx.checker
accepts and ONNX Runtime runs. They were refused as a broken graph ("reads tensor 'W', which
nothing produces"). The index now takes one as a constant: the data rules screen its values,
and the rewrite converts the values in place, or adds a sparse copy with the same indices when
the original is still needed. External data of a sparse initializer keeps to the folder rule."""

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke
from helpers import F16, F32, run, tensor
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index

X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def dense_weight(big=None) -> np.ndarray:
    w = np.zeros((4, 4), np.float32)
    w[0, 1], w[2, 3], w[3, 0], w[1, 1] = 0.5, -1.25, 2.0, 0.75
    if big is not None:
        w[1, 2] = big
    return w


def sparse_of(w: np.ndarray, name: str = "W") -> onnx.SparseTensorProto:
    """`w` as a sparse tensor: its nonzero values and their linear indices."""
    flat = np.flatnonzero(w)
    values = numpy_helper.from_array(w.ravel()[flat], name)
    return helper.make_sparse_tensor(values, numpy_helper.from_array(flat.astype(np.int64), name + "_indices"), w.shape)


def sparse_model(nodes, outputs, w=None, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "sparse", [tensor("x", F32, [2, 4])], [tensor(o, F32, [2, 4]) for o in outputs], list(initializers)
    )
    graph.sparse_initializer.append(sparse_of(dense_weight() if w is None else w))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)  # not full_check: ONNX's shape inference does not read sparse initializers
    return m


def matmul_relu(w=None) -> onnx.ModelProto:
    return sparse_model(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="act")],
        ["y"],
        w,
    )


def assert_runs_like(converted: onnx.ModelProto, original: onnx.ModelProto) -> None:
    onnx.checker.check_model(converted)
    for got, want in zip(run(converted, {"x": X}), run(original, {"x": X})):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_sparse_weight_is_a_constant_of_the_index():
    index = build_index(matmul_relu())
    w = index.main.values["W"]
    assert w.kind == "initializer" and w.dtype == F32 and list(w.initializer.dims) == [4]
    assert index.main.sparse["W"].dims == [4, 4]


def test_sparse_weight_converts_in_place_and_runs():
    m = matmul_relu()
    result = autocast_onnx.convert(m)
    assert [e.precision for e in result.plan.nodes] == ["fp16", "fp16"]
    converted = result.model
    (sparse,) = converted.graph.sparse_initializer
    assert sparse.values.data_type == F16 and list(sparse.dims) == [4, 4]
    assert sparse.indices == m.graph.sparse_initializer[0].indices and not converted.graph.initializer
    assert "Cast" not in [n.op_type for n in converted.graph.node if "W" in n.input]
    assert_runs_like(converted, m)


def test_sparse_weight_needed_in_two_types_gets_a_sparse_copy():
    """A MatMul reads W in fp16, a Softmax (keep_fp32) in fp32: the original stays, and the copy
    is a second sparse initializer with the same indices, not a dense tensor of the values.
    runtime="any": for CUDA the Softmax would read W in fp16 (its values are exact in fp16 and
    the kernel computes in fp32; plan/kernel_io.py), and no copy would be needed."""
    m = sparse_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Softmax", ["W"], ["s"], name="soft"),
            helper.make_node("MatMul", ["h", "s"], ["y"], name="mm2"),
        ],
        ["y"],
    )
    converted = autocast_onnx.convert(m, runtime="any").model
    by_name = {s.values.name: s for s in converted.graph.sparse_initializer}
    assert set(by_name) == {"W", "W_fp16"} and not converted.graph.initializer
    assert by_name["W"].values.data_type == F32 and by_name["W_fp16"].values.data_type == F16
    assert by_name["W_fp16"].indices == by_name["W"].indices and list(by_name["W_fp16"].dims) == [4, 4]
    assert_runs_like(converted, m)


def test_sparse_weight_out_of_fp16_range_keeps_its_reader_fp32():
    m = matmul_relu(dense_weight(big=7e4))
    result = autocast_onnx.convert(m)
    mm = result.plan.by_name("mm")[0]
    assert mm.precision == "fp32" and mm.reasons[-1].code == "data-range", mm.explain()
    assert result.model.graph.sparse_initializer[0].values.data_type == F32
    assert_runs_like(result.model, m)


def test_sparse_weight_in_a_body():
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "V"], ["t"], name="body_mm")], "then", [], [tensor("t", F32, [2, 4])]
    )
    body.sparse_initializer.append(sparse_of(dense_weight(), "V"))
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [tensor("e", F32, [2, 4])])
    m = sparse_model(
        [
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
            helper.make_node("Greater", ["total", "zero"], ["c"], name="cmp"),
            helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other, name="branch"),
        ],
        ["y"],
        initializers=[numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    result = autocast_onnx.convert(m)
    assert result.plan.by_name("body_mm")[0].precision == "fp16"
    (branch,) = [n for n in result.model.graph.node if n.op_type == "If"]
    then = next(a.g for a in branch.attribute if a.name == "then_branch")
    assert then.sparse_initializer[0].values.data_type == F16
    assert_runs_like(result.model, m)


def test_plan_of_a_sparse_model_replays(tmp_path):
    m = matmul_relu()
    first = autocast_onnx.convert(m)
    path = tmp_path / "plan.json"
    first.plan.save(path)
    again = autocast_onnx.convert(m, plan=str(path))
    assert again.model.SerializeToString() == first.model.SerializeToString()


# ---- external data -----------------------------------------------------------------------------
def external_sparse_model(folder, location: str):
    """matmul_relu with the sparse values stored in an external file at `location`."""
    m = matmul_relu()
    values = m.graph.sparse_initializer[0].values
    payload = values.raw_data or np.asarray(values.float_data, np.float32).tobytes()
    (folder / "w.bin").write_bytes(payload)
    values.ClearField("raw_data")
    values.ClearField("float_data")
    values.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(payload)))):
        entry = values.external_data.add()
        entry.key, entry.value = key, value
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_sparse_values_in_external_data_are_read_and_written_inline(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    path = external_sparse_model(src, "w.bin")
    out = tmp_path / "out" / "model16.onnx"
    out.parent.mkdir()
    assert_ok(invoke(["convert", path, "-o", out]))
    converted = onnx.load(out)  # another folder: the values travel with the model
    assert converted.graph.sparse_initializer[0].values.data_location != TensorProto.EXTERNAL
    assert_runs_like(converted, matmul_relu())


@pytest.mark.parametrize(
    "location, fragment",
    [
        ("../w.bin", "location '../w.bin' is outside the model's folder"),
        ("/etc/passwd", "location '/etc/passwd' is outside the model's folder"),
        ("missing.bin", "file 'missing.bin' is missing"),
    ],
)
def test_sparse_external_data_keeps_to_the_folder_rule(tmp_path, location, fragment):
    src = tmp_path / "src"
    src.mkdir()
    path = external_sparse_model(src, location)
    (tmp_path / "w.bin").write_bytes((src / "w.bin").read_bytes())  # what ../w.bin would reach
    out = tmp_path / "o.onnx"
    assert_one_error(invoke(["convert", path, "-o", out]), str(path), "'W': external data " + fragment)
    assert not out.exists()


def test_sparse_external_data_without_a_folder_is_refused():
    m = matmul_relu()
    values = m.graph.sparse_initializer[0].values
    values.data_location = TensorProto.EXTERNAL
    values.external_data.add().key = "location"
    with pytest.raises(AutocastError, match="sparse initializer 'W' uses external data but the model has no folder"):
        autocast_onnx.convert(m)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_full_check_passes_a_converted_sparse_weight(precision):
    """ONNX's shape inference fails on any model with a sparse initializer, the input included;
    --check full checks the converted model with its sparse weights stored densely."""
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(matmul_relu(), full_check=True)
    result = autocast_onnx.convert(matmul_relu(), precision=precision, check="full")
    assert result.model.graph.sparse_initializer[0].values.data_type == (F16 if precision == "fp16" else 16)


def test_malformed_sparse_initializer_is_bad_input():
    m = matmul_relu()
    indices = m.graph.sparse_initializer[0].indices
    indices.CopyFrom(numpy_helper.from_array(np.array([1, 5, 14, 11], np.int64), indices.name))
    with pytest.raises(AutocastError, match=r"sparse initializer 'W' is malformed: .*not in sorted order"):
        autocast_onnx.convert(m)


def test_lint_and_explain_read_a_sparse_model(tmp_path):
    path = tmp_path / "sparse.onnx"
    onnx.save(matmul_relu(), path)
    assert_ok(invoke(["lint", path]))
    outcome = invoke(["explain", path, "mm"])
    assert_ok(outcome)
    assert "precision: fp16" in outcome.stdout


def test_fingerprint_takes_a_sparse_weight_by_its_dense_shape():
    """Retraining changes which values are zero; the plan still belongs to the model."""
    from autocast_onnx.plan.paint import index_fingerprint

    fewer = dense_weight()
    fewer[0, 1] = 0.0
    assert index_fingerprint(build_index(matmul_relu(fewer))) == index_fingerprint(build_index(matmul_relu()))
    wider = sparse_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], ["y"], np.eye(4, 4, dtype=np.float32)
    )
    narrower = sparse_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], ["y"], np.eye(4, 3, dtype=np.float32)
    )
    assert index_fingerprint(build_index(wider)) != index_fingerprint(build_index(narrower))


def test_sparse_weight_read_by_a_cuda_fp32_kernel_needs_no_copy():
    """The same model planned for CUDA (the default): W's values are exact in fp16 and the CUDA
    Softmax computes in fp32 from fp16 input, so the Softmax reads the one fp16 sparse tensor."""
    m = sparse_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Softmax", ["W"], ["s"], name="soft"),
            helper.make_node("MatMul", ["h", "s"], ["y"], name="mm2"),
        ],
        ["y"],
    )
    result = autocast_onnx.convert(m)
    soft = next(e for e in result.plan.nodes if e.name == "soft")
    assert soft.precision == "fp16" and soft.reasons[-1].code == "kernel-fp32"
    (sparse,) = result.model.graph.sparse_initializer
    assert sparse.values.data_type == F16 and not result.model.graph.initializer
    assert_runs_like(result.model, m)
