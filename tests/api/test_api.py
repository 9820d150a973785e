"""The Python API mirrors the CLI: planning on data, the check gate and plan replay are library
calls (the CLI only parses flags), and the version is written once."""

from __future__ import annotations

import importlib.metadata
import json

import numpy as np
import onnx
from helpers import parse, randn

import autocast_onnx

MODEL = """
net (float[2,8] x) => (float[2,8] y) {
    [fc1] h = MatMul(x, w1)
    [big] g = Mul(h, k)
    [fc2] z = MatMul(g, w2)
    [softmax] y = Softmax<axis = -1>(z)
}"""


def write_model(tmp_path):
    # k scales fc1's output past the fp16 range on the calibration data
    model = parse(MODEL, w1=randn([8, 8], 1), k=np.full([8], 3e4, np.float32), w2=randn([8, 8], 2, 1e-5))
    path = tmp_path / "net.onnx"
    onnx.save(model, path)
    return path


def test_plan_on_data_calibration_keeps_the_overflowing_node_fp32(tmp_path):
    path = write_model(tmp_path)
    np.savez(tmp_path / "calib.npz", x=randn([2, 8], 5, 4.0))
    measured = autocast_onnx.plan_on_data(path, calibration_data=tmp_path / "calib.npz")
    assert measured.calibration and measured.force_fp32 is None
    result = autocast_onnx.convert(path, calibration=measured.calibration)
    big = result.plan.by_name("big")[0]
    assert big.precision == "fp32" and any(r.code == "calibration" for r in big.reasons)
    plain = autocast_onnx.convert(path)
    assert plain.plan.by_name("big")[0].precision == "fp16"


def test_check_gate_as_a_library_call(tmp_path):
    path = write_model(tmp_path)
    result = autocast_onnx.check(path, speed=False, output=tmp_path / "out.onnx")
    assert isinstance(result, autocast_onnx.CheckResult)
    assert result.report["conversion"]["precision"] == "fp16"
    assert result.report["validation"] is not None
    assert result.passed == result.report["gate"]["passed"]
    assert (tmp_path / "out.onnx").is_file()
    json.dumps(result.report, default=float)  # serializable as written by --report-json


def test_plan_options_object_drives_the_same_conversion(tmp_path):
    path = write_model(tmp_path)
    options = autocast_onnx.PlanOptions(precision="bf16", exclude_ops=("Softmax",))
    via_options = autocast_onnx.convert(path, options=options)
    direct = autocast_onnx.convert(path, precision="bf16", exclude_ops=["Softmax"])
    assert via_options.model.SerializeToString() == direct.model.SerializeToString()


def test_version_is_written_once():
    assert importlib.metadata.version("autocast-onnx") == autocast_onnx.__version__
