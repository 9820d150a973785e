"""Graph index: scopes, producers/consumers, topological order and tensor types."""

import numpy as np
import pytest
from onnx import helper

from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index
from helpers import F16, F32, init, model, tensor

I64 = 7


def test_types_inferred_from_signatures_without_value_info():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Shape", ["h"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], name="to_half", to=F16),
             helper.make_node("FusedMatMul", ["h", "w"], ["f"], name="fused", domain="com.microsoft"),
             helper.make_node("Foo", ["f"], ["u"], name="custom", domain="my.ops")]
    m = model(nodes, [tensor("x", F32, [2, 2])], [tensor("u", F32, None)], [init("w", np.eye(2, dtype=np.float32))],
              extra_opsets=[("com.microsoft", 1), ("my.ops", 1)])
    index = build_index(m)
    types = {name: v.dtype for name, v in index.main.values.items()}
    assert types["h"] == F32 and types["s"] == I64 and types["sf"] == F16
    assert types["f"] == F32               # from the shipped ONNX Runtime contrib signatures
    assert types["u"] == F32               # unknown op: taken from the declared graph output
    undeclared = model(nodes, [tensor("x", F32, [2, 2])], [helper.make_tensor_value_info("u", 0, None)],
                       [init("w", np.eye(2, dtype=np.float32))], extra_opsets=[("com.microsoft", 1), ("my.ops", 1)])
    assert build_index(undeclared).main.values["u"].dtype is None


def test_consumers_and_outer_scope_resolution():
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="then_mm")], "then", [],
                               [tensor("t", F32, [2, 2])])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"], name="else_relu")], "else", [],
                               [tensor("e", F32, [2, 2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [tensor("x", F32, [2, 2]), tensor("c", 9, [])], [tensor("y", F32, [2, 2])],
              [init("w", np.eye(2, dtype=np.float32))])
    index = build_index(m)
    x = index.main.values["x"]
    assert sorted(n.name for n, _ in x.consumers) == ["else_relu", "then_mm"]
    assert sorted(s.path for s in index.scopes) == ["main", "main/branch.else_branch", "main/branch.then_branch"]
    assert index.main.values["y"].dtype == F32


def test_unsorted_graph_gets_an_order_and_cycles_are_refused():
    nodes = [helper.make_node("Relu", ["h"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["h"], name="first")]
    index = build_index(model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])]))
    assert not index.main.sorted
    assert [n.name for n in index.main.order] == ["first", "second"]
    assert index.main.values["y"].dtype == F32
    cyclic = [helper.make_node("Relu", ["b"], ["a"], name="p"), helper.make_node("Relu", ["a"], ["b"], name="q"),
              helper.make_node("Relu", ["a"], ["y"], name="r")]
    with pytest.raises(AutocastError, match="cycle: (p -> q -> p|q -> p -> q)"):
        build_index(model(cyclic, [tensor("x", F32, [2])], [tensor("y", F32, [2])]))


def test_duplicate_producer_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Relu", ["x"], ["y"], name="b")]
    with pytest.raises(AutocastError, match="tensor 'y' is produced twice"):
        build_index(model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])]))
