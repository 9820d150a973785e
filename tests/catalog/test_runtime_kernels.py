"""--runtime (issue 30, item 2): a plan made for a runtime keeps fp32 the nodes that runtime has no kernel for at
the low type and the model's opset (catalog/kernels.py over data/kernels_cuda.json with the placements probed on
onnxruntime-gpu 1.31.1 in data/kernels_cuda_observed.json, data/kernels_dml.json and data/kernels_tensorrt.json),
or whose planned port types split type parameters the kernel binds to one type; without it, or with `any`, the plan
is today's."""

import json

import pytest
from click.testing import CliRunner
from helpers import init, model, parse, randn, tensor
from onnx import TensorProto
from onnx import helper as oh

import autocast_onnx
from autocast_onnx.catalog import kernels
from autocast_onnx.catalog.kernels import has_kernel, node_version, split_tie
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


def conv_transpose(opset=22):
    w = randn([2, 4, 3, 3])
    nodes = [oh.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv")]
    return model(nodes, [tensor("x", shape=[1, 2, 8, 8])], [tensor("y", shape=[1, 4, 10, 10])], [init("w", w)], opset)


def conv_pool(opset):
    """Conv -> MaxPool: ONNX Runtime's CUDA MaxPool registration since 12 is open-ended, so it runs MaxPool-12
    nodes (opsets 12-21) and not MaxPool-22 ones."""
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        oh.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2]),
    ]
    w = randn([4, 2, 3, 3])
    return model(nodes, [tensor("x", shape=[1, 2, 8, 8])], [tensor("y", shape=[1, 4, 5, 5])], [init("w", w)], opset)


def conv_bn(opset=17, flush=False):
    """Conv -> BatchNormalization with its parameters as initializers. With `flush`, one channel's
    scale (1e-9) flushes in fp16, so the parameters do not survive it and stay pinned fp32
    (plan/batchnorm.py)."""
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        oh.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"),
    ]
    values = {n: randn([4]) ** 2 + 0.5 for n in "sbmv"}
    if flush:
        values["s"][0] = 1e-9
    inits = [init("w", randn([4, 2, 3, 3]))] + [init(n, values[n]) for n in "sbmv"]
    return model(nodes, [tensor("x", shape=[1, 2, 8, 8])], [tensor("y", shape=[1, 4, 6, 6])], inits, opset)


@pytest.fixture
def pinned_bn(tmp_path):
    """A rule file that pins BatchNormalization's parameters fp32 beside low data (a mix the CUDA kernel lacks)."""
    path = tmp_path / "pins.toml"
    path.write_text('[pins]\nBatchNormalization = { inputs = [1, 2, 3, 4], why = "parameters in fp32" }\n')
    return [str(path)]


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
    assert has_kernel("cuda", "", "ConvTranspose", 22, b16) is False  # fp16, not bf16
    assert has_kernel("cuda", "", "ConvTranspose", 22, f16) is True
    assert has_kernel("cuda", "", "Conv", 22, b16) is True  # probed on 1.31.1; the 1.23 sources have none
    assert has_kernel("cuda", "", "MaxPool", 22, f16) is False  # the open-ended registration since 12 ...
    assert has_kernel("cuda", "", "MaxPool", 21, f16) is True  # ... covers MaxPool-12 only
    assert has_kernel("cuda", "", "MatMul", 12, b16) is False  # bf16 from opset 13
    assert has_kernel("cuda", "", "MatMul", 13, b16) is True
    assert has_kernel("cuda", "", "Sign", 12, f16) is False  # fp16 from opset 13
    assert has_kernel("cuda", "", "Sign", 13, f16) is True
    assert has_kernel("cuda", "", "Slice", 13, f16) is True  # probed; the sources record its index types only
    assert has_kernel("cuda", "", "GatherND", 13, f16) is None  # only its index types are recorded
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
    # the one difference: whose kernels pass 6 counted on (the plan's "kernels", the provenance's runtime)
    assert given.plan.to_dict() | {"kernels": None} == today.plan.to_dict() | {"kernels": None}
    assert given.model.graph.SerializeToString() == today.model.graph.SerializeToString()


def test_cuda_bf16_conv_transpose_stays_fp32_fp16_converts():
    assert node(autocast_onnx.convert(conv_transpose(), precision="bf16"), "deconv").precision == "bf16"
    bf16 = autocast_onnx.convert(conv_transpose(), precision="bf16", runtime="cuda")
    assert node(bf16, "deconv").precision == "fp32" and "no-kernel" in codes(bf16, "deconv")
    fp16 = autocast_onnx.convert(conv_transpose(), precision="fp16", runtime="cuda")
    assert node(fp16, "deconv").precision == "fp16" and "no-kernel" not in codes(fp16, "deconv")
    conv22 = autocast_onnx.convert(conv(), precision="bf16", runtime="cuda")  # 1.31.1 runs bf16 Conv-22
    assert node(conv22, "conv").precision == "bf16"


def test_an_open_ended_registration_covers_its_own_schema_version_only():
    """ONNX Runtime matches an open-ended registration to nodes of exactly its start version (VerifyVersion):
    MaxPool registered since 12 runs MaxPool-12 (opsets 12-21), not MaxPool-22."""
    assert node_version("", "MaxPool", 17) == 12 and node_version("", "MaxPool", 22) == 22
    at17 = autocast_onnx.convert(conv_pool(17), runtime="cuda")
    assert node(at17, "pool").precision == "fp16" and "no-kernel" not in codes(at17, "pool")
    at22 = autocast_onnx.convert(conv_pool(22), runtime="cuda")
    pool = node(at22, "pool")
    assert pool.precision == "fp32"
    assert any("MaxPool" in r.message and "opset 22" in r.message for r in pool.reasons if r.code == "no-kernel")
    assert node(at22, "conv").precision == "fp16"
    assert node(autocast_onnx.convert(conv_pool(22)), "pool").precision == "fp16"  # no runtime: the schema decides


def test_the_probed_placements_override_the_older_sources(monkeypatch):
    """1.31.1 runs Gelu-20 in bf16 on CUDA (probed); the 1.23.0 registration sources list float, double and fp16."""
    b16 = TensorProto.BFLOAT16
    assert has_kernel("cuda", "", "Gelu", 20, b16) is True
    monkeypatch.setattr(kernels, "_observed", lambda runtime: {})
    assert has_kernel("cuda", "", "Gelu", 20, b16) is False


def test_a_split_tie_keeps_batch_norm_fp32_for_cuda(pinned_bn):
    """The CUDA BatchNormalization kernel (opset 15+) binds T1 and T2 to the data's type T: with fp32 parameters
    pinned beside fp16 data, ONNX Runtime runs the node on the CPU provider (seen on an H200, docs/benchmarks.md)."""
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
    assert split_tie("cuda", "", "BatchNormalization", 17, {"T": f16, "T1": f32, "T2": f32}) == ["T", "T1", "T2"]
    assert split_tie("cuda", "", "BatchNormalization", 17, {"T": f16, "T1": f16, "T2": f16}) is None
    # the plan never makes that mix: parameters that do not survive fp16 keep the node fp32 whole
    # (plan/batchnorm.py), for every runtime
    for runtime in (None, "any", "cuda"):
        result = autocast_onnx.convert(conv_bn(flush=True), rules=pinned_bn, runtime=runtime)
        bn = node(result, "bn")
        assert bn.precision in ("fp32", "unchanged") and node(result, "conv").precision == "fp16"
        assert "bn-parameters-fp32" in [r.code for r in bn.reasons]


def test_dml_has_its_own_table():
    """DirectML registers Conv for opsets 1-10 and 11-21 (data/kernels_dml.json): a Conv-22 stays fp32 for dml."""
    at22 = autocast_onnx.convert(conv(), runtime="dml")
    assert node(at22, "conv").precision == "fp32"
    assert any("onnxruntime-directml" in r.message for r in node(at22, "conv").reasons if r.code == "no-kernel")
    assert node(autocast_onnx.convert(conv(17), runtime="dml"), "conv").precision == "fp16"


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
    with pytest.raises(autocast_onnx.AutocastError, match="unknown runtime 'rocm'"):
        autocast_onnx.convert(grid_sample(), runtime="rocm")


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
    (tmp_path / "bad.toml").write_text('runtime = "rocm"\n')
    bad = CliRunner().invoke(cli, [*args, "--config", str(tmp_path / "bad.toml")])
    assert bad.exit_code == 2 and "runtime must be cuda, tensorrt, dml or any" in bad.output


def test_lint_takes_the_runtime(tmp_path):
    """lint() and `lint --runtime` build the same planning options: a runtime without a table is refused there."""
    with pytest.raises(autocast_onnx.AutocastError, match="unknown runtime 'rocm'"):
        autocast_onnx.lint(grid_sample(), runtime="rocm")
    assert autocast_onnx.lint(grid_sample(), runtime="cuda").results
    path = tmp_path / "m.onnx"
    path.write_bytes(grid_sample().SerializeToString())
    out = CliRunner().invoke(cli, ["lint", str(path), "--runtime", "tensorrt"])
    assert out.exit_code in (0, 1) and "error:" not in out.output, out.output


def three_grid_samples(opset=16):
    """x -> Relu -> GridSample -> GridSample -> GridSample -> Relu, and a lone GridSample on another branch: one
    region of three neighbours and a single node."""
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="pre"),
        oh.make_node("GridSample", ["a", "grid"], ["b"], name="gs1"),
        oh.make_node("GridSample", ["b", "grid"], ["c"], name="gs2"),
        oh.make_node("GridSample", ["c", "grid"], ["d"], name="gs3"),
        oh.make_node("Relu", ["d"], ["y"], name="post"),
        oh.make_node("GridSample", ["a", "grid"], ["e"], name="lone"),
        oh.make_node("Relu", ["e"], ["z"], name="post2"),
    ]
    return model(
        nodes,
        [tensor("x", shape=[1, 2, 4, 4]), tensor("grid", shape=[1, 4, 4, 2])],
        [tensor("y", shape=[1, 2, 4, 4]), tensor("z", shape=[1, 2, 4, 4])],
        opset=opset,
    )


def test_a_region_of_neighbours_is_said_once(low, tmp_path):
    result = autocast_onnx.convert(three_grid_samples(), rules=low, runtime="cuda")
    regions = [w for w in result.plan.warnings if w.code == "fallback-region"]
    assert len(regions) == 1
    assert "1 region(s)" in regions[0].message and "3 nodes from 'gs1' (GridSample)" in regions[0].message
    assert "lone" not in regions[0].message
    path = tmp_path / "m.onnx"
    path.write_bytes(three_grid_samples().SerializeToString())
    out = CliRunner().invoke(
        cli, ["convert", str(path), "--rules", low[0], "--runtime", "cuda", "-o", str(tmp_path / "o.onnx")]
    )
    assert out.exit_code == 0, out.output
    assert out.output.count("region(s) of neighbouring nodes") == 1
    assert "kept fp32 for want of a cuda kernel: 4 (ops GridSample)" in out.output
    single = autocast_onnx.convert(grid_sample(), rules=low, runtime="cuda")
    assert not [w for w in single.plan.warnings if w.code == "fallback-region"]


def test_the_default_plan_warns_of_cuda_fallbacks_and_keeps_its_nodes(pinned_bn, low):
    """Planned for any runtime, a node a user's rule puts in fp16 (GridSample, which ONNX Runtime's
    CUDA provider registers for float only) stays fp16, and one warning says that the CUDA
    provider would run it on the CPU; the plan's own BatchNormalization choices never warn."""
    result = autocast_onnx.convert(grid_sample(), rules=low)
    assert node(result, "gs").precision == "fp16"
    (warning,) = [w for w in result.plan.warnings if w.code == "runtime-fallback"]
    assert "1 node(s) planned fp16" in warning.message and "GridSample 1" in warning.message
    assert "--runtime cuda" in warning.message
    cuda = autocast_onnx.convert(grid_sample(), rules=low, runtime="cuda")
    assert not [w for w in cuda.plan.warnings if w.code == "runtime-fallback"]
    for m in (conv_bn(flush=True), conv_bn()):
        bn = autocast_onnx.convert(m, rules=pinned_bn)
        assert not [w for w in bn.plan.warnings if w.code == "runtime-fallback"]
    plain = autocast_onnx.convert(conv(17))
    assert not [w for w in plain.plan.warnings if w.code == "runtime-fallback"]
