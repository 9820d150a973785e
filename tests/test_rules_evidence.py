"""Default rules changed on measured evidence (docs/rules-evidence.md, benchmarks/bench_rules.py),
each with the minimal graph that shows it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import F16, F32, parse, randn
from lint_helpers import findings

import autocast_onnx


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


def test_batchnorm_takes_fp16_data_with_fp32_parameters_from_opset_15():
    result = autocast_onnx.convert(conv_bn_relu(15), check="full")
    plan = {n.name: n.precision for n in result.plan.nodes}
    assert plan == {"conv": "fp16", "bn": "fp16", "relu": "fp16"}
    bn = next(n for n in result.model.graph.node if n.op_type == "BatchNormalization")
    types = types_of(result.model)
    assert [types[t] for t in bn.input[1:]] == [F32] * 4  # scale, bias, mean, variance stay fp32
    assert result.stats.casts_added == 2  # the input and the output, nothing around the BatchNormalization


def test_batchnorm_before_opset_15_stays_fp32_and_says_why():
    result = autocast_onnx.convert(conv_bn_relu(14), check="full")
    entry = result.plan.by_name("bn")[0]
    assert entry.precision == "fp32"
    assert "low-precision data would need low-precision parameters" in entry.reasons[-1].message
    assert "opset 14" in entry.reasons[-1].message


@pytest.mark.parametrize("params, flagged", [(F32, False), (F16, True)])
def test_lint_accepts_batchnorm_with_fp32_parameters_only(params, flagged):
    converted = autocast_onnx.convert(conv_bn_relu(15)).model
    if params == F16:  # what a converter that casts everything would write
        for t in converted.graph.initializer:
            if t.name in ("s", "b", "mu", "v"):
                data = np.frombuffer(t.raw_data, np.float32) if t.raw_data else np.array(t.float_data, np.float32)
                t.ClearField("float_data")
                t.raw_data = data.astype(np.float16).tobytes()
                t.data_type = F16
    diags = findings(converted, "AC102")
    assert bool(diags) == flagged
    # an fp32 model: the default conversion keeps the parameters fp32, so nothing to report
    assert findings(conv_bn_relu(15), "AC102") == []


def test_lint_flags_a_training_mode_batchnorm_in_fp16():
    m = autocast_onnx.convert(conv_bn_relu(15)).model
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    bn.attribute.add(name="training_mode", i=1, type=2)
    assert len(findings(m, "AC102")) == 1
