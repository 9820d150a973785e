"""AC404 no-runtime-kernel: with --runtime, lint names every node whose fp16/bf16 type the runtime's kernel
table (catalog/kernels.py) says has no kernel at the model's opset. The model here is what a naive converter
writes: every float tensor fp16, GridSample included, at opset 16, where ONNX Runtime's CUDA provider registers
GridSample for float only (data/kernels_cuda.json). Without --runtime (or with any) nothing is reported."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import F16, init, model, tensor
from onnx import helper

import autocast_onnx
from autocast_onnx.catalog.kernels import has_kernel, runtime_label
from autocast_onnx.cli.main import cli


def naive_fp16_grid_sample():
    """x (fp16) -> Relu -> GridSample(grid fp16) -> Add(bias fp16) -> y (fp16), opset 16: all fp16, as a
    converter that casts everything writes it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("GridSample", ["r", "grid"], ["g"], name="sample"),
        helper.make_node("Add", ["g", "bias"], ["y"], name="add"),
    ]
    inits = [
        init("grid", np.zeros((1, 4, 4, 2), np.float16)),
        init("bias", np.ones((1, 3, 4, 4), np.float16)),
    ]
    return model(nodes, [tensor("x", F16, [1, 3, 4, 4])], [tensor("y", F16, [1, 3, 4, 4])], inits, opset=16)


def test_the_table_lacks_the_kernel_the_test_relies_on():
    assert has_kernel("cuda", "", "GridSample", 16, F16) is False
    assert has_kernel("cuda", "", "Relu", 16, F16) is True
    assert has_kernel("cuda", "", "Add", 16, F16) is True


def _lint_cli(path, *args, fmt="json"):
    result = CliRunner().invoke(cli, ["lint", "--format", fmt, str(path), *args], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_cli_names_the_fallback_node_only_with_a_runtime(tmp_path):
    path = tmp_path / "naive.onnx"
    path.write_bytes(naive_fp16_grid_sample().SerializeToString())
    found = [d for d in _lint_cli(path, "--runtime", "cuda")["diagnostics"] if d["code"] == "AC404"]
    assert [(d["node"], d["op_type"], d["severity"]) for d in found] == [("sample", "GridSample", "warning")]
    message = found[0]["message"]
    for words in ("GridSample", "fp16", "opset 16", runtime_label("cuda"), "CPU provider", "copies"):
        assert words in message, message
    for extra in ((), ("--runtime", "any")):
        assert not [d for d in _lint_cli(path, *extra)["diagnostics"] if d["code"] == "AC404"]


def test_sarif_and_text_carry_the_code(tmp_path):
    path = tmp_path / "naive.onnx"
    path.write_bytes(naive_fp16_grid_sample().SerializeToString())
    sarif = _lint_cli(path, "--runtime", "cuda", fmt="sarif")
    assert "AC404" in [r["ruleId"] for r in sarif["runs"][0]["results"]]
    text = CliRunner().invoke(cli, ["lint", str(path), "--runtime", "cuda"], catch_exceptions=False).stdout
    assert "AC404" in text and "sample" in text


@pytest.mark.parametrize("runtime, expected", [("cuda", ["sample"]), (None, []), ("any", [])])
def test_python_api(runtime, expected):
    report = autocast_onnx.lint(naive_fp16_grid_sample(), runtime=runtime)
    assert [f.node for f in report.findings if f.code == "AC404"] == expected


def test_a_split_tie_is_named_on_a_mixed_batch_norm(tmp_path):
    """fp16 data with fp32 scale/bias/mean/var: the CUDA kernel binds them to one type, so lint names the node."""
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")]
    inits = [init(n, np.ones(3, np.float32)) for n in "sbmv"]
    mixed = model(nodes, [tensor("x", F16, [1, 3, 4, 4])], [tensor("y", F16, [1, 3, 4, 4])], inits, opset=17)
    path = tmp_path / "mixed.onnx"
    path.write_bytes(mixed.SerializeToString())
    found = [d for d in _lint_cli(path, "--runtime", "cuda")["diagnostics"] if d["code"] == "AC404"]
    assert [d["node"] for d in found] == ["bn"]
    assert "takes one type for T, T1, T2" in found[0]["message"]
    assert not [d for d in _lint_cli(path, "--runtime", "tensorrt")["diagnostics"] if d["code"] == "AC404"]
