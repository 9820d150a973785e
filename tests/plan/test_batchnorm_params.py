"""BatchNormalization's parameters follow its data when their values survive the low type
(plan/batchnorm.py): ONNX Runtime's CUDA kernel takes scale, bias, mean and variance in the data's
type only and converts them to float, so fp32 parameters beside fp16 data sent the node to the CPU
provider. Parameters that do not survive (a variance or scale that flushes) keep the node fp32
whole with --runtime cuda, and fp16 data with fp32 parameters, warned, without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import F16, F32, check, init, model, planned, run, tensor
from onnx import helper, numpy_helper

import autocast_onnx
from autocast_onnx.dtypes import BFLOAT16, FLOAT16
from autocast_onnx.lint.engine import LintOptions, lint
from autocast_onnx.plan import batchnorm
from autocast_onnx.plan.options import PlanOptions
from autocast_onnx.validate.emulate import emulation_model

C = 8


def params(seed=0, **override):
    g = np.random.default_rng(seed)
    out = {
        "scale": g.uniform(0.5, 1.5, C),
        "bias": g.normal(0, 0.2, C),
        "mean": g.normal(0, 0.5, C),
        "var": g.uniform(0.5, 2.0, C),
    }
    for name, (channel, value) in override.items():
        out[name][channel] = value
    return {k: v.astype(np.float32) for k, v in out.items()}


def conv_bn(p=None, opset=17, epsilon=1e-5, constant=True):
    """Conv -> BatchNormalization -> Relu -> Conv, the shape of every ResNet block."""
    p = p or params()
    g = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["b1"], name="bn", epsilon=epsilon
        ),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2"),
    ]
    inits = [
        init("w1", (g.standard_normal((C, 3, 3, 3)) * 0.2).astype(np.float32)),
        init("w2", (g.standard_normal((4, C, 1, 1)) * 0.2).astype(np.float32)),
    ]
    inputs = [tensor("x", F32, [2, 3, 8, 8])]
    for name in ("scale", "bias", "mean", "var"):
        if constant:
            inits.append(init(name, p[name]))
        else:
            inputs.append(tensor(name, F32, [C]))
    m = model(nodes, inputs, [tensor("y", F32, [2, 4, 8, 8])], inits, opset=opset)
    check(m)
    return m


def feeds(seed=2):
    return {"x": np.random.default_rng(seed).standard_normal((2, 3, 8, 8)).astype(np.float32)}


def bn_entry(result):
    return next(e for e in result.plan.nodes if e.name == "bn")


def bn_input_types(converted):
    types = {i.name: i.data_type for i in converted.graph.initializer}
    types.update({o: F16 for n in converted.graph.node if n.op_type == "Cast" for o in n.output})
    node = next(n for n in converted.graph.node if n.op_type == "BatchNormalization")
    return [types.get(name) for name in node.input[1:]]


def cuda_fallbacks(converted) -> list[str]:
    found = lint(converted, LintOptions(plan=PlanOptions(runtime="cuda"))).diagnostics
    return [f"{d.code} {d.node}" for d in found if d.code == "AC404"]


@pytest.mark.parametrize("runtime", [None, "cuda", "any"])
def test_parameters_that_survive_follow_the_fp16_data(runtime):
    m = conv_bn()
    result = autocast_onnx.convert(m, runtime=runtime)
    entry = bn_entry(result)
    assert entry.precision == "fp16" and entry.roles_in == "ppppp"
    assert [r.code for r in entry.reasons][-2:] == ["bn-parameters-low", "follows-low"]
    assert "CUDA kernel takes" in entry.reasons[-2].message and entry.reasons[-2].value < 2 * 2**-11
    assert bn_input_types(result.model) == [F16] * 4
    assert result.stats.casts_added == 2  # the model input and output, nothing around the BatchNormalization
    assert cuda_fallbacks(result.model) == []
    assert not [w for w in result.plan.warnings if w.code == "runtime-fallback"]
    emulated = run(emulation_model(result.model), feeds())[0]
    ref = run(m, feeds())[0]
    assert np.abs(emulated - ref).max() <= 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("runtime", [None, "any", "cuda"])
def test_a_variance_that_flushes_keeps_the_node_fp32_whole(runtime):
    # 3e-8 is below fp16's smallest subnormal's half: it flushes to 0, and with eps 1e-9 the
    # channel's scale/sqrt(var + eps) would grow 5.5-fold. The node runs fp32 whole whatever the
    # runtime: fp16 data beside fp32 parameters has no CUDA kernel (a CPU fallback), and the
    # fuzz found a scale beyond fp16 overflowing such a node's fp16 output.
    m = conv_bn(params(var=(3, 3e-8)), epsilon=1e-9)
    result = autocast_onnx.convert(m, runtime=runtime)
    entry = bn_entry(result)
    assert entry.precision in ("fp32", "unchanged") and entry.roles_in == "fffff"
    kept = next(r for r in entry.reasons if r.code == "bn-parameters-fp32")
    assert "channel 3" in kept.message and "variance 3e-08" in kept.message and "fp32 whole" in kept.message
    assert bn_input_types(result.model) == [F32] * 4
    assert not [w for w in result.plan.warnings if w.code == "runtime-fallback"]
    assert cuda_fallbacks(result.model) == []
    assert planned(result, "conv1") == "fp16" and planned(result, "conv2") == "fp16"


def test_a_scale_beyond_fp16_keeps_the_node_fp32_whole():
    """The minimal graph of the fuzz's case: a scale of 7e4 beside fp16 data wrote inf."""
    result = autocast_onnx.convert(conv_bn(params(scale=(0, 7e4))))
    entry = bn_entry(result)
    assert entry.precision in ("fp32", "unchanged") and entry.roles_in == "fffff"
    assert "bn-parameters-fp32" in [r.code for r in entry.reasons]
    assert bn_input_types(result.model) == [F32] * 4


def test_a_scale_that_flushes_is_refused_and_a_bias_that_does_is_not():
    p = params(scale=(2, 1e-9))
    survive, change, said = batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-5, FLOAT16)
    assert not survive and change == pytest.approx(1.0) and "channel 2" in said
    p = params(bias=(2, 1e-9))  # flushes too, but is nothing beside the channel's scale
    survive, change, _ = batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-5, FLOAT16)
    assert survive and change < 2 * 2**-11


def test_a_large_mean_rounds_as_the_data_does_and_passes():
    # mean 1e4 with a standard deviation of 0.1: the mean's fp16 rounding (up to 4) is large
    # against the standard deviation, but the data near it rounds by as much in fp16 already.
    p = params(mean=(0, 1e4), var=(0, 1e-2))
    survive, change, _ = batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-5, FLOAT16)
    assert survive and change <= 2 * 2**-11


def test_bf16_has_fp32_range_and_its_own_rounding():
    p = params(var=(3, 3e-8))
    survive, change, _ = batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-9, BFLOAT16)
    assert survive and change <= 2 * 2**-8
    p = params(scale=(1, 1e-40))  # below bf16's (and float32's) normal range
    assert not batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-5, BFLOAT16)[0]


def test_a_non_finite_parameter_is_refused():
    p = params(var=(0, 7e4))  # beyond fp16's largest value
    survive, change, said = batchnorm.judge([p["scale"], p["bias"], p["mean"], p["var"]], 1e-5, FLOAT16)
    assert not survive and change == float("inf") and "variance" in said


def test_before_opset_15_the_tied_schema_now_lets_the_whole_node_go_low():
    """At opset 14 the schema gives the parameters the data's type, which kept the node fp32 with
    Casts on both sides; parameters that survive now take the data's type with it."""
    result = autocast_onnx.convert(conv_bn(opset=14))
    entry = bn_entry(result)
    assert entry.precision == "fp16" and entry.roles_in == "ppppp"
    assert result.stats.casts_added == 2
    check(result.model)


def test_parameters_that_are_not_constants_keep_their_pins():
    result = autocast_onnx.convert(conv_bn(constant=False), runtime="any")
    entry = bn_entry(result)
    assert entry.roles_in == "pffff"
    assert not any(r.code.startswith("bn-parameters") for r in entry.reasons)


def test_a_training_mode_batchnorm_keeps_its_pins():
    m = conv_bn()
    bn = next(n for n in m.graph.node if n.op_type == "BatchNormalization")
    bn.output.extend(["running_mean", "running_var"])
    bn.attribute.append(helper.make_attribute("training_mode", 1))
    result = autocast_onnx.convert(m, runtime="any")
    assert not any(r.code.startswith("bn-parameters") for r in bn_entry(result).reasons)


def ac102(converted) -> list[str]:
    return [d.node for d in lint(converted, LintOptions()).diagnostics if d.code == "AC102"]


def test_lint_accepts_the_parameters_the_converter_stores_low_and_not_a_flushed_variance():
    converted = autocast_onnx.convert(conv_bn()).model
    assert ac102(converted) == []
    # the same conversion with the variance replaced by one that flushes in fp16 (and eps 1e-9)
    flushed = params(var=(3, 3e-8))["var"].astype(np.float16)
    for tensor_ in converted.graph.initializer:
        if tensor_.name == "var":
            tensor_.CopyFrom(numpy_helper.from_array(flushed, "var"))
    bn = next(n for n in converted.graph.node if n.op_type == "BatchNormalization")
    for a in bn.attribute:
        if a.name == "epsilon":
            a.f = 1e-9
    if not any(a.name == "epsilon" for a in bn.attribute):
        bn.attribute.append(helper.make_attribute("epsilon", 1e-9))
    assert ac102(converted) == [bn.name]


def test_converting_the_converted_model_again_keeps_its_fp16_parameters():
    """The bug the idempotence test found: parameters already fp16 were pinned back to fp32."""
    first = autocast_onnx.convert(conv_bn())
    again = autocast_onnx.convert(first.model)
    assert again.stats.casts_added == 0
    assert again.model.SerializeToString() == first.model.SerializeToString()


SHIPPED = sorted(
    p
    for folder in ("examples/models", "tests/data/evidence", "tests/data/decoders")
    for p in (Path(__file__).resolve().parents[2] / folder).glob("*.onnx")
)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_no_default_conversion_of_a_shipped_model_falls_back_to_the_cpu(path, precision):
    """Issue 37, item 5: the default plan of every shipped model has no node that ONNX Runtime's
    CUDA provider would run on the CPU (lint --runtime cuda, AC404, is clean on it)."""
    converted = autocast_onnx.convert(str(path), precision=precision).model
    assert cuda_fallbacks(converted) == []
