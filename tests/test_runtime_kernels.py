"""--runtime (issue 30, item 2): a plan made for a runtime keeps fp32 the nodes that runtime has no kernel for at
the low type and the model's opset (catalog/kernels.py over data/kernels_cuda.json and data/kernels_tensorrt.json);
without it, or with `any`, the plan is today's."""

import json

import pytest
from click.testing import CliRunner
from helpers import init, model, parse, randn, tensor
from onnx import TensorProto
from onnx import helper as oh

import autocast_onnx
from autocast_onnx.catalog.kernels import has_kernel
from autocast_onnx.cli.main import cli


def grid_sample(opset=16):
    """x -> Relu -> GridSample -> Relu: the GridSample is the node a runtime may lack."""
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="pre"),
        oh.make_node("GridSample", ["a", "grid"], ["b"], name="gs"),
        oh.make_node("Relu", ["b"], ["y"], name="post"),
    ]
    return model(
        nodes,
        [tensor("x", shape=[1, 2, 4, 4]), tensor("grid", shape=[1, 3, 3, 2])],
        [tensor("y", shape=[1, 2, 3, 3])],
        opset=opset,
    )


def conv(opset=22):
    w = randn([4, 2, 3, 3])
    nodes = [oh.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    return model(nodes, [tensor("x", shape=[1, 2, 8, 8])], [tensor("y", shape=[1, 4, 6, 6])], [init("w", w)], opset)


@pytest.fixture
def low(tmp_path):
    """A rule file that puts GridSample among the low-precision ops (the default profile keeps it fp32 for
    accuracy), so that the runtime's kernels are what decides it."""
    path = tmp_path / "low.toml"
    path.write_text('[ops.low_precision]\nGridSample = "the runtime decides"\n')
    return [str(path)]


def node(result, name):
    (found,) = [n for n in result.plan.nodes if n.name == name]
    return found


def codes(result, name):
    return [r.code for r in node(result, name).reasons]


# ---- the tables answer ------------------------------------------------------------------------------------------


def test_the_tables_answer_the_cases_the_tests_use():
    f16, b16 = TensorProto.FLOAT16, TensorProto.BFLOAT16
    assert has_kernel("cuda", "", "GridSample", 16, f16) is False  # registered for float only
    assert has_kernel("cuda", "", "Conv", 22, b16) is False  # fp16, not bf16
    assert has_kernel("cuda", "", "Conv", 22, f16) is True
    assert has_kernel("cuda", "", "MatMul", 12, b16) is False  # bf16 from opset 13
    assert has_kernel("cuda", "", "MatMul", 13, b16) is True
    assert has_kernel("cuda", "", "Sign", 12, f16) is False  # fp16 from opset 13
    assert has_kernel("cuda", "", "Sign", 13, f16) is True
    assert has_kernel("cuda", "", "Slice", 13, f16) is None  # only its index types are recorded
    assert has_kernel("tensorrt", "", "GridSample", 16, b16) is False  # FP32, FP16
    assert has_kernel("tensorrt", "", "GridSample", 16, f16) is True
    assert has_kernel("tensorrt", "", "RoiAlign", 16, b16) is False
    assert has_kernel("tensorrt", "", "NonZero", 17, b16) is False
    assert has_kernel("tensorrt", "", "MatMul", 17, b16) is True
    assert has_kernel("tensorrt", "", "GridSample", 22, b16) is None  # beyond the matrix's opsets 9-20
    assert has_kernel("tensorrt", "", "NoSuchOp", 16, b16) is None
    assert has_kernel("tensorrt", "com.microsoft", "GridSample", 1, b16) is None


# ---- planning ---------------------------------------------------------------------------------------------------


def test_cuda_keeps_a_float_only_gridsample_fp32(low):
    before = autocast_onnx.convert(grid_sample(), rules=low)
    assert node(before, "gs").precision == "fp16"
    after = autocast_onnx.convert(grid_sample(), rules=low, runtime="cuda")
    gs = node(after, "gs")
    assert gs.precision == "fp32"
    (reason,) = [r for r in gs.reasons if r.code == "no-kernel"]
    assert "no fp16 kernel for GridSample in onnxruntime-cuda" in reason.message
    assert "opset 16" in reason.message and "CPU provider" in reason.message


@pytest.mark.parametrize("runtime", [None, "any"])
def test_no_runtime_or_any_gives_todays_plan(runtime, low):
    today = autocast_onnx.convert(grid_sample(), rules=low)
    given = autocast_onnx.convert(grid_sample(), rules=low, runtime=runtime)
    assert given.plan.to_dict() == today.plan.to_dict()
    assert given.model.SerializeToString() == today.model.SerializeToString()


def test_cuda_bf16_conv_stays_fp32_fp16_conv_converts():
    assert node(autocast_onnx.convert(conv(), precision="bf16"), "conv").precision == "bf16"
    bf16 = autocast_onnx.convert(conv(), precision="bf16", runtime="cuda")
    assert node(bf16, "conv").precision == "fp32" and "no-kernel" in codes(bf16, "conv")
    fp16 = autocast_onnx.convert(conv(), precision="fp16", runtime="cuda")
    assert node(fp16, "conv").precision == "fp16" and "no-kernel" not in codes(fp16, "conv")


def sign_after_matmul(opset):
    return parse(
        """
        ms (float[2,4] x) => (float[2,4] y) {
            [mm] h = MatMul(x, w)
            [sign] y = Sign(h)
        }""",
        opset=opset,
        w=randn([4, 4]),
    )


def test_cuda_fp16_follows_the_opset():
    """The CUDA provider registers Sign for fp16 from opset 13 only (opset 9-12: float and double)."""
    at12 = autocast_onnx.convert(sign_after_matmul(12), runtime="cuda")
    assert node(at12, "mm").precision == "fp16"
    assert node(at12, "sign").precision == "fp32"
    assert any("opset 12" in r.message for r in node(at12, "sign").reasons if r.code == "no-kernel")
    at13 = autocast_onnx.convert(sign_after_matmul(13), runtime="cuda")
    assert node(at13, "sign").precision == "fp16" and "no-kernel" not in codes(at13, "sign")
    plain = autocast_onnx.convert(sign_after_matmul(12))
    assert node(plain, "sign").precision == "fp16"


def test_bf16_matmul_at_13_converts_for_cuda():
    result = autocast_onnx.convert(sign_after_matmul(13), precision="bf16", runtime="cuda")
    assert node(result, "mm").precision == "bf16"


def nonzero_after_matmul(opset=17):
    return parse(
        """
        mn (float[2,4] x) => (float[2,4] y, int64[2,N] z) {
            [mm] y = MatMul(x, w)
            [nz] z = NonZero(y)
        }""",
        opset=opset,
        w=randn([4, 4]),
    )


def test_tensorrt_has_fp16_gridsample(low):
    fp16 = autocast_onnx.convert(grid_sample(), rules=low, runtime="tensorrt")
    assert node(fp16, "gs").precision == "fp16" and "no-kernel" not in codes(fp16, "gs")


def test_tensorrt_has_no_bf16_nonzero():
    """The matrix lists NonZero for FP32 and FP16; its schema takes bf16 from opset 13."""
    assert node(autocast_onnx.convert(nonzero_after_matmul(), precision="bf16"), "nz").precision == "bf16"
    bf16 = autocast_onnx.convert(nonzero_after_matmul(), precision="bf16", runtime="tensorrt")
    assert node(bf16, "mm").precision == "bf16"
    nz = node(bf16, "nz")
    assert nz.precision == "fp32"
    assert any(r.message.startswith("TensorRT 10.0 does not support bf16 for NonZero") for r in nz.reasons)


def test_tensorrt_beyond_its_opsets_changes_nothing(low):
    """At opset 22 the matrix (opsets 9-20) cannot tell: unknown is not a missing kernel."""
    today = autocast_onnx.convert(grid_sample(22), rules=low, precision="bf16")
    given = autocast_onnx.convert(grid_sample(22), rules=low, precision="bf16", runtime="tensorrt")
    assert node(given, "gs").precision == node(today, "gs").precision == "bf16"


def test_a_forced_node_stays_low_with_the_reason_noted():
    result = autocast_onnx.convert(grid_sample(), runtime="cuda", include_ops=["GridSample"])
    assert node(result, "gs").precision == "fp16"
    assert any("converted anyway" in r.message for r in node(result, "gs").reasons if r.code == "no-kernel")


def test_an_unknown_runtime_is_refused():
    with pytest.raises(autocast_onnx.AutocastError, match="unknown runtime 'dml'"):
        autocast_onnx.convert(grid_sample(), runtime="dml")


# ---- surfaces ---------------------------------------------------------------------------------------------------


def test_convert_summary_counts_the_nodes(tmp_path, low):
    path = tmp_path / "m.onnx"
    path.write_bytes(grid_sample().SerializeToString())
    args = ["convert", str(path), "--rules", low[0], "-o"]
    out = CliRunner().invoke(cli, [*args, str(tmp_path / "o.onnx"), "--runtime", "cuda"])
    assert out.exit_code == 0, out.output
    assert "kept fp32 for want of a cuda kernel: 1 (ops GridSample)" in out.output
    plain = CliRunner().invoke(cli, [*args, str(tmp_path / "p.onnx")])
    assert "for want of" not in plain.output


def test_explain_shows_the_reason(tmp_path, low):
    path = tmp_path / "m.onnx"
    path.write_bytes(grid_sample().SerializeToString())
    out = CliRunner().invoke(cli, ["explain", str(path), "gs", "--rules", low[0], "--runtime", "cuda"])
    assert out.exit_code == 0, out.output
    assert "no fp16 kernel for GridSample in onnxruntime-cuda" in out.output


def test_the_configuration_key(tmp_path, low):
    path = tmp_path / "m.onnx"
    path.write_bytes(grid_sample().SerializeToString())
    (tmp_path / "autocast-onnx.toml").write_text(f'runtime = "cuda"\nrules = ["{low[0]}"]\n')
    plan_out = tmp_path / "plan.json"
    args = ["convert", str(path), "-o", str(tmp_path / "o.onnx"), "--plan-out", str(plan_out)]
    out = CliRunner().invoke(cli, [*args, "--config", str(tmp_path / "autocast-onnx.toml")])
    assert out.exit_code == 0, out.output
    (gs,) = [n for n in json.loads(plan_out.read_text())["nodes"] if n["name"] == "gs"]
    assert gs["precision"] == "fp32"
    (tmp_path / "bad.toml").write_text('runtime = "dml"\n')
    bad = CliRunner().invoke(cli, [*args, "--config", str(tmp_path / "bad.toml")])
    assert bad.exit_code == 2 and "runtime must be cuda, tensorrt or any" in bad.output


def test_lint_takes_the_runtime(tmp_path):
    """lint() and `lint --runtime` build the same planning options: a runtime without a table is refused there."""
    with pytest.raises(autocast_onnx.AutocastError, match="unknown runtime 'dml'"):
        autocast_onnx.lint(grid_sample(), runtime="dml")
    assert autocast_onnx.lint(grid_sample(), runtime="cuda").results
    path = tmp_path / "m.onnx"
    path.write_bytes(grid_sample().SerializeToString())
    out = CliRunner().invoke(cli, ["lint", str(path), "--runtime", "tensorrt"])
    assert out.exit_code in (0, 1) and "error:" not in out.output, out.output
