"""Q/DQ-aware planning (plan/qdq.py): a DequantizeLinear, the op it feeds and the QuantizeLinear of
that op's output form one unit that no cast splits. Below opset 19 the unit keeps its fp32
interface; from opset 19 its scales become fp16 and the unit runs in fp16. Checked on small
graphs quantized by ONNX Runtime's static QDQ quantizer, on the quantized example models (whose
int8 fusions ONNX Runtime's CPU optimizer must still find), and on weight-only graphs."""

from __future__ import annotations

import helpers as H
import numpy as np
import onnx
import pytest
import qdq_helpers as Q
from onnx import TensorProto, helper

import autocast_onnx

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def conv_block(opset: int) -> onnx.ModelProto:
    """Conv + BatchNormalization + Relu + a residual Add: a ResNet block."""
    c = 4
    return H.parse(
        f"""
        block (float[1,{c},8,8] x) => (float[1,{c},8,8] y) {{
            [conv] h = Conv <pads = [1, 1, 1, 1]> (x, w, b)
            [bn] n = BatchNormalization (h, gamma, beta, mean, var)
            [relu] r = Relu (n)
            [residual] y = Add (r, x)
        }}""",
        opset=opset,
        w=H.randn([c, c, 3, 3], 1, 0.3),
        b=H.randn([c], 2, 0.1),
        gamma=np.ones(c, np.float32),
        beta=np.zeros(c, np.float32),
        mean=H.randn([c], 3, 0.1),
        var=np.ones(c, np.float32),
    )


def attention(opset: int) -> onnx.ModelProto:
    """MatMul, Div, Add(mask), Softmax, MatMul: an attention block."""
    m = H.attention_block()
    m.opset_import[0].version = opset
    return m


SMALL = {"conv_block": conv_block, "attention": attention}


def quantized_small(name: str, opset: int) -> str:
    return Q.quantized(Q.save(SMALL[name](opset), f"{name}_{opset}.onnx"))


def convert_file(path: str, **kw):
    result = autocast_onnx.convert(onnx.load(path), **kw)
    out = Q.save(result.model, path.rsplit("/", 1)[-1].replace(".onnx", f"_{kw.get('precision', 'fp16')}.onnx"))
    return result, out


def assert_units_whole(original: str, converted: onnx.ModelProto) -> None:
    """Every DequantizeLinear feeds exactly the nodes it fed, every QuantizeLinear reads exactly the
    node it read: no node came between them."""
    before = Q.wiring(onnx.load(original))
    assert Q.wiring(converted) == before
    assert before[0] and Q.split_units(converted) == []


def qdq_nodes(m: onnx.ModelProto):
    return [n for n in m.graph.node if n.op_type in ("DequantizeLinear", "QuantizeLinear")]


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("opset", [17, 19])
def test_small_units_stay_whole_and_run(name, opset):
    source = quantized_small(name, opset)
    assert onnx.load(source).opset_import[0].version == opset
    result, out = convert_file(source)
    assert_units_whole(source, result.model)
    reference, outputs = Q.run(source), Q.run(out)
    for a, b in zip(reference, outputs):
        np.testing.assert_allclose(a, b, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_below_opset_19_units_keep_their_fp32_interface(name):
    source = quantized_small(name, 17)
    result, out = convert_file(source)
    types = Q.elem_types(result.model)
    for node in qdq_nodes(result.model):
        assert types[node.input[1]] == F32, node.name  # scales stay fp32
        assert types[node.input[2]] in (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32)
    op = "conv" if name == "conv_block" else "scores"
    entry = result.plan.by_name(op)[0]
    assert entry.precision == "fp32" and entry.reasons[-1].code == "qdq-unit"
    assert "opset 19" in entry.reasons[-1].message
    warning = next(w for w in result.plan.warnings if w.code == "qdq-opset")
    assert "--opset 19" in warning.message and "keep their fp32 interface" in warning.message
    assert not [w for w in result.plan.warnings if w.code == "schema-limited" and "QuantizeLinear" in w.message]
    fused = Q.fused_ops(source)
    assert Q.fused_ops(out) == fused  # ONNX Runtime still fuses every int8 op it fused
    assert name != "attention" or fused["QLinearMatMul"] == 2  # (its CPU provider fuses no S8S8 Conv here)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_from_opset_19_units_run_in_fp16_with_fp16_scales(name):
    source = quantized_small(name, 19)
    result, _ = convert_file(source)
    original = Q.elem_types(onnx.load(source))
    types = Q.elem_types(result.model)
    op = "conv" if name == "conv_block" else "scores"
    assert result.plan.by_name(op)[0].precision == "fp16"
    low = 0
    for node in qdq_nodes(result.model):
        assert types[node.input[2]] == original[node.input[2]]  # zero points keep their integer type
        if types[node.input[1]] == F16:
            low += 1
            side = node.output[0] if node.op_type == "DequantizeLinear" else node.input[0]
            assert types[side] == F16, node.name  # the float side is fp16 too
    assert low >= 3
    assert not [w for w in result.plan.warnings if w.code == "qdq-opset"]
    conv_or_matmul = next(n for n in result.model.graph.node if n.name == op)
    assert types[conv_or_matmul.output[0]] == F16


def test_bf16_conv_below_opset_22_keeps_the_unit_fp32():
    source = quantized_small("conv_block", 19)
    result, _ = convert_file(source, precision="bf16")
    assert_units_whole(source, result.model)
    assert result.plan.by_name("conv")[0].precision == "fp32"


def test_forcing_a_unit_op_low_below_opset_19_warns_and_keeps_it_whole():
    source = quantized_small("conv_block", 17)
    result = autocast_onnx.convert(onnx.load(source), include_nodes=["^conv$"])
    assert_units_whole(source, result.model)
    assert any(w.code == "qdq-unit" and "forced low" in w.message for w in result.plan.warnings)


EXAMPLES = ["resnet_tiny", "bert_tiny", "digits_cnn"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_quantized_example_models_keep_their_int8_fusions(name):
    source = Q.quantized(str(Q.ROOT / "examples" / "models" / f"{name}.onnx"))
    result, out = convert_file(source)
    assert_units_whole(source, result.model)
    fused = Q.fused_ops(source)
    assert sum(fused.values()) >= 3 and Q.fused_ops(out) == fused
    assert all(np.isfinite(o).all() for o in Q.run(out))


@pytest.mark.parametrize("name", EXAMPLES)
def test_quantized_example_models_at_opset_19_run_their_units_in_fp16(name):
    source = Q.quantized(str(Q.ROOT / "examples" / "models" / f"{name}.onnx"), 19)
    result, out = convert_file(source)
    assert_units_whole(source, result.model)
    types = Q.elem_types(result.model)
    scales = [types[n.input[1]] for n in qdq_nodes(result.model)]
    assert scales.count(F16) > len(scales) // 2
    work = [n for n in result.model.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")]
    assert sum(types.get(n.output[0]) == F16 for n in work) >= len(work) - 1  # an fp32 output head may stay
    assert all(np.isfinite(o).all() for o in Q.run(out))


def test_a_quantized_concat_keeps_fp32_scales_so_onnx_runtime_loads_the_model():
    """ONNX Runtime's CPU optimizer fuses DequantizeLinear -> Concat -> QuantizeLinear into a
    QLinearConcat whatever its scales' type, and QLinearConcat takes fp32 scales only: with fp16
    ones the model does not load (quantized vit_tiny at opset 19: 'Type tensor(float16) of input
    parameter (cat_scale) of operator (QLinearConcat) is invalid'). Its Concat units keep fp32."""
    source = Q.quantized(str(Q.ROOT / "examples" / "models" / "vit_tiny.onnx"), 19)
    result, out = convert_file(source)
    # the model's own Casts inside units (its attention's) stay; the conversion adds none
    assert set(Q.split_units(result.model)) <= set(Q.split_units(onnx.load(source)))
    assert all(np.isfinite(o).all() for o in Q.run(out))  # loads and runs with every optimization
    types = Q.elem_types(result.model)
    producers = {o: n for n in result.model.graph.node for o in n.output}

    def dequantized(name: str) -> bool:
        return name in producers and producers[name].op_type == "DequantizeLinear"

    quantized = [n for n in result.model.graph.node if n.op_type == "Concat" and any(map(dequantized, n.input))]
    fed = [producers[i] for n in quantized for i in n.input if dequantized(i)]
    assert fed and all(types[dq.input[1]] == TensorProto.FLOAT for dq in fed)
    reasons = {e.name: [r.code for r in e.reasons] for e in result.plan.nodes}
    assert all("qdq-unit" in reasons[n.name] for n in quantized)


def weight_only(opset: int) -> onnx.ModelProto:
    """A float MatMul and Relu, then a MatMul whose weight is int8 behind a DequantizeLinear."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["w2"], name="dq_w2"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    inits = [
        H.init("w1", H.randn([8, 8], 1, 0.3)),
        H.init("wq", H.rng(2).integers(-100, 100, size=(8, 8)).astype(np.int8)),
        H.init("w_scale", np.array(0.01, np.float32)),
        H.init("w_zp", np.array(0, np.int8)),
    ]
    return H.model(nodes, [H.tensor("x", shape=[2, 8])], [H.tensor("y", shape=[2, 8])], inits, opset=opset)


@pytest.mark.parametrize("opset", [17, 19])
def test_weight_only_dequantize_feeds_its_matmul_without_a_cast(opset):
    m = weight_only(opset)
    path = Q.save(m, f"weight_only_{opset}.onnx")
    result, out = convert_file(path)
    assert_units_whole(path, result.model)
    types = Q.elem_types(result.model)
    fc2 = result.plan.by_name("fc2")[0]
    assert result.plan.by_name("fc1")[0].precision == "fp16"
    if opset == 17:
        assert fc2.precision == "fp32" and fc2.reasons[-1].code == "qdq-unit" and types["w_scale"] == F32
    else:
        assert fc2.precision == "fp16" and types["w_scale"] == F16 and types["w2"] == F16
    assert types["w_zp"] == TensorProto.INT8
    np.testing.assert_allclose(Q.run(path)[0], Q.run(out)[0], atol=0.05, rtol=0.05)


def test_matmul_nbits_runs_at_its_scales_type():
    """com.microsoft MatMulNBits (4-bit weights): A, scales and Y follow the node; B stays packed."""
    k, n, block = 16, 8, 16
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node(
            "MatMulNBits",
            ["h", "b", "scales"],
            ["y"],
            name="nbits",
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=block,
        ),
    ]
    inits = [
        H.init("w1", H.randn([k, k], 1, 0.3)),
        H.init("b", H.rng(3).integers(0, 255, size=(n, k // block, block // 2)).astype(np.uint8)),
        H.init("scales", np.full(n * (k // block), 0.02, np.float32)),
    ]
    m = H.model(
        nodes, [H.tensor("x", shape=[2, k])], [H.tensor("y", shape=[2, n])], inits, extra_opsets=[("com.microsoft", 1)]
    )
    path = Q.save(m, "nbits.onnx")
    result, out = convert_file(path)
    types = Q.elem_types(result.model)
    assert result.plan.by_name("nbits")[0].precision == "fp16"
    assert types["b"] == TensorProto.UINT8 and types["scales"] == F16
    np.testing.assert_allclose(Q.run(path)[0], Q.run(out)[0], atol=0.05, rtol=0.05)


@pytest.mark.parametrize(("kind", "opset"), [("fp8", 19), ("int4", 21)])
def test_fp8_and_int4_weights_run_their_unit_in_fp16(kind, opset):
    """DequantizeLinear takes FP8 weights from opset 19 and INT4 from 21; the unit takes fp16 scales
    there like an int8 one, and the packed weights and zero points keep their types."""
    elem = TensorProto.FLOAT8E4M3FN if kind == "fp8" else TensorProto.INT4
    m = weight_only(opset)
    inits = {t.name: t for t in m.graph.initializer}
    values = H.rng(2).integers(-7, 7, size=64).astype(np.float32).tolist()
    inits["wq"].CopyFrom(helper.make_tensor("wq", elem, [8, 8], values))
    inits["w_zp"].CopyFrom(helper.make_tensor("w_zp", elem, [], [0]))
    m.ir_version = 10
    path = Q.save(m, f"weight_only_{kind}.onnx")
    result, out = convert_file(path)
    assert_units_whole(path, result.model)
    types = Q.elem_types(result.model)
    assert result.plan.by_name("fc2")[0].precision == "fp16"
    assert types["w_scale"] == F16 and types["wq"] == elem and types["w_zp"] == elem
    np.testing.assert_allclose(Q.run(path)[0], Q.run(out)[0], atol=0.05, rtol=0.05)


def test_a_scale_that_flushes_in_fp16_keeps_its_unit_fp32_whole():
    """A scale below fp16's smallest subnormal would dequantize every weight to zero: the data rule
    keeps the DequantizeLinear fp32, and with it the MatMul it feeds (no cast between them)."""
    m = weight_only(19)
    next(t for t in m.graph.initializer if t.name == "w_scale").CopyFrom(H.init("w_scale", np.array(1e-9, np.float32)))
    path = Q.save(m, "weight_only_tiny_scale.onnx")
    result, out = convert_file(path)
    assert_units_whole(path, result.model)
    fc2 = result.plan.by_name("fc2")[0]
    assert fc2.precision == "fp32" and "dq_w2" in fc2.reasons[-1].message
    assert Q.elem_types(result.model)["w_scale"] == F32
    np.testing.assert_allclose(Q.run(path)[0], Q.run(out)[0], atol=1e-6)
