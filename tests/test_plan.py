"""Classification and painting: per-node precision and the reasons recorded in the plan."""

import json

import numpy as np
import pytest
from onnx import helper

from autocast_onnx import AutocastError, PrecisionPlan
from helpers import F16, F32, check, convert, init, model, ops, precision, run, tensor

RNG = np.random.default_rng(0)


def w(name, *shape, scale=0.3):
    return init(name, (RNG.standard_normal(shape) * scale).astype(np.float32))


def attention_block():
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale_div"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="context"),
    ]
    return model(nodes, [tensor("q", F32, [2, 4, 8]), tensor("mask", F32, [2, 4, 4])],
                 [tensor("ctx", F32, [2, 4, 8])],
                 [w("kt", 8, 4), w("v", 4, 8), init("scale", np.array(2.0, np.float32))])


def test_attention_pattern():
    m = attention_block()
    r = convert(m)
    assert precision(r, "scores") == "fp16"
    assert precision(r, "scale_div") == "fp16"
    assert precision(r, "mask_add") == "fp16"      # mask in range: follows the low-precision scores
    assert precision(r, "softmax") == "fp32"
    assert precision(r, "context") == "fp16"
    check(r.model)
    feeds = {"q": RNG.standard_normal((2, 4, 8)).astype(np.float32),
             "mask": np.where(RNG.random((2, 4, 4)) < 0.3, -10000.0, 0.0).astype(np.float32)}
    np.testing.assert_allclose(run(r.model, feeds)[0], run(m, feeds)[0], atol=2e-2)


def test_fp32_taint_flows_forward_through_follow_and_clear():
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln"),
        helper.make_node("Add", ["ln", "x"], ["res"], name="residual"),
        helper.make_node("Reshape", ["res", "shape"], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="proj"),
    ]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])],
              [init("g", np.ones(8, np.float32)), init("b", np.zeros(8, np.float32)),
               init("shape", np.array([2, 8], np.int64)), w("w", 8, 8)])
    r = convert(m)
    assert [precision(r, n) for n in ("ln", "residual", "reshape", "proj")] == ["fp32", "fp32", "fp32", "fp16"]
    taint = [x for x in r.plan.by_name("residual")[0].reasons if x.code == "fp32-taint"]
    assert taint and "ln" in taint[0].message
    check(r.model)


def test_follow_between_low_ops_goes_low_with_no_cast():
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [w("w1", 8, 8), w("w2", 8, 8)])
    r = convert(m)
    assert precision(r, "act") == "fp16"
    assert r.stats.casts_added == 2           # model input in, model output out
    assert len(ops(r.model, "Cast")) == 2


def test_clear_node_before_low_op_takes_low_only_if_all_consumers_are_low():
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="proj"),
    ]
    inits = [init("shape", np.array([2, 8], np.int64)), w("w", 8, 8)]
    r = convert(model(nodes, [tensor("x", F32, [16])], [tensor("y", F32, [2, 8])], inits))
    assert precision(r, "reshape") == "fp16"
    nodes.append(helper.make_node("Softmax", ["r"], ["p"], name="softmax"))
    r = convert(model(nodes, [tensor("x", F32, [16])], [tensor("y", F32, [2, 8]), tensor("p", F32, [2, 8])], inits))
    # A Softmax reads the reshaped tensor too: it stays fp32, the MatMul gets the cast.
    assert precision(r, "reshape") == "fp32"
    assert precision(r, "softmax") == "fp32"
    check(r.model)


def mlp():
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="enc/fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="enc/act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="head/fc2"),
    ]
    return model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [w("w1", 8, 8), w("w2", 8, 8)])


def test_exclude_op_and_exclude_node():
    r = convert(mlp(), exclude_ops=["MatMul"])
    assert precision(r, "enc/fc1") == "fp32" and precision(r, "head/fc2") == "fp32"
    assert any(x.code == "cli-exclude" for x in r.plan.by_name("enc/fc1")[0].reasons)
    r = convert(mlp(), exclude_nodes=["^head/"])
    assert precision(r, "enc/fc1") == "fp16" and precision(r, "head/fc2") == "fp32"


def test_include_node_forces_keep_op_low():
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Softmax", ["h"], ["p"], name="softmax"),
             helper.make_node("MatMul", ["p", "w2"], ["y"], name="fc2")]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [w("w1", 8, 8), w("w2", 8, 8)])
    r = convert(m, include_nodes=["^softmax$"])
    assert precision(r, "softmax") == "fp16"
    assert r.stats.casts_added == 2
    check(r.model)


def test_precedence_cli_over_node_rules_over_categories(tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text('[ops.keep_fp32]\nRelu = "testing"\n'
                     '[[nodes]]\nmatch = "^enc/"\nprecision = "fp32"\nwhy = "encoder stays fp32"\n'
                     '[[nodes]]\nname = "enc/act"\nprecision = "low"\n')
    r = convert(mlp(), rules=[rules])
    # op rule says keep_fp32, the later node rule for enc/act forces low; enc/fc1 forced fp32.
    assert precision(r, "enc/act") == "fp16"
    assert precision(r, "enc/fc1") == "fp32"
    reason = [x for x in r.plan.by_name("enc/fc1")[0].reasons if x.code == "node-rule"][0]
    assert reason.source == f"{rules}:3"
    # command line beats rule files; an exclude beats an include
    r = convert(mlp(), rules=[rules], include_nodes=["fc1"])
    assert precision(r, "enc/fc1") == "fp16"
    r = convert(mlp(), rules=[rules], include_nodes=["fc1"], exclude_nodes=["fc1"])
    assert precision(r, "enc/fc1") == "fp32"


def test_node_rule_limited_to_op_types(tmp_path):
    rules = tmp_path / "r.toml"
    rules.write_text('[[nodes]]\nmatch = "enc"\nprecision = "fp32"\nop_types = ["Relu"]\n')
    r = convert(mlp(), rules=[rules])
    assert precision(r, "enc/act") == "fp32" and precision(r, "enc/fc1") == "fp16"


def test_unknown_op_category_can_be_changed_by_user(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Foo", ["h"], ["y"], name="custom", domain="my.ops")]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [w("w", 8, 8)],
              extra_opsets=[("my.ops", 1)])
    r = convert(m, check="none")
    assert precision(r, "custom") == "fp32"
    assert any(x.code == "unknown-op" for x in r.plan.warnings)
    rules = tmp_path / "r.toml"
    rules.write_text('["ops".follow]\n"my.ops:Foo" = "elementwise"\n')
    r = convert(m, rules=[rules], check="none")
    assert precision(r, "custom") == "fp16"


def test_plan_json_round_trip(tmp_path):
    r = convert(attention_block())
    path = tmp_path / "plan.json"
    r.plan.save(path)
    data = json.loads(path.read_text())
    assert data["target"] == "fp16" and data["summary"]["fp16"] == 4
    again = PrecisionPlan.from_json(path.read_text())
    assert again == r.plan
    node = [n for n in data["nodes"] if n["name"] == "softmax"][0]
    assert node["precision"] == "fp32"
    assert node["reasons"][0]["source"].startswith("rules/default.toml:")


@pytest.mark.parametrize("target,elem", [("fp16", F16), ("bf16", 16)])
def test_precision_option(target, elem):
    r = convert(mlp(), precision=target)
    assert precision(r, "enc/fc1") == target
    assert {i.data_type for i in r.model.graph.initializer} == {elem}
    check(r.model)


def test_bf16_needs_opset_13():
    m = mlp()
    m.opset_import[0].version = 12
    with pytest.raises(AutocastError, match="opset 12 cannot express bf16"):
        convert(m, precision="bf16")


def test_schema_without_target_type_keeps_node_fp32():
    # LeakyRelu has no bfloat16 schema at opset 13 (it gained one in opset 16).
    m = mlp()
    m.graph.node[1].op_type = "LeakyRelu"
    m.opset_import[0].version = 13
    r = convert(m, precision="bf16")
    assert precision(r, "enc/act") == "fp32"
    assert any(x.code == "schema" for x in r.plan.by_name("enc/act")[0].reasons)
    check(r.model)


def test_every_node_has_a_reason():
    r = convert(attention_block())
    assert all(n.reasons for n in r.plan.nodes)
