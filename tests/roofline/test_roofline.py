"""The GPU cost model (autocast_onnx/roofline, issue 38): small graphs priced by hand, fusions as
one kernel, monotonicity (removing a Cast never raises the estimate), the convert summary's line
and JSON figures, and the GPU table's validation."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import F32, init, model, randn, tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index
from autocast_onnx.graph.shapes import tensor_shapes
from autocast_onnx.plan import fusions
from autocast_onnx.report.speed import speed
from autocast_onnx.report.summary import conversion_summary, summary_dict
from autocast_onnx.roofline import estimate, gpu, table

ROOT = Path(__file__).resolve().parents[2]
F16 = TensorProto.FLOAT16


def price(m: onnx.ModelProto, name="H100", fused=(), tf32=True):
    return estimate(m.graph.node, [o.name for o in m.graph.output], gpu(name), tensor_shapes(m), fused, tf32)


def matmul(n: int, elem: int):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")]
    ios = [tensor("a", elem, [n, n]), tensor("b", elem, [n, n])]
    return model(nodes, ios, [tensor("c", elem, [n, n])])


@pytest.mark.parametrize(("elem", "kind", "size"), [(F32, "tf32", 4), (F16, "fp16", 2)])
def test_a_matmul_is_priced_at_its_types_peak_or_its_bytes(elem, kind, size):
    n = 1024
    e = price(matmul(n, elem))
    [k] = e.kernels
    t, h100 = table(), gpu("H100")
    flops, moved = 2 * n**3, 3 * n * n * size
    compute = flops / (h100.peak(kind) * t.compute_efficiency)
    memory = moved / (h100.bandwidth * 1e12 * t.bandwidth_efficiency)
    assert (k.flops, k.bytes, k.kind) == (flops, moved, kind)
    assert k.seconds == pytest.approx(max(compute, memory, t.launch_s))
    assert k.bound == ("launch" if max(compute, memory) < t.launch_s else "compute" if compute > memory else "memory")


def test_fp32_products_without_tf32_take_the_fp32_peak():
    on, off = price(matmul(2048, F32)), price(matmul(2048, F32), tf32=False)
    assert on.kernels[0].kind == "tf32" and off.kernels[0].kind == "fp32"
    assert off.seconds > on.seconds


def test_a_cast_moves_what_it_reads_and_writes():
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=F16, name="c")]
    m = model(nodes, [tensor("x", F32, [256, 1024])], [tensor("y", F16, [256, 1024])])
    [k] = price(m).kernels
    t = table()
    assert k.bytes == 256 * 1024 * (4 + 2) and k.flops == 0 and k.op == "Cast"
    assert k.seconds == pytest.approx(
        max(k.bytes / (gpu("H100").bandwidth * 1e12 * t.bandwidth_efficiency), t.launch_s)
    )


def add_layer_norm():
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"], name="add"),
        helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], name="ln", axis=-1),
    ]
    inits = [init("g", np.ones(768, np.float32)), init("b", np.zeros(768, np.float32))]
    return model(
        nodes, [tensor("x", F32, [128, 768]), tensor("r", F32, [128, 768])], [tensor("y", F32, [128, 768])], inits
    )


def test_a_fused_pattern_is_one_kernel_whose_inner_tensor_stays_on_chip():
    m = add_layer_norm()
    apart, fused = price(m), price(m, fused=[("s", "y")])
    assert len(apart.kernels) == 2 and len(fused.kernels) == 1
    [k] = fused.kernels
    act, vec = 128 * 768 * 4, 768 * 4
    assert k.bytes == 3 * act + 2 * vec  # x, r and y; gamma and beta: not s
    assert k.op == "Add+LayerNormalization"
    assert fused.seconds < apart.seconds


def test_free_ops_launch_nothing_and_unknown_sizes_are_counted():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    m = model(nodes, [tensor("x", F32, ["n", 8])], [tensor("y", F32, None)], [init("shape", np.array([-1], np.int64))])
    e = estimate(m.graph.node, ["y"], gpu(None), {}, ())
    assert [k.op for k in e.kernels] == ["Relu"] and e.unpriced == 1
    assert e.kernels[0].seconds == table().launch_s


def chain_with_cast(rows: int, cols: int, cast: bool):
    """x -> Relu -> [Cast to fp16 -> Cast to fp32] -> Relu -> y."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1")]
    last = "a"
    if cast:
        nodes += [
            helper.make_node("Cast", ["a"], ["a16"], to=F16, name="down"),
            helper.make_node("Cast", ["a16"], ["a32"], to=TensorProto.FLOAT, name="up"),
        ]
        last = "a32"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="r2"))
    return model(nodes, [tensor("x", F32, [rows, cols])], [tensor("y", F32, [rows, cols])])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 4096), st.sampled_from(sorted(table().gpus)))
def test_removing_a_cast_never_raises_the_estimate(rows, cols, name):
    with_cast, without = price(chain_with_cast(rows, cols, True), name), price(chain_with_cast(rows, cols, False), name)
    assert without.seconds <= with_cast.seconds
    assert with_cast.seconds_of("Cast") > 0 and without.seconds_of("Cast") == 0


def test_the_gpu_table_names_every_gpu_with_a_source_and_refuses_an_unknown_one():
    t = table()
    assert {"H100", "H200", "A100", "L4", "L40S", "RTX4090", "RTX3060", "Orin"} <= set(t.gpus)
    for row in t.gpus.values():
        assert row.source and row.bandwidth > 0 and row.fp16 >= row.tf32 > 0
    assert gpu("rtx-4090").key == "RTX4090" and gpu(None).key == t.default
    with pytest.raises(AutocastError) as err:
        gpu("V100")
    assert "unknown GPU 'V100'" in str(err.value) and "H100, H200, A100" in str(err.value)


def test_the_summary_states_the_estimate_and_the_json_carries_it():
    result = autocast_onnx.convert(str(ROOT / "examples/models/bert_tiny.onnx"))
    s = summary_dict(result)["speed"]
    assert s["computed"] and s["gpu"] == "H100" and s["open_dims"] == {"batch": 3, "sequence": 16}
    assert s["fp32_ms"] > 0 and s["converted_ms"] > 0
    assert s["speedup"] == pytest.approx(s["fp32_ms"] / s["converted_ms"])
    assert 0 < s["cast_ms"] < s["converted_ms"]
    [line] = [x for x in conversion_summary(result).splitlines() if x.startswith("estimated on H100")]
    assert "an estimate, not a measurement" in line and "ignores" in line
    other = autocast_onnx.convert(str(ROOT / "examples/models/bert_tiny.onnx"), gpu="L4")
    slow = speed(other, other.gpu)
    assert slow["gpu"] == "L4" and slow["fp32_ms"] >= s["fp32_ms"]  # launch-bound: a kernel's dispatch at least
    with pytest.raises(AutocastError, match="unknown GPU"):
        autocast_onnx.convert(str(ROOT / "examples/models/bert_tiny.onnx"), gpu="nope")


def test_the_fp32_figure_is_the_model_as_read():
    """The estimate of the fp32 model, made after the rewrite from what the index read, is the
    estimate of the file itself with its Conv -> BatchNormalization fusions, and the conversion's
    counts its Casts."""
    path = ROOT / "examples/models/resnet_tiny.onnx"
    result = autocast_onnx.convert(str(path))
    s = speed(result)
    source = onnx.load(str(path))
    groups = [tuple(n.outputs[0].name for n in f.nodes) for f in fusions.find(build_index(source))]
    assert groups and all(len(g) == 2 for g in groups)
    direct = price(source, fused=groups)
    assert s["fp32_ms"] == pytest.approx(direct.seconds * 1e3)
    assert price(source).seconds > direct.seconds
    assert s["kernels"]["converted"] == s["kernels"]["fp32"] + result.stats.casts_added


@pytest.mark.slow
def test_the_command_line_takes_gpu_from_the_flag_or_the_configuration(tmp_path):
    src = ROOT / "examples/models/digits_cnn.onnx"
    run = [sys.executable, "-m", "autocast_onnx", "convert", str(src)]
    ok = subprocess.run([*run, "-o", str(tmp_path / "a.onnx"), "--gpu", "a100"], capture_output=True, text=True)
    assert ok.returncode == 0 and "estimated on A100" in ok.stdout
    bad = subprocess.run([*run, "-o", str(tmp_path / "b.onnx"), "--gpu", "V100"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and not (tmp_path / "b.onnx").exists()
    assert bad.stderr.count("\n") == 1 and "unknown GPU 'V100'" in bad.stderr and "RTX4090" in bad.stderr
    (tmp_path / "autocast-onnx.toml").write_text('gpu = "L40S"\n')
    cfg = subprocess.run([*run, "-o", str(tmp_path / "c.onnx")], capture_output=True, text=True, cwd=tmp_path)
    assert cfg.returncode == 0 and "estimated on L40S" in cfg.stdout
    (tmp_path / "autocast-onnx.toml").write_text('gpu = "K80"\n')
    wrong = subprocess.run([*run, "-o", str(tmp_path / "d.onnx")], capture_output=True, text=True, cwd=tmp_path)
    assert wrong.returncode == 2 and "unknown GPU 'K80'" in wrong.stderr


def test_an_attention_op_counts_its_products():
    nodes = [helper.make_node("Attention", ["x", "w", "bias"], ["y"], name="att", domain="com.microsoft", num_heads=4)]
    m = model(
        nodes,
        [tensor("x", F32, [2, 64, 256])],
        [tensor("y", F32, [2, 64, 256])],
        [init("w", randn([256, 768], 1)), init("bias", randn([768], 2))],
        extra_opsets=[("com.microsoft", 1)],
    )
    [k] = price(m).kernels
    assert k.flops == 2 * (2 * 64 * 256 * 768 + 2 * 2 * 64 * 64 * 256) and k.kind == "tf32"
    assert math.isfinite(k.seconds)


@pytest.mark.slow
def test_dim_sizes_the_estimate_and_the_cast_traffic(tmp_path):
    """convert --dim (API dims=) sizes the open input dimensions of the summary's figures; without it they
    take the sizes validation generates. --dim needs no --validate for that."""
    path = str(ROOT / "examples/models/vit_tiny.onnx")
    plain = autocast_onnx.convert(path)
    wide = autocast_onnx.convert(path, dims={"batch": 4096})
    a, b = speed(plain), speed(wide)
    assert a["open_dims"] == {"batch": 3} and b["open_dims"] == {"batch": 4096}
    assert b["fp32_ms"] > a["fp32_ms"]  # 4096 images: no longer dispatch-bound
    assert summary_dict(wide)["cost"]["cast_bytes"] > summary_dict(plain)["cost"]["cast_bytes"]
    run = [
        sys.executable,
        "-m",
        "autocast_onnx",
        "convert",
        path,
        "-o",
        str(tmp_path / "v.onnx"),
        "--dim",
        "batch=4096",
    ]
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "estimated on H100 (NVIDIA H100 SXM5 80 GB) at batch=4096" in out.stdout
    assert "open input dims at the sizes --dim gives: batch=4096" in out.stdout
