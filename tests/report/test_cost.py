"""The summary's cost figures (report/cost.py): casts added and the bytes they move per
inference, and the share of MatMul/Gemm/Conv multiply-accumulates in low precision, computed
from shapes and checked here by hand on small graphs."""

from __future__ import annotations

import numpy as np
from helpers import cost_of, parse, randn

import autocast_onnx
from autocast_onnx.report import conversion_summary


def conv_bn(batch="1"):
    return parse(
        f"""
        cb (float[{batch},3,8,8] x) => (float[{batch},4,8,8] y) {{
            [conv] h = Conv <pads = [1, 1, 1, 1]> (x, w)
            [bn] y = BatchNormalization(h, s, b, m, v)
        }}""",
        w=randn([4, 3, 3, 3]),
        s=np.ones(4, np.float32),
        b=np.zeros(4, np.float32),
        m=np.zeros(4, np.float32),
        v=np.ones(4, np.float32),
    )


def test_casts_and_macs_of_conv_then_batchnorm_are_counted_from_shapes():
    result = autocast_onnx.convert(conv_bn())
    cost = cost_of(result)
    # x -> fp16 (192 values, 4 bytes read + 2 written) and the Conv's fp16 output -> fp32 for the
    # BatchNormalization (256 values, 2 read + 4 written)
    assert cost["casts"] == result.stats.casts_added == 2
    assert cost["cast_bytes"] == 192 * 6 + 256 * 6
    assert cost["macs"] == 1 * 4 * 8 * 8 * (3 * 3 * 3)
    assert cost["macs_low_precision"] == cost["macs"]
    assert cost["casts_unknown_size"] == cost["mac_nodes_unknown_shape"] == 0
    text = conversion_summary(result)
    assert "cast traffic: 2 casts move 2.69 KB per inference" in text
    assert "low-precision share of MatMul/Gemm/Conv work: 100.0% of 6,912 MACs" in text


def test_named_dimensions_take_validations_sizes_and_fp32_matmuls_lower_the_share(tmp_path):
    assert cost_of(autocast_onnx.convert(conv_bn("N")))["macs"] == 3 * 6912  # N: a batch, 3 as validate generates
    m = parse(
        """
        two (float[2,16] x) => (float[2,16] y) {
            [fast] h = MatMul(x, w1)
            [slow] y = MatMul(h, w2)
        }""",
        w1=randn([16, 16]),
        w2=randn([16, 16], seed=1),
    )
    rules = tmp_path / "r.toml"
    rules.write_text('[[nodes]]\nmatch = "^slow$"\nprecision = "fp32"\nwhy = "test"\n')
    cost = cost_of(autocast_onnx.convert(m, rules=[rules]))
    assert cost["macs"] == 2 * 2 * 16 * 16 and cost["macs_low_precision"] == 2 * 16 * 16


def test_unknown_shapes_are_reported_not_guessed():
    m = parse(
        """
        dyn (float[N,16] x, int64[2] shape) => (float[?,?] y) {
            [r] r = Reshape(x, shape)
            [mm] y = MatMul(r, w)
        }""",
        w=randn([16, 16]),
    )
    cost = cost_of(autocast_onnx.convert(m))
    assert cost["mac_nodes_unknown_shape"] == 1 and cost["macs"] == 0
    assert "unknown (no shape known for any of the 1 MatMul/Gemm/Conv)" in conversion_summary(autocast_onnx.convert(m))


def test_shapes_computed_through_shape_ops_are_followed():
    # the MatMul's input shape is known only by propagating Shape's value into Reshape
    import onnx

    from autocast_onnx.graph.shapes import node_macs, tensor_shapes

    m = parse(
        """
        reshaped (float[4,16] x) => (float[4,8] y) {
            s = Shape(x)
            rows = Gather<axis=0>(s, zero)
            t = Concat<axis=0>(rows, minus_one)
            r = Reshape(x, t)
            y = MatMul(r, w)
        }""",
        w=randn([16, 8]),
        zero=np.array([0], np.int64),
        minus_one=np.array([-1], np.int64),
    )
    shapes = tensor_shapes(m)
    assert shapes["r"] == (1, (4, 16))
    assert node_macs(m, shapes) == [4 * 16 * 8]
    # without data propagation inference cannot say: the check is not vacuous
    plain = onnx.shape_inference.infer_shapes(m)
    r = next(vi for vi in plain.graph.value_info if vi.name == "r")
    assert not all(d.HasField("dim_value") for d in r.type.tensor_type.shape.dim)
