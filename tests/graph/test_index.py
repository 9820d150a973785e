"""The graph index (autocast_onnx/graph/index.py): the first stage after loading. It resolves
every tensor name to one value per scope (main graph and each If/Loop/Scan body, outer names
looked up lexically), records each value's producer and consumers, puts the nodes in a
topological order (refusing cycles and tensors produced twice) and types every tensor from
declarations, ONNX schemas and the shipped ONNX Runtime contrib signatures. These tests call
build_index directly."""

import numpy as np
import pytest
from helpers import F16, F32, init, model, parse, tensor
from onnx import helper

from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index

I64 = 7


def test_types_inferred_from_signatures_without_value_info():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Shape", ["h"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["sf"], name="to_half", to=F16),
        helper.make_node("FusedMatMul", ["h", "w"], ["f"], name="fused", domain="com.microsoft"),
        helper.make_node("Foo", ["f"], ["u"], name="custom", domain="my.ops"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [2, 2])],
        [tensor("u", F32, None)],
        [init("w", np.eye(2, dtype=np.float32))],
        extra_opsets=[("com.microsoft", 1), ("my.ops", 1)],
    )
    index = build_index(m)
    types = {name: v.dtype for name, v in index.main.values.items()}
    assert types["h"] == F32 and types["s"] == I64 and types["sf"] == F16
    assert types["f"] == F32  # from the shipped ONNX Runtime contrib signatures
    assert types["u"] == F32  # unknown op: taken from the declared graph output
    undeclared = model(
        nodes,
        [tensor("x", F32, [2, 2])],
        [helper.make_tensor_value_info("u", 0, None)],
        [init("w", np.eye(2, dtype=np.float32))],
        extra_opsets=[("com.microsoft", 1), ("my.ops", 1)],
    )
    assert build_index(undeclared).main.values["u"].dtype is None


def test_consumers_and_outer_scope_resolution():
    m = parse(
        """
        branch (float[2,2] x, bool c) => (float[2,2] y) {
            [branch] y = If (c) <
                then_branch = then () => (float[2,2] t) { [then_mm] t = MatMul(x, w) },
                else_branch = else () => (float[2,2] e) { [else_relu] e = Relu(x) }>
        }""",
        w=np.eye(2, dtype=np.float32),
    )
    index = build_index(m)
    x = index.main.values["x"]
    assert sorted(n.name for n, _ in x.consumers) == ["else_relu", "then_mm"]
    assert sorted(s.path for s in index.scopes) == ["main", "main/branch.else_branch", "main/branch.then_branch"]
    assert index.main.values["y"].dtype == F32


def test_unsorted_graph_gets_an_order_and_cycles_are_refused():
    index = build_index(
        parse("""
        unsorted (float[2] x) => (float[2] y) {
            [second] y = Relu(h)
            [first] h = Relu(x)
        }""")
    )
    assert not index.main.sorted
    assert [n.name for n in index.main.order] == ["first", "second"]
    assert index.main.values["y"].dtype == F32
    cyclic = parse("""
        cyclic (float[2] x) => (float[2] y) {
            [p] a = Relu(b)
            [q] b = Relu(a)
            [r] y = Relu(a)
        }""")
    with pytest.raises(AutocastError, match=r"cycle: (p -> q -> p|q -> p -> q)"):
        build_index(cyclic)


def test_late_inputs_keep_consumers_in_node_order():
    """The one-walk index resolves inputs produced later after the walk; the value's consumers
    are still listed in node order (the order casts and their names follow), and the types come
    from the topological order."""
    index = build_index(
        parse("""
        late (float[2] x) => (float[2] y) {
            [early_reader] a = Relu(h)
            [maker] h = Relu(x)
            [later_reader] b = Relu(h)
            [first_reader] y = Add(a, b)
        }""")
    )
    h = index.main.values["h"]
    assert [(n.name, port) for n, port in h.consumers] == [("early_reader", 0), ("later_reader", 0)]
    assert not index.main.sorted
    assert [n.name for n in index.main.order] == ["maker", "early_reader", "later_reader", "first_reader"]
    assert all(index.main.values[t].dtype == F32 for t in "abhy")


def test_a_dangling_input_is_named_after_the_walk():
    with pytest.raises(AutocastError, match="node reader reads tensor 'ghost', which nothing produces"):
        build_index(
            parse("""
            dangling (float[2] x) => (float[2] y) {
                [fine] h = Relu(x)
                [reader] y = Add(h, ghost)
            }""")
        )


def test_duplicate_producer_is_refused():
    twice = parse("""
        twice (float[2] x) => (float[2] y) {
            [a] y = Relu(x)
            [b] y = Relu(x)
        }""")
    with pytest.raises(AutocastError, match="tensor 'y' is produced twice"):
        build_index(twice)
