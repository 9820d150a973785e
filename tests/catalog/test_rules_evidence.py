"""Default rules changed on measured evidence (docs/rules-evidence.md, benchmarks/bench_rules.py),
each with the minimal graph that shows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import F16, F32, parse, randn
from lint_helpers import findings
from onnx import numpy_helper

import autocast_onnx

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def conv_bn_relu(opset: int, params=np.float32):
    return parse(
        """
        cbr (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            [conv] h = Conv <pads = [1, 1, 1, 1]> (x, w)
            [bn] z = BatchNormalization(h, s, b, mu, v)
            [relu] y = Relu(z)
        }""",
        opset=opset,
        w=randn([4, 3, 3, 3]),
        s=np.full(4, 1.1, params),
        b=np.full(4, 0.1, params),
        mu=np.full(4, 0.05, params),
        v=np.full(4, 1.3, params),
    )


def types_of(model) -> dict:
    out = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}
    out.update({t.name: t.data_type for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type == "Cast":
            out[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    return out


@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_takes_fp16_parameters_that_survive_with_its_fp16_data(opset):
    """Parameters that survive fp16 are stored in it, the one form ONNX Runtime's CUDA kernel takes
    (plan/batchnorm.py); before opset 15 the schema ties them to the data, and the node now goes
    low whole instead of staying fp32."""
    result = autocast_onnx.convert(conv_bn_relu(opset), check="full")
    plan = {n.name: n.precision for n in result.plan.nodes}
    assert plan == {"conv": "fp16", "bn": "fp16", "relu": "fp16"}
    bn = next(n for n in result.model.graph.node if n.op_type == "BatchNormalization")
    types = types_of(result.model)
    assert [types[t] for t in bn.input[1:]] == [F16] * 4
    assert result.stats.casts_added == 2  # the input and the output, nothing around the BatchNormalization


def test_batchnorm_before_opset_15_with_parameters_that_do_not_survive_stays_fp32_and_says_why():
    m = conv_bn_relu(14)
    scale = next(t for t in m.graph.initializer if t.name == "s")
    values = numpy_helper.to_array(scale).copy()
    values[0] = 1e-9  # flushes in fp16
    scale.CopyFrom(numpy_helper.from_array(values, "s"))
    result = autocast_onnx.convert(m, check="full")
    entry = result.plan.by_name("bn")[0]
    assert entry.precision == "fp32"
    assert "low-precision data would need low-precision parameters" in entry.reasons[-1].message
    assert "opset 14" in entry.reasons[-1].message
    assert any(r.code == "bn-parameters-fp32" for r in entry.reasons)


@pytest.mark.parametrize("params, flagged", [(F32, False), (F16, False)])
def test_lint_accepts_batchnorm_parameters_that_survive_in_either_type(params, flagged):
    converted = autocast_onnx.convert(conv_bn_relu(15)).model
    # as converted the parameters are fp16 (they survive it); fp32 is what earlier versions wrote
    for t in converted.graph.initializer:
        if t.name in ("s", "b", "mu", "v"):
            assert t.data_type == F16
            if params == F32:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    diags = findings(converted, "AC102")
    assert bool(diags) == flagged
    # an fp32 model: the default conversion keeps the parameters fp32, so nothing to report
    assert findings(conv_bn_relu(15), "AC102") == []


def test_lint_flags_a_training_mode_batchnorm_in_fp16():
    m = autocast_onnx.convert(conv_bn_relu(15)).model
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.add(name="training_mode", i=1, type=2)
    assert len(findings(m, "AC102")) == 1


def head_model(hidden: int = 256):
    return parse(
        f"""
        head (float[4,{hidden}] x) => (float[4,8] y) {{
            [body] h = MatMul(x, w1)
            [act] a = Relu(h)
            [head] z = MatMul(a, w2)
            [prob] y = Sigmoid(z)
        }}""",
        w1=randn([hidden, hidden]),
        w2=randn([hidden, 8], seed=1),
    )


def test_output_head_stays_fp32_by_default_when_it_is_a_small_share_of_the_work(tmp_path):
    # the head MatMul does 8 / (256 + 8) = 3 % of the multiply-accumulates
    result = autocast_onnx.convert(head_model(), check="full")
    plan = {n.name: n.precision for n in result.plan.nodes}
    assert plan == {"body": "fp16", "act": "fp16", "head": "fp32", "prob": "fp32"}
    reason = result.plan.by_name("head")[0].reasons[-1]
    assert reason.code == "output-head" and reason.source.startswith("rules/default.toml")
    assert "3.0% of the MatMul/Gemm/Conv work" in reason.message
    off = tmp_path / "off.toml"
    off.write_text('[settings]\noutput_head = "off"\n')
    plain = autocast_onnx.convert(head_model(), rules=[off])
    assert {n.name: n.precision for n in plain.plan.nodes}["head"] == "fp16"
    assert result.stats.casts_added == plain.stats.casts_added  # one cast moves, none is added
    # a [[nodes]] rule still decides over it
    off.write_text('[[nodes]]\nmatch = "^head$"\nprecision = "low"\n')
    assert autocast_onnx.convert(head_model(), rules=[off]).plan.by_name("head")[0].precision == "fp16"


def test_output_head_doing_much_of_the_work_stays_low_precision(tmp_path, caplog):
    # head 8 / (16 + 8) = 33 % of the work: by default it converts, quietly (a log line at info)
    result = autocast_onnx.convert(head_model(16))
    assert {n.name: n.precision for n in result.plan.nodes}["head"] == "fp16"
    # asked for in a user's rule file, the rule says why it did nothing
    rules = tmp_path / "head.toml"
    rules.write_text('[settings]\noutput_head = "fp32"\n')
    with caplog.at_level("WARNING", logger="autocast_onnx"):
        result = autocast_onnx.convert(head_model(16), rules=[rules])
    assert {n.name: n.precision for n in result.plan.nodes}["head"] == "fp16"
    assert "output head of 'y' left low precision: it does 33.3% of the MatMul/Gemm/Conv work" in caplog.text


def test_output_head_share_counts_only_work_that_can_be_low_precision():
    # bf16 Conv has no schema type: the Gemm head is all the bf16 work and stays bf16
    result = autocast_onnx.convert(MODELS / "resnet_tiny.onnx", precision="bf16")
    assert [n.precision for n in result.plan.nodes if n.op_type == "Gemm"] == ["bf16"]
    fp16 = autocast_onnx.convert(MODELS / "resnet_tiny.onnx")
    assert [n.precision for n in fp16.plan.nodes if n.op_type == "Gemm"] == ["fp32"]
    assert {n.precision for n in fp16.plan.nodes if n.op_type == "Conv"} == {"fp16"}


def test_output_head_is_not_applied_to_training_graphs_or_long_chains(tmp_path):
    from pathlib import Path

    rules = tmp_path / "head.toml"
    rules.write_text('[settings]\noutput_head = "fp32"\n')
    training = Path(__file__).resolve().parents[1] / "data" / "training" / "ln_gelu" / "training_model.onnx"
    result = autocast_onnx.convert(training, rules=[rules])
    assert {n.precision for n in result.plan.nodes if n.op_type == "Gemm"} == {"fp16"}
    chain = " ".join(f"[t{k}] t{k + 1} = Tanh(t{k})" for k in range(40))
    m = parse(f"long (float[4,16] t0) => (float[4,16] t40) {{ {chain} }}")  # no MatMul within 32 nodes
    assert all(n.precision != "fp32" or n.reasons[-1].code != "output-head"
               for n in autocast_onnx.convert(m, rules=[rules]).plan.nodes)  # fmt: skip


def test_output_head_setting_values_are_checked(tmp_path):
    from autocast_onnx.errors import AutocastError

    rules = tmp_path / "bad.toml"
    rules.write_text('[settings]\noutput_head = "yes"\n')
    with pytest.raises(AutocastError, match=r"settings\.output_head must be one of fp32, off"):
        autocast_onnx.convert(head_model(), rules=[rules])
