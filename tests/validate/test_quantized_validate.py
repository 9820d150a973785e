"""Validation of quantized (Q/DQ) models (issue 29, item 4): the emulation computes the int8 path
exactly and rounds the fp16 remainder; the report says which nodes stay int8 and whether ONNX
Runtime's CPU optimizer still fuses them (autocast_onnx/validate/fusion.py); `validate` and
`check` run on a hand-made Q/DQ graph and on an example model quantized with ONNX Runtime's
static QDQ quantizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

from autocast_onnx.gate import check
from autocast_onnx.report.validation import validation_text
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.emulate import emulation_model
from autocast_onnx.validate.fusion import fused_int8_ops, qdq_units
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "models" / "digits_cnn.onnx"
CPU = ["CPUExecutionProvider"]


def qdq_conv(opset: int = 17, float_type: int = T.FLOAT, cast_between: bool = False) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv (weights int8 through DQ, per channel) -> Q -> DQ -> y: one int8 unit,
    scales of `float_type` (fp16 scales need opset 19). `cast_between` puts a round trip through
    fp16 (two Casts) between the activation's DequantizeLinear and the Conv, as a converter that
    breaks units does (ONNX Runtime would drop one Cast to the type it already has)."""
    npf = np.float16 if float_type == T.FLOAT16 else np.float32
    rng = np.random.default_rng(0)
    inits = [
        nh.from_array(np.array(0.02, npf), "s_x"),
        nh.from_array(np.array(128, np.uint8), "z_x"),
        nh.from_array(rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "w_q"),
        nh.from_array((rng.random(4) * 0.01 + 0.001).astype(npf), "s_w"),
        nh.from_array(np.zeros(4, np.int8), "z_w"),
        nh.from_array(np.array(0.05, npf), "s_y"),
        nh.from_array(np.array(128, np.uint8), "z_y"),
    ]
    conv_in = "xd_cast" if cast_between else "xd"
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], name="q_in"),
        h.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], name="dq_in"),
        h.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["wd"], name="dq_w", axis=0),
        *(
            [
                h.make_node("Cast", ["xd"], ["xd_fp16"], name="between", to=T.FLOAT16),
                h.make_node("Cast", ["xd_fp16"], ["xd_cast"], name="back", to=float_type),
            ]
            if cast_between
            else []
        ),
        h.make_node("Conv", [conv_in, "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("QuantizeLinear", ["c", "s_y", "z_y"], ["cq"], name="q_out"),
        h.make_node("DequantizeLinear", ["cq", "s_y", "z_y"], ["y"], name="dq_out"),
    ]
    graph = h.make_graph(
        nodes, "qdq_conv", [h.make_tensor_value_info("x", float_type, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", float_type, [1, 4, 8, 8])], inits,
    )  # fmt: skip
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.checker.check_model(m, full_check=True)
    return m


def qdq_mul_fp16() -> onnx.ModelProto:
    """Opset 19, fp16 scales, elementwise only (so numpy computes it exactly): x -> Q -> DQ, times
    DQ(int8 weights), -> Q -> DQ -> y; the int8 tensors xq and mq are outputs too."""
    rng = np.random.default_rng(1)
    inits = [
        nh.from_array(np.array(0.0137, np.float16), "s_x"),
        nh.from_array(np.array(3, np.int8), "z_x"),
        nh.from_array(rng.integers(-128, 128, (64,)).astype(np.int8), "w_q"),
        nh.from_array(np.array(0.00391, np.float16), "s_w"),
        nh.from_array(np.array(-2, np.int8), "z_w"),
        nh.from_array(np.array(0.0021, np.float16), "s_m"),
        nh.from_array(np.array(1, np.int8), "z_m"),
    ]
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"]),
        h.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"]),
        h.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["wd"]),
        h.make_node("Mul", ["xd", "wd"], ["m"]),
        h.make_node("QuantizeLinear", ["m", "s_m", "z_m"], ["mq"]),
        h.make_node("DequantizeLinear", ["mq", "s_m", "z_m"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "qdq_mul", [h.make_tensor_value_info("x", T.FLOAT16, [64])],
        [h.make_tensor_value_info(n, t, [64]) for n, t in (("y", T.FLOAT16), ("xq", T.INT8), ("mq", T.INT8))], inits,
    )  # fmt: skip
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])
    m.ir_version = 9
    onnx.checker.check_model(m, full_check=True)
    return m


def _emulated(m: onnx.ModelProto):
    """A session of the emulation of `m`, without graph optimizations, as validation runs it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(emulation_model(m).SerializeToString(), options, providers=CPU)


def _quantize(q: np.ndarray, scale, zero) -> np.ndarray:
    """QuantizeLinear as ONNX defines it for int8: round half to even, add the zero point, saturate."""
    return np.clip(np.rint(q / np.float32(scale)) + zero, -128, 127).astype(np.int8)


def test_emulation_computes_the_int8_path_exactly_and_rounds_the_fp16_remainder():
    m = qdq_mul_fp16()
    x = (np.random.default_rng(2).standard_normal(64) * 1.5).astype(np.float16)
    s = {i.name: nh.to_array(i) for i in m.graph.initializer}
    # the spec in numpy: (q - zero) * scale in fp32 is exact for 8-bit q and fp16 scales, then rounds to fp16
    xq = _quantize(x.astype(np.float32), s["s_x"], s["z_x"])
    xd = ((xq.astype(np.float32) - s["z_x"]) * np.float32(s["s_x"])).astype(np.float16)
    wd = ((s["w_q"].astype(np.float32) - s["z_w"]) * np.float32(s["s_w"])).astype(np.float16)
    mul = (xd.astype(np.float32) * wd.astype(np.float32)).astype(np.float16)
    mq = _quantize(mul.astype(np.float32), s["s_m"], s["z_m"])
    y = ((mq.astype(np.float32) - s["z_m"]) * np.float32(s["s_m"])).astype(np.float16)
    assert {i.data_type for i in emulation_model(m).graph.initializer if i.name.startswith("s_")} == {T.FLOAT}
    got = _emulated(m).run(["y", "xq", "mq"], {"x": x})
    assert got[0].dtype == np.float16 and np.array_equal(got[0], y)
    assert np.array_equal(got[1], xq) and np.array_equal(got[2], mq)
    # the fp16 rounding is there: the fp32 product differs from its fp16 rounding somewhere
    exact = xd.astype(np.float32) * wd.astype(np.float32)
    assert np.any(exact != mul.astype(np.float32))
    # and ONNX Runtime running the model itself agrees with its emulation
    as_is = ort.InferenceSession(m.SerializeToString(), providers=CPU).run(["y", "xq", "mq"], {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(as_is, got))


def test_qdq_units_name_the_unit_and_the_cast_that_breaks_it():
    intact = qdq_units(qdq_conv())
    assert intact["units"] == {"Conv": 1} and intact["unit_nodes"] == ["conv"]
    assert intact["quantized_outputs"] == 1 and intact["between"] == []
    assert intact["dequantize"] == 3 and intact["quantize"] == 2 and intact["scale_types"] == {"fp32": 5}
    broken = qdq_units(qdq_conv(cast_between=True))
    assert broken["units"] == {} and broken["between"] == [{"node": "between", "next_to": "dq_in"}]
    assert qdq_units(qdq_conv(19, T.FLOAT16))["scale_types"] == {"fp16": 5}


def test_fusion_counts_qlinear_conv_and_fp16_scales_prevent_the_cpu_fusion():
    assert fused_int8_ops(qdq_conv()).ops == {"QLinearConv": 1}
    assert fused_int8_ops(qdq_conv(19)).ops == {"QLinearConv": 1}
    # ONNX Runtime's CPU QDQ fusions take fp32 scales only (docs/quantized.md)
    assert fused_int8_ops(qdq_conv(19, T.FLOAT16)).ops == {}
    assert fused_int8_ops(qdq_conv(cast_between=True)).ops == {}
    broken = fused_int8_ops(b"not a model")
    assert broken.ops is None and "did not optimize" in broken.note


def test_validate_says_which_units_a_cast_broke_and_that_the_fusion_is_lost(tmp_path):
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(qdq_conv(), ref)
    onnx.save(qdq_conv(cast_between=True), conv)
    report = validate(str(ref), str(conv), ValidateOptions(device="cpu"))
    q = report["quantized"]
    assert q["reference"]["units"] == {"Conv": 1} and q["converted"]["units"] == {}
    assert q["fusion"]["reference"] == {"QLinearConv": 1} and q["fusion"]["converted"] == {}
    text = validation_text(report)
    assert "int8 units: 0 in the converted model, 1 (Conv 1) in the reference; 1 Cast(s) between" in text
    assert "between a Q/DQ node and its op (0 in the reference); Q/DQ scales fp32 5" in text
    assert "ONNX Runtime CPU int8 fusion (extended): converted 0, reference 1 (QLinearConv 1)" in text
    assert "between (next to dq_in)" in text and "fuses 0 int8 operator(s) in the converted model, 1 in" in text
    assert report["outputs"][0]["max_abs_error"] < 0.051  # a step of the output's scale (0.05) at most
    assert "output y is dequantized in steps of 0.05: its max abs error is 1 step(s)" in text


def test_validate_of_a_model_without_qdq_has_no_quantized_section(tmp_path):
    report = validate(str(DIGITS), str(DIGITS), ValidateOptions(device="cpu"))
    assert report["quantized"] is None and "int8 units" not in validation_text(report)


class _Reader(CalibrationDataReader):
    """ONNX Runtime's calibration reader over batches the validator would generate."""

    def __init__(self, model: onnx.ModelProto, batches: int = 2):
        plan = plan_inputs(describe_inputs(model), {}, {})
        self.batches = iter([generate(plan, seed=k) for k in range(batches)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def quantized_digits(tmp_path_factory) -> Path:
    """examples/models/digits_cnn.onnx quantized with quantize_static, QDQ format, opset 17."""
    out = tmp_path_factory.mktemp("quantized") / "digits_cnn.q.onnx"
    quantize_static(str(DIGITS), str(out), _Reader(onnx.load(DIGITS)), quant_format=QuantFormat.QDQ)
    return out


def test_validate_an_ort_quantized_model_against_itself_computes_the_same(quantized_digits):
    """The emulation of an fp32 Q/DQ model is the model; the reference runs unfused as it does,
    so nothing differs (with ORT's fused kernels in the reference, outputs moved by a step)."""
    report = validate(str(quantized_digits), str(quantized_digits), ValidateOptions(device="cpu"))
    assert all(o["max_abs_error"] == 0 for o in report["outputs"]), report["outputs"]
    q = report["quantized"]
    assert q["fusion"]["reference"] == q["fusion"]["converted"]
    assert q["fusion"]["reference"]["QLinearConv"] == 2 and q["fusion"]["reference"]["QGemm"] == 2
    assert q["reference"]["units"]["Conv"] == 2 and q["converted"] == q["reference"]
    assert any("ran without ONNX Runtime's graph optimizations" in n for n in q["notes"])


def test_check_runs_on_an_ort_quantized_model_and_keeps_its_int8_units(quantized_digits, tmp_path):
    result = check(quantized_digits, output=tmp_path / "out.onnx")
    v = result.report["validation"]
    q = v["quantized"]
    assert q["converted"]["between"] == [], q["converted"]["between"]
    assert q["converted"]["units"] == q["reference"]["units"]
    assert q["fusion"]["converted"] == q["fusion"]["reference"]
    assert "int8 units: " in result.text()


def test_check_on_a_small_qdq_graph_keeps_the_unit(tmp_path):
    src = tmp_path / "qdq_conv.onnx"
    onnx.save(qdq_conv(), src)
    result = check(src, output=tmp_path / "out.onnx")
    q = result.report["validation"]["quantized"]
    assert q["converted"]["units"] == {"Conv": 1} and q["converted"]["between"] == []
    assert q["fusion"]["converted"] == {"QLinearConv": 1}


def test_validate_says_fp16_scales_stop_the_cpu_fusion(tmp_path):
    """At opset 19 a converter may give the Q/DQ nodes fp16 scales: the unit stays intact (no
    Cast), yet ONNX Runtime's CPU provider no longer fuses it, and the report says why."""
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(qdq_conv(19), ref)
    onnx.save(qdq_conv(19, T.FLOAT16), conv)
    report = validate(str(ref), str(conv), ValidateOptions(device="cpu"))
    q = report["quantized"]
    assert q["converted"]["units"] == {"Conv": 1} and q["converted"]["between"] == []
    assert q["converted"]["scale_types"] == {"fp16": 5}
    assert q["fusion"]["reference"] == {"QLinearConv": 1} and q["fusion"]["converted"] == {}
    text = validation_text(report)
    assert "its QDQ fusions take fp32 scales only, and the converted model's Q/DQ scales are fp16" in text
    assert "Cast(s) the reference does not have" not in text


def test_convert_at_opset_19_keeps_the_unit_with_fp16_scales(tmp_path):
    """The conversion with --opset 19, validated: the unit is intact with fp16 scales, and the
    emulated output is within a step of the output's quantization of the reference."""
    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli

    src, out = tmp_path / "qdq_conv.onnx", tmp_path / "out.onnx"
    onnx.save(qdq_conv(), src)
    run = CliRunner().invoke(cli, ["convert", str(src), "-o", str(out), "--opset", "19"])
    assert run.exit_code == 0, run.output
    report = validate(str(src), str(out), ValidateOptions(device="cpu"))
    q = report["quantized"]
    assert q["converted"]["units"] == {"Conv": 1} and q["converted"]["between"] == []
    assert "fp16" in q["converted"]["scale_types"]
    assert report["outputs"][0]["max_abs_error"] < 0.051


def test_casts_at_the_model_inputs_and_outputs_break_no_unit():
    """A converter's input cast into a QuantizeLinear, or output cast after a DequantizeLinear,
    separates no op from its Q/DQ node: not counted as between."""
    m = qdq_conv()
    m.graph.node[0].input[0] = "x_cast"
    m.graph.node[-1].output[0] = "y_pre"
    m.graph.node.insert(0, h.make_node("Cast", ["x"], ["x_cast"], name="in_cast", to=T.FLOAT))
    m.graph.node.append(h.make_node("Cast", ["y_pre"], ["y"], name="out_cast", to=T.FLOAT))
    units = qdq_units(m)
    assert units["between"] == [] and units["units"] == {"Conv": 1}


def test_the_html_report_carries_the_int8_lines(tmp_path):
    from autocast_onnx.report.html import validation_html

    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(qdq_conv(), ref)
    onnx.save(qdq_conv(cast_between=True), conv)
    page = validation_html(validate(str(ref), str(conv), ValidateOptions(device="cpu")))
    assert "<h2>Int8 units (Q/DQ)</h2>" in page and "ONNX Runtime CPU int8 fusion (extended): converted 0" in page
    assert "Int8 units" not in validation_html(validate(str(DIGITS), str(DIGITS), ValidateOptions(device="cpu")))


def weight_only_int4(float_type: int = T.FLOAT16) -> onnx.ModelProto:
    """Opset 21 weight-only quantization: MatMul(x, DequantizeLinear(int4 weights, blocked scales))."""
    rng = np.random.default_rng(3)
    npf = np.float16 if float_type == T.FLOAT16 else np.float32
    weights = h.make_tensor("w_q", T.INT4, [32, 16], rng.integers(-8, 8, 32 * 16).tolist())
    scales = nh.from_array((rng.random((2, 16)) * 0.05 + 0.01).astype(npf), "s_w")
    nodes = [
        h.make_node("DequantizeLinear", ["w_q", "s_w"], ["wd"], axis=0, block_size=16),
        h.make_node("MatMul", ["x", "wd"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "weight_only", [h.make_tensor_value_info("x", float_type, [4, 32])],
        [h.make_tensor_value_info("y", float_type, [4, 16])], [weights, scales],
    )  # fmt: skip
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def test_weight_only_int4_is_counted_fused_and_emulated_exactly():
    m = weight_only_int4()
    units = qdq_units(m)
    assert units["units"] == {} and units["weight_only"] == {"MatMul": 1} and units["scale_types"] == {"fp16": 1}
    assert fused_int8_ops(m).ops == {"MatMulNBits": 1}
    x = np.random.default_rng(4).standard_normal((4, 32)).astype(np.float16)
    w = nh.to_array(m.graph.initializer[0]).astype(np.float32)
    s = np.repeat(nh.to_array(m.graph.initializer[1]).astype(np.float32), 16, axis=0)
    # the 4-bit weights times fp16 scales are exact in fp32, rounded to fp16; the MatMul sums in fp32
    wd = (w * s).astype(np.float16).astype(np.float32)
    expected = (x.astype(np.float32) @ wd).astype(np.float16)
    got = _emulated(m).run(None, {"x": x})[0]
    assert got.dtype == np.float16 and np.array_equal(got, expected)


def test_validate_reports_weight_only_units(tmp_path):
    ref, conv = tmp_path / "ref.onnx", tmp_path / "conv.onnx"
    onnx.save(weight_only_int4(T.FLOAT), ref)
    onnx.save(weight_only_int4(), conv)
    report = validate(str(ref), str(conv), ValidateOptions(device="cpu"))
    text = validation_text(report)
    assert "weight-only quantized: 1 (MatMul 1) in the converted model, 1 in the reference" in text
    assert report["quantized"]["fusion"]["converted"] == {"MatMulNBits": 1}
