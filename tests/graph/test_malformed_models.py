"""Malformed models through every command that reads a model (issue 26, defect 6).

Each builder below makes a minimal model with one defect: a tensor whose payload does not match
its dims or type, a type or dim that cannot be, a header the model's IR does not allow, a value
without a type, a local function that calls itself. These models are the input's fault: every
command refuses them with exit 2 and one line naming the tensor, node or function at fault (and
what to do), never with exit 3 ("this is a bug in autocast-onnx"), no traceback, nothing written,
the input unchanged.

Before the input checks (autocast_onnx/graph/sanity.py) 31 of the cases ended in exit 3 in at
least one command, and several were converted as if nothing were wrong.
"""

from __future__ import annotations

import bad_input_helpers as B
import numpy as np
import onnx
import pytest
from bad_input_helpers import argv, assert_one_error, invoke, snapshot, write_model
from helpers import F32, init, model, tensor
from onnx import AttributeProto, TensorProto, helper

N = 40  # the weights are N x N: 6400 bytes, so convert leaves w1 and w2 in the file (io.load_model)
COMMANDS = ["convert", "lint", "explain", "validate", "check", "diagnose"]


isolated = pytest.fixture(autouse=True)(B.isolated_cwd)


# ---- the base model and its parts -------------------------------------------------------------
def weight(seed=0):
    return (np.random.default_rng(seed).standard_normal((N, N)) * 0.1).astype(np.float32)


def base() -> onnx.ModelProto:
    """x -> MatMul 'fc' (w1) -> Relu 'act' -> MatMul 'fc2' (w2) -> y."""
    return B.small_model(N)


def w1(m: onnx.ModelProto) -> TensorProto:
    return next(t for t in m.graph.initializer if t.name == "w1")


def with_w1(edit):
    """The base model with initializer w1 edited by `edit(tensor)`."""

    def build():
        m = base()
        edit(w1(m))
        return m

    return build


def branch(name, nodes, output, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [tensor(output, F32, [2, N])], list(initializers))


def if_model(then: onnx.GraphProto, node_name="gate") -> onnx.ModelProto:
    """y = If(c) then `then` else Identity(x): the defect sits in the then branch."""
    other = branch("else", [helper.make_node("Identity", ["x"], ["e_out"], name="e_id")], "e_out")
    node = helper.make_node("If", ["c"], ["y"], name=node_name, then_branch=then, else_branch=other)
    return model([node], [tensor("c", TensorProto.BOOL, []), tensor("x", F32, [2, N])], [tensor("y", F32, [2, N])])


def constant_model(value: TensorProto) -> onnx.ModelProto:
    """y = MatMul 'fc'(x, Constant 'k'): the defect is the Constant's value."""
    nodes = [
        helper.make_node("Constant", [], ["kw"], name="k", value=value),
        helper.make_node("MatMul", ["x", "kw"], ["y"], name="fc"),
    ]
    return model(nodes, [tensor("x", F32, [2, N])], [tensor("y", F32, [2, N])])


def short(t: TensorProto) -> TensorProto:
    t.raw_data = t.raw_data[:-4]
    return t


def const_tensor(edit=short) -> TensorProto:
    return edit(init("kval", weight(3)))


# ---- tensor payloads --------------------------------------------------------------------------
def _raw_long(t):
    t.raw_data += b"\0" * 4


def _raw_odd(t):
    t.raw_data = t.raw_data[:-1]


def _dims(*dims):
    def edit(t):
        del t.dims[:]
        t.dims.extend(dims)

    return edit


def _dtype(code):
    def edit(t):
        t.data_type = code

    return edit


def _typed_short(t):
    values = np.frombuffer(t.raw_data, dtype="<f4")
    t.ClearField("raw_data")
    t.float_data.extend(values[:-1].tolist())


def _raw_and_typed(t):
    t.float_data.extend([1.0] * (N * N))


def _string_raw(t):
    t.data_type = TensorProto.STRING


def _external_no_folder_length(t):
    t.data_location = TensorProto.EXTERNAL  # external data with no location at all


def sparse_model():
    """fc reads a sparse initializer whose indices name more entries than it has values."""
    m = base()
    dense = w1(m)
    m.graph.initializer.remove(dense)
    values = helper.make_tensor("w1", F32, [3], [1.0, 2.0, 3.0])
    indices = helper.make_tensor("w1_idx", TensorProto.INT64, [4], [0, 5, 9, 17])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [N, N]))
    return m


def subgraph_initializer_model():
    sub = init("sub_w", weight(4))
    short(sub)
    then = branch("then", [helper.make_node("MatMul", ["x", "sub_w"], ["t_out"], name="t_mm")], "t_out", [sub])
    return if_model(then)


def constant_in_branch_model():
    then = branch(
        "then",
        [
            helper.make_node("Constant", [], ["kw"], name="t_k", value=const_tensor()),
            helper.make_node("MatMul", ["x", "kw"], ["t_out"], name="t_mm"),
        ],
        "t_out",
    )
    return if_model(then)


def constant_of_shape_model():
    """ConstantOfShape whose value holds 2 elements (the op takes one, and its raw data has 3)."""
    bad = helper.make_tensor("cval", F32, [2], [1.0, 2.0])
    bad.float_data.append(3.0)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros", value=bad),
        helper.make_node("Add", ["x", "z"], ["y"], name="add"),
    ]
    return model(nodes, [tensor("x", F32, [2, N])], [tensor("y", F32, [2, N])])


# ---- model header -----------------------------------------------------------------------------
def _header(edit):
    def build():
        m = base()
        edit(m)
        return m

    return build


def _no_opset(m):
    del m.opset_import[:]


def _ir(version):
    def edit(m):
        m.ir_version = version

    return edit


def _opset_version(version):
    def edit(m):
        m.opset_import[0].version = version

    return edit


def _twice_opset(m):
    m.opset_import.append(helper.make_opsetid("", 13))


# ---- types of values --------------------------------------------------------------------------
def _untyped_input(m):
    m.graph.input[0].ClearField("type")


def _untyped_output(m):
    """y declared without a type and made by an op that ONNX type inference does not know, so
    nothing can type it (an output that inference types is typed on load: test_compat_verdict.py)."""
    m.graph.output[0].ClearField("type")
    producer = next(n for n in m.graph.node if m.graph.output[0].name in n.output)
    producer.domain, producer.op_type = "com.example", "Mystery"
    m.opset_import.add(domain="com.example", version=1)


def _sequence_without_element_type(m):
    m.graph.output[0].ClearField("type")
    m.graph.output[0].type.sequence_type.SetInParent()


def _unknown_elem_type(m):
    m.graph.input[0].type.tensor_type.elem_type = 99


def _undefined_elem_type(m):
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED


# ---- nodes and functions ----------------------------------------------------------------------
def _empty_op_type(m):
    m.graph.node[1].op_type = ""


def _matmul_one_input(m):
    del m.graph.node[0].input[1:]


def _attribute_without_type(m):
    attr = m.graph.node[1].attribute.add()
    attr.name = "alpha"


def _attribute_wrong_type(m):
    m.graph.node[1].CopyFrom(helper.make_node("LeakyRelu", ["h"], ["a"], name="act", alpha="steep"))


def function_model(body_calls: list[str], names=("Block",)) -> onnx.ModelProto:
    """fc2 is replaced by a call of local function names[0]; each function's body calls the
    functions of `body_calls` (by index into names) before a Relu."""
    m = base()
    m.graph.node[2].CopyFrom(helper.make_node(names[0], ["a"], ["y"], name="fc2", domain="local"))
    m.opset_import.append(helper.make_opsetid("local", 1))
    for k, name in enumerate(names):
        callee = body_calls[k]
        nodes = []
        if callee is not None:
            nodes.append(helper.make_node(callee, ["i"], ["m"], name=f"{name}_call", domain="local"))
        else:
            nodes.append(helper.make_node("Identity", ["i"], ["m"], name=f"{name}_id"))
        nodes.append(helper.make_node("Relu", ["m"], ["o"], name=f"{name}_relu"))
        m.functions.append(
            helper.make_function(
                "local", name, ["i"], ["o"], nodes, [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
            )
        )
    return m


def recursive_function():
    return function_model(["Block"])


def mutually_recursive_functions():
    return function_model(["Ping", "Pong"], names=("Ping", "Pong"))


def function_bad_constant():
    m = function_model([None])
    body = m.functions[0]
    body.node[0].CopyFrom(helper.make_node("Constant", [], ["m"], name="f_k", value=const_tensor()))
    return m


def if_without_else():
    then = branch("then", [helper.make_node("Identity", ["x"], ["t_out"], name="t_id")], "t_out")
    node = helper.make_node("If", ["c"], ["y"], name="gate", then_branch=then)
    return model([node], [tensor("c", TensorProto.BOOL, []), tensor("x", F32, [2, N])], [tensor("y", F32, [2, N])])


def graph_attribute_typed_as_int():
    m = if_without_else()
    attr = m.graph.node[0].attribute.add()
    attr.name = "else_branch"
    attr.type = AttributeProto.INT
    attr.i = 3
    return m


# name: (builder, what the error line must hold: the tensor, node or function at fault; or a tuple
# of such fragments, one of which it must hold)
CASES = {
    "raw_data_short": (with_w1(short), "w1"),
    "raw_data_long": (with_w1(_raw_long), "w1"),
    "raw_data_not_a_multiple": (with_w1(_raw_odd), "w1"),
    "negative_dim": (with_w1(_dims(-1, N)), "w1"),
    "overflowing_dims": (with_w1(_dims(2**62, 2**62)), "w1"),
    "huge_dims_small_payload": (with_w1(_dims(2**31, 2**31)), "w1"),
    "unknown_data_type": (with_w1(_dtype(99)), "w1"),
    "undefined_data_type": (with_w1(_dtype(0)), "w1"),
    "typed_data_short": (with_w1(_typed_short), "w1"),
    "raw_and_typed_data": (with_w1(_raw_and_typed), "w1"),
    "string_with_raw_data": (with_w1(_string_raw), "w1"),
    "sparse_initializer": (sparse_model, "w1"),
    "subgraph_initializer_short": (subgraph_initializer_model, "sub_w"),
    "constant_value_short": (lambda: constant_model(const_tensor()), "k"),
    "constant_unknown_type": (lambda: constant_model(const_tensor(lambda t: (_dtype(99)(t), t)[1])), "k"),
    "constant_negative_dim": (lambda: constant_model(const_tensor(lambda t: (_dims(-2, N)(t), t)[1])), "k"),
    "constant_in_if_branch": (constant_in_branch_model, "t_k"),
    "constant_of_shape_value": (constant_of_shape_model, "zeros"),
    "no_opset_import": (_header(_no_opset), "opset"),
    "ir_version_too_new": (_header(_ir(onnx.IR_VERSION + 50)), "IR version"),
    "ir_version_missing": (_header(_ir(0)), "IR version"),
    "opset_version_zero": (_header(_opset_version(0)), "opset"),
    "opset_imported_twice": (_header(_twice_opset), "opset"),
    "recursive_function": (recursive_function, "Block"),
    "mutually_recursive_functions": (mutually_recursive_functions, "Ping"),
    "function_with_bad_constant": (function_bad_constant, "f_k"),
    "input_without_type": (_header(_untyped_input), "'x'"),
    "output_without_type": (_header(_untyped_output), "'y'"),
    "sequence_without_element_type": (_header(_sequence_without_element_type), "'y'"),
    "unknown_elem_type": (_header(_unknown_elem_type), "'x'"),
    "undefined_elem_type": (_header(_undefined_elem_type), "'x'"),
    "empty_op_type": (_header(_empty_op_type), ("act", "op ''")),  # convert: the op lookup says it first
    "attribute_without_type": (_header(_attribute_without_type), "act"),
    "attribute_wrong_type": (_header(_attribute_wrong_type), "act"),
    "matmul_with_one_input": (_header(_matmul_one_input), "fc"),
    "if_without_else_branch": (if_without_else, "gate"),
    "graph_attribute_typed_as_int": (graph_attribute_typed_as_int, "gate"),
}


def command_argv(command, path, out):
    if command == "diagnose":
        return ["diagnose", path, path, "--report-json", out / "r.json"]
    return argv(command, path, out, node=".")  # explain: every node (a regex)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_model_is_bad_input(tmp_path, case, command):
    build, fragment = CASES[case]
    path = write_model(build(), tmp_path / "models" / f"{case}.onnx")
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(tmp_path)
    outcome = invoke(command_argv(command, path, out))
    line = assert_one_error(outcome, path.name)
    fragments = fragment if isinstance(fragment, tuple) else (fragment,)
    assert any(f in line for f in fragments), (fragments, line)
    assert snapshot(tmp_path) == before


# ---- what onnx.checker refuses but the tool accepts -------------------------------------------
def tolerated_model(defect=None, all_of_it=True) -> onnx.ModelProto:
    """The base model as onnx.checker would refuse it though it is fine here: its nodes out of
    order and, with `all_of_it`, its input and output without a shape and its graph unnamed.
    `defect(m)` adds a real one."""
    m = base()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    if all_of_it:
        m.graph.name = ""
        for value in (m.graph.input[0], m.graph.output[0]):
            value.type.tensor_type.ClearField("shape")
    if defect is not None:
        defect(m)
    return m


@pytest.mark.parametrize("command", ["lint", "explain", "convert"])
def test_what_only_the_checker_refuses_is_accepted(tmp_path, command):
    # convert keeps an empty graph name and shapeless inputs and outputs, which its own output
    # check then refuses (exit 3, as before the input checks): left to the rewrite, so the
    # converted model is only unsorted
    path = write_model(tolerated_model(all_of_it=command != "convert"), tmp_path / "models" / "tolerated.onnx")
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.load(str(path)))
    out = tmp_path / "out"
    out.mkdir()
    outcome = invoke(command_argv(command, path, out))
    assert outcome.exception is None and outcome.code in (0, 1), (outcome.code, outcome.stderr)


@pytest.mark.parametrize("command", ["lint", "explain", "convert"])
def test_a_defect_behind_what_the_checker_refuses_is_still_found(tmp_path, command):
    """The checker stops at the unsorted graph; its stand-in (sorted, shapes filled in) goes on
    and finds the MatMul with one input."""
    m = tolerated_model(lambda m: m.graph.node[2].input.pop())  # fc, now last
    path = write_model(m, tmp_path / "models" / "hidden_defect.onnx")
    out = tmp_path / "out"
    out.mkdir()
    line = assert_one_error(invoke(command_argv(command, path, out)), path.name)
    assert "'fc'" in line or "Node(fc)" in line, line


def test_a_bug_is_still_a_bug(tmp_path, monkeypatch):
    """The conversion of a sound model fails: the input passes the checks, so it is exit 3."""
    import autocast_onnx.pipeline as pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(pipeline, "apply_plan", broken)
    path = write_model(base(), tmp_path / "models" / "sound.onnx")
    outcome = invoke(["convert", path, "-o", tmp_path / "o.onnx"])
    assert outcome.code == 3 and "simulated bug" in outcome.stderr, (outcome.code, outcome.stderr)


def test_external_data_shorter_than_its_dims(tmp_path):
    """The size check holds for external data too (the loader checks the location)."""
    path = B.external_model(tmp_path / "model")
    B.edit_external(path, length=100)
    out = tmp_path / "out"
    out.mkdir()
    for command in COMMANDS:
        line = assert_one_error(invoke(command_argv(command, path, out)), "external data holds 100 bytes")
        assert "'w1'" in line, line
