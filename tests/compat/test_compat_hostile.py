"""The drop-ins do what they were told (issue 36, defect 5), with arguments that the peers take
and the drop-ins used to get wrong:

- node_block_list / op_block_list given as a generator or an iterator were read by a check and
  were empty after it, so the named nodes were converted with no warning; keep_io_types as one
  was refused. Every iterable is now read once, before any check.
- an eighth positional argument (onnxconverter-common's check_fp16_ready) was a TypeError; ONNX
  Runtime's copy, whose eighth is force_fp16_initializers, has its own drop-in with its own
  signature (tests/compat/test_compat.py and tests/compat/test_compat_peers.py hold both to the peers').
- a ModelProto over 2 GiB in memory ended in protobuf's EncodeError (the drop-in's copy of the
  model encodes it); the peer converts it in place. It is converted through a temporary folder.
- the plan's warnings pointed at autocast_onnx/compat.py instead of the caller's line."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from google.protobuf.message import EncodeError
from helpers import parse, randn
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx import compat
from autocast_onnx.compat import CompatWarning, auto_convert_mixed_precision, convert_float_to_float16
from autocast_onnx.errors import AutocastError

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatWarning)
        return call(*args, **kwargs)


def three_layers() -> onnx.ModelProto:
    return parse(
        """
        g (float[2,32] x) => (float[2,32] y, float[2,32] z) {
            [fc] h = MatMul(x, w)
            [act] a = Relu(h)
            [fc2] y = MatMul(a, w)
            [soft] z = Softmax(a)
        }""",
        w=randn([32, 32]),
    )


def computes(m: onnx.ModelProto, name: str) -> int:
    """The element type the named node reads its first input in (a Cast's `to`, or the declared
    type of a graph input or initializer)."""
    first = next(n for n in m.graph.node if n.name == name).input[0]
    declared = {v.name: v.type.tensor_type.elem_type for v in m.graph.input}
    declared.update({t.name: t.data_type for t in m.graph.initializer})
    if first in declared:
        return declared[first]
    producer = next(n for n in m.graph.node if first in n.output)
    if producer.op_type == "Cast":
        return next(a.i for a in producer.attribute if a.name == "to")
    return computes(m, producer.name)


# ---- iterables: read once ------------------------------------------------------------------------

# each way of giving names that the peers take (they read the list once: set(op_block_list))
KINDS = {
    "generator": lambda names: (n for n in names),
    "iterator": lambda names: iter(names),
    "map": lambda names: map(str, names),
    "tuple": tuple,
    "set": set,
    "dict": dict.fromkeys,
    "dict-keys": lambda names: dict.fromkeys(names).keys(),
    "reversed": lambda names: reversed(list(names)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_node_block_list_of_any_iterable_blocks_the_nodes(kind):
    """A generator used to be spent by the check of its items: `fc` was converted, silently."""
    source = three_layers()
    listed = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=["fc", "act"])
    out = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=KINDS[kind](["fc", "act"]))
    assert computes(out, "fc") == F32 and computes(out, "fc2") == F16
    assert out.SerializeToString() == listed.SerializeToString()


@pytest.mark.parametrize("kind", KINDS)
def test_op_block_list_of_any_iterable_blocks_the_ops(kind):
    source = three_layers()
    listed = quiet(convert_float_to_float16, source, keep_io_types=True, op_block_list=["MatMul"])
    out = quiet(convert_float_to_float16, source, keep_io_types=True, op_block_list=KINDS[kind](["MatMul"]))
    assert computes(out, "fc") == F32 and computes(out, "fc2") == F32
    assert out.SerializeToString() == listed.SerializeToString()


@pytest.mark.parametrize("kind", KINDS)
def test_keep_io_types_names_of_any_iterable_keep_those(kind):
    """ONNX Runtime's keep_io_types as names: a generator of them was refused as no list."""
    source = three_layers()
    out = quiet(compat.onnxruntime_convert_float_to_float16, source, keep_io_types=KINDS[kind](["x", "y"]))
    types = {v.name: v.type.tensor_type.elem_type for v in list(out.graph.input) + list(out.graph.output)}
    assert types == {"x": F32, "y": F32, "z": F16}


def test_an_empty_generator_of_force_fp16_inputs_asks_for_nothing_and_a_full_one_is_refused():
    quiet(compat.onnxruntime_convert_float_to_float16, three_layers(), force_fp16_inputs=(x for x in []))
    with pytest.raises(AutocastError) as err:
        compat.onnxruntime_convert_float_to_float16(three_layers(), force_fp16_inputs=iter([("Resize", [2])]))
    assert err.value.where == "force_fp16_inputs"


@pytest.mark.parametrize(
    "keyword,value",
    [("node_block_list", 5), ("op_block_list", 2.5), ("node_block_list", b"fc"), ("force_fp16_inputs", 3)],
)
def test_a_value_that_is_no_list_is_refused_in_one_line(keyword, value):
    """node_block_list=5 used to end in TypeError ('int' object is not iterable)."""
    with pytest.raises(AutocastError) as err:
        compat.onnxruntime_convert_float_to_float16(three_layers(), **{keyword: value})
    assert err.value.where == keyword and "\n" not in err.value.line() and err.value.hint


# ---- the peers' positional parameters ------------------------------------------------------------


def test_the_eighth_positional_argument_is_check_fp16_ready_as_in_onnxconverter_common():
    """convert_float_to_float16(model, 1e-7, 1e4, False, False, None, None, False) is the peer's
    documented signature; it used to be a TypeError (7 positional arguments at most)."""
    converted = quiet(convert_float_to_float16, three_layers())
    again = quiet(convert_float_to_float16, converted, 1e-7, 1e4, False, False, None, None, False)
    assert computes(again, "fc") == F16
    with pytest.raises(AutocastError) as err:
        quiet(convert_float_to_float16, converted, 1e-7, 1e4, False, False, None, None, True)
    assert err.value.where == "check_fp16_ready"


def test_onnx_runtimes_eighth_positional_argument_keeps_its_meaning():
    """ONNX Runtime's eighth is force_fp16_initializers: True asks for what the project does not
    do, refused naming it; its copy does not check for a converted model (no check_fp16_ready)."""
    with pytest.raises(AutocastError) as err:
        compat.onnxruntime_convert_float_to_float16(three_layers(), 5.96e-08, 65504.0, True, False, None, None, True)
    assert err.value.where == "force_fp16_initializers"
    converted = quiet(compat.onnxruntime_convert_float_to_float16, three_layers())
    quiet(compat.onnxruntime_convert_float_to_float16, converted, 5.96e-08, 65504.0, False, False, None, None, False)


def test_the_plan_warnings_point_at_the_callers_line():
    for call in (convert_float_to_float16, compat.onnxruntime_convert_float_to_float16):
        with pytest.warns(CompatWarning, match="no_such_node") as record:
            call(three_layers(), node_block_list=["no_such_node"])
        assert {w.filename for w in record} == {__file__}


# ---- a model protobuf cannot encode ----------------------------------------------------------------


def test_the_way_through_files_gives_the_model_the_in_memory_way_gives(monkeypatch, tmp_path):
    """The route a model over 2 GiB takes, on a small model told apart by _encoded alone (the one
    place the size decides): the same bytes as converting it in memory, the caller's model
    unchanged, nothing left in the temporary folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    source = three_layers()
    before = source.SerializeToString()
    plain = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=iter(["fc2"]))
    real, real_save = compat._encoded, compat._save_external
    monkeypatch.setattr(compat, "_encoded", lambda m: None if m is source else real(m))
    stored = []

    def save(model, path):  # the file converted: its weight as external data
        real_save(model, path)
        stored.extend(t.data_location for t in onnx.load(str(path), load_external_data=False).graph.initializer)

    monkeypatch.setattr(compat, "_save_external", save)
    through = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=iter(["fc2"]))
    assert stored == [TensorProto.EXTERNAL]
    assert through.SerializeToString() == plain.SerializeToString()
    assert source.SerializeToString() == before and list(tmp_path.iterdir()) == []
    with pytest.raises(AutocastError) as err:
        quiet(auto_convert_mixed_precision, source, {"x": np.ones((2, 32), np.float32)}, rtol=0.01)
    assert err.value.where == "model" and "2 GiB" in err.value.what and "convert_float_to_float16" in err.value.hint


def over_2gib() -> onnx.ModelProto:
    """A ModelProto over 2 GiB in memory, built in place (no copy of the payload): a 2 GiB uint8
    table beside a small float MLP, which is what gets converted."""
    m = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
    g = m.graph
    table = g.initializer.add(name="table", data_type=TensorProto.UINT8, dims=[2**31])
    table.raw_data = bytes(2**31)
    g.initializer.add().CopyFrom(numpy_helper.from_array(randn([8, 8]), "w"))
    g.node.extend(
        [
            helper.make_node("Shape", ["table"], ["size"], name="size_of"),
            helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
            helper.make_node("MatMul", ["h", "w"], ["y"], name="fc2"),
        ]
    )
    g.input.add().CopyFrom(helper.make_tensor_value_info("x", F32, [2, 8]))
    g.output.extend(
        [helper.make_tensor_value_info("y", F32, [2, 8]), helper.make_tensor_value_info("size", TensorProto.INT64, [1])]
    )
    return m


def test_a_model_over_2_gib_in_memory_is_converted():
    """It used to end in protobuf's EncodeError. About 6 GiB of memory at the peak, and half a
    minute: the payload is written to a temporary folder, and the result read back. (The accuracy
    search's refusal of such a model, decided by the same _encoded, is tested above.)"""
    source = over_2gib()
    with pytest.raises(EncodeError):
        source.SerializeToString()  # really more than protobuf encodes
    out = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=(n for n in ["fc2"]))
    assert computes(out, "fc") == F16 and computes(out, "fc2") == F32
    table = next(t for t in out.graph.initializer if t.name == "table")
    assert list(table.dims) == [2**31] and table.data_type == TensorProto.UINT8
    assert table.HasField("raw_data") and table.data_location == TensorProto.DEFAULT and not table.external_data
    assert [t.name for t in source.graph.initializer] == ["table", "w"]  # the caller's model, as it was
    assert source.graph.initializer[1].data_type == F32 and len(source.graph.node) == 3
