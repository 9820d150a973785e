"""Converted payloads held beside the model and spliced into its encoding at the save (splice.py).

A save in one piece keeps each converted initializer's payload where it was converted and writes
the model's bytes with the payloads spliced in. Here: the bytes are exactly those protobuf writes
for the model with the payloads in their tensors, whatever sits around a held tensor (other
initializers, fields after raw_data, a held tensor in a subgraph or no longer in the model); an
encoding the splice does not expect falls back to the ordinary serialization; and convert_file's
output and returned model are those of a conversion that never held anything."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from helpers import cost_of, parse, randn
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx.fast import splice, wire
from autocast_onnx.fast.splice import HOLD_MIN_BYTES, HeldPayloads, Pieces, check_with_stand_in
from autocast_onnx.pipeline import convert, convert_file

BIG = [32, 64]  # 8 KiB of fp32, 4 KiB once fp16: above HOLD_MIN_BYTES


def weights_model() -> onnx.ModelProto:
    """Big weights first, between and last among small and int64 initializers; one big weight
    carries a doc_string (a field after raw_data); an If branch holds a big weight of its own."""
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w_body"], ["t"], name="body_mm")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(randn([64, 64], seed=9), "w_body")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["e"], name="body_id")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    model = parse(
        """
        net (float[2,32] x, bool c) => (float[2,64] y) {
            [fc1] h = MatMul(x, w_first)
            [fc2] y0 = MatMul(h, w_mid)
            [add] y1 = Add(y0, bias)
            [fc3] y2 = MatMul(y1, w_last)
            [shape] s = Reshape(y2, shape)
            [branch] y = If(c)
        }
        """,
        w_first=randn(BIG, seed=1),
        bias=randn([64], seed=2),
        w_mid=randn([64, 64], seed=3),
        shape=np.array([2, 64], dtype=np.int64),
        w_last=randn([64, 64], seed=4),
    )
    branch = next(n for n in model.graph.node if n.name == "branch")
    branch.attribute.extend([helper.make_attribute("then_branch", then_branch),
                             helper.make_attribute("else_branch", else_branch)])  # fmt: skip
    by_name = {t.name: t for t in model.graph.initializer}
    by_name["w_mid"].doc_string = "documented: its doc_string follows raw_data"
    return model


def hold(model: onnx.ModelProto, names: set[str]) -> tuple[HeldPayloads, bytes]:
    """Convert the named initializers (main graph or the If branch) to fp16, holding their
    payloads; returns the held payloads and the bytes protobuf writes with them inline."""
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    held = HeldPayloads()
    for graph, twin_graph in ((model.graph, expected.graph), *_bodies(model, expected)):
        for tensor, twin in zip(graph.initializer, twin_graph.initializer):
            if tensor.name in names:
                half = numpy_helper.to_array(tensor).astype(np.float16).tobytes()
                for t in (tensor, twin):
                    t.data_type = TensorProto.FLOAT16
                    t.raw_data = half
                assert held.put(tensor, np.frombuffer(half, np.uint8))
    return held, expected.SerializeToString()


def _bodies(model, expected):
    for node, twin in zip(model.graph.node, expected.graph.node):
        for attr, attr_twin in zip(node.attribute, twin.attribute):
            if attr.type == onnx.AttributeProto.GRAPH:
                yield attr.g, attr_twin.g


@pytest.mark.parametrize(
    "names",
    [
        {"w_first", "w_mid", "w_last"},  # the first initializer held
        {"w_mid"},  # held between others, with a field after raw_data
        {"w_last"},  # the last one only
        {"w_first", "w_last", "w_body"},  # one of them in a subgraph: given to its tensor instead
    ],
    ids=["all-main", "middle-doc-string", "last", "with-subgraph"],
)
def test_the_splice_writes_the_bytes_protobuf_writes(names):
    model = weights_model()
    held, expected = hold(model, names)
    assert len(held) == len(names)
    written = held.serialize(model)
    assert written == expected
    main_held = {t.name for t in model.graph.initializer if t.name in names}
    # the main graph's payloads stay held, out of their tensors; a subgraph's is given to it
    assert len(held) == len(main_held)
    assert all(not t.HasField("raw_data") for t in model.graph.initializer if t.name in main_held)
    assert held.serialize(model) == expected  # a second save writes the same
    assert held.inline() == len(main_held) and len(held) == 0
    assert model.SerializeToString() == expected


def test_small_payloads_go_to_their_tensors():
    tensor = numpy_helper.from_array(np.zeros(HOLD_MIN_BYTES // 2 - 1, np.float16), "small")
    held = HeldPayloads()
    assert not held.put(tensor, tensor.raw_data) and len(held) == 0
    assert len(tensor.raw_data) == HOLD_MIN_BYTES - 2


def test_a_held_tensor_no_longer_in_the_model_is_given_its_payload():
    model = weights_model()
    held, _ = hold(model, {"w_first", "w_mid"})
    gone = model.graph.initializer[0]
    del model.graph.initializer[0]  # w_first, removed after its payload was held
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    by_name = {t.name: t for t in expected.graph.initializer}
    by_name["w_mid"].raw_data = randn([64, 64], seed=3).astype(np.float16).tobytes()
    assert held.serialize(model) == expected.SerializeToString()
    assert len(held) == 1 and len(gone.raw_data) == 2 * 32 * 64


def test_an_encoding_the_splice_does_not_expect_is_serialized_the_ordinary_way(monkeypatch):
    model = weights_model()
    held, expected = hold(model, {"w_first", "w_mid"})

    def unexpected(*args):
        raise wire.Unwalked("an encoding the splice does not expect")

    monkeypatch.setattr(splice, "_splice", unexpected)
    assert held.serialize(model) == expected
    assert len(held) == 0  # given to their tensors on the way
    assert model.SerializeToString() == expected


def test_the_splice_refuses_an_encoding_without_its_markers():
    model = weights_model()
    hold(model, {"w_mid"})
    first = model.graph.initializer[2]
    with pytest.raises(wire.Unwalked, match="first marker"):
        splice._splice(model.SerializeToString(), first.SerializeToString(), b"\x01" * 16, [(2, first, b"x")])


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_convert_file_writes_and_returns_what_an_in_memory_conversion_gives(tmp_path, precision):
    model = weights_model()
    source = tmp_path / "net.onnx"
    onnx.save(model, source)
    result = convert_file(source, tmp_path / "out.onnx", check="full", precision=precision)
    written = (tmp_path / "out.onnx").read_bytes()
    assert written == convert(onnx.load(source), precision=precision).model.SerializeToString()
    # the converted weights were spliced into the file, not given to the tensors...
    still = {t.name: t for t in result._model.graph.initializer}
    low = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.BFLOAT16
    assert still["w_first"].data_type == low and not still["w_first"].HasField("raw_data")
    # ...until the model is read: then it is whole, and the same model as the file
    assert result.model.SerializeToString() == written
    assert len(result.model.graph.initializer[0].raw_data) == 2 * 32 * 64


def test_the_summary_reads_the_nodes_without_giving_the_payloads_to_their_tensors(tmp_path):
    """The command line prints the summary (its cost line lists the casts) and never reads the
    model: the held payloads stay where they are."""
    source = tmp_path / "net.onnx"
    onnx.save(weights_model(), source)
    result = convert_file(source, tmp_path / "out.onnx")
    held = result._held
    assert held is not None and len(held) == 3
    cost = cost_of(result)
    written = onnx.load(tmp_path / "out.onnx")
    assert cost["computed"] and cost["casts"] == sum(n.op_type == "Cast" for n in written.graph.node) == 1
    assert "casts added" in result.summary()
    assert result._held is held and len(held) == 3


# ---- the stand-in the check reads ---------------------------------------------------------------


def test_the_stand_in_has_the_held_weights_as_inputs_and_everything_else_as_written():
    model = weights_model()
    held, expected = hold(model, {"w_first", "w_mid", "w_last"})
    pieces, stand_in = held.serialize_with_stand_in(model)
    assert isinstance(pieces, Pieces) and len(pieces) == len(expected)
    written = bytes(pieces)
    assert written == expected and written == held.serialize(model)
    assert stand_in is not None
    got, whole = onnx.ModelProto.FromString(stand_in), onnx.ModelProto.FromString(written)
    # the held weights: graph inputs of their element type and dims, no longer initializers
    inputs = {vi.name: vi.type.tensor_type for vi in got.graph.input}
    for name, dims in (("w_first", BIG), ("w_mid", [64, 64]), ("w_last", [64, 64])):
        assert inputs[name].elem_type == TensorProto.FLOAT16
        assert [d.dim_value for d in inputs[name].shape.dim] == dims
    assert [t.name for t in got.graph.initializer] == ["bias", "shape"]
    assert [t.SerializeToString() for t in got.graph.initializer] == [
        t.SerializeToString() for t in whole.graph.initializer if t.name in ("bias", "shape")
    ]
    # every node (the If's branches with their own weight included), output and model field as written
    assert got.graph.node == whole.graph.node and got.graph.output == whole.graph.output
    assert [vi for vi in got.graph.input if vi.name in ("x", "c")] == list(whole.graph.input)
    assert got.opset_import == whole.opset_import and got.ir_version == whole.ir_version
    onnx.checker.check_model(stand_in)  # as the whole model: both pass the basic check
    onnx.checker.check_model(written)


@pytest.mark.parametrize("case", ["named-like-an-input", "ir-version-3", "payload-not-its-dims", "only-in-a-body"])
def test_no_stand_in_where_inputs_cannot_stand_in(case):
    model = weights_model()
    if case == "named-like-an-input":
        model.graph.input.append(helper.make_tensor_value_info("w_mid", TensorProto.FLOAT16, [64, 64]))
    if case == "ir-version-3":
        model.ir_version = 3
    held, expected = hold(model, {"w_body"} if case == "only-in-a-body" else {"w_first", "w_mid"})
    if case == "payload-not-its-dims":
        model.graph.initializer[2].dims[0] = 63  # w_mid: 64 x 64 held, 63 x 64 declared
        expected = None
    written, stand_in = held.serialize_with_stand_in(model)
    assert stand_in is None
    if expected is not None:
        assert bytes(written) == expected


def _checker_refuses(data: bytes) -> bool:
    try:
        onnx.checker.check_model(data)
    except onnx.checker.ValidationError:
        return True
    return False


def test_the_check_reads_the_stand_in_and_confirms_a_failure_on_the_whole_model():
    from autocast_onnx.errors import InternalCheckError
    from autocast_onnx.rewrite.checks import check_result

    check = functools.partial(check_result, full=False)
    model = weights_model()
    held, _ = hold(model, {"w_first", "w_mid"})
    pieces, stand_in = held.serialize_with_stand_in(model)
    written = bytes(pieces)
    broken = onnx.ModelProto.FromString(written)
    broken.graph.node[1].op_type = "NoSuchOp"
    broken_bytes = broken.SerializeToString()
    assert _checker_refuses(broken_bytes) and not _checker_refuses(stand_in)
    # a passing stand-in is the verdict: the whole model's bytes are not parsed again
    check_with_stand_in(check, broken_bytes, stand_in)
    # a stand-in that fails where the whole model passes: the whole model's verdict counts
    wrong_stand_in = onnx.ModelProto.FromString(stand_in)
    wrong_stand_in.graph.node[0].op_type = "NoSuchOp"
    check_with_stand_in(check, pieces, wrong_stand_in.SerializeToString())
    # both fail: the error is the whole model's
    with pytest.raises(InternalCheckError, match="NoSuchOp"):
        check_with_stand_in(check, broken_bytes, wrong_stand_in.SerializeToString())
    # no stand-in: the whole model, joined from its pieces
    with pytest.raises(InternalCheckError, match="NoSuchOp"):
        check_with_stand_in(check, broken_bytes, None)
    check_with_stand_in(check, pieces, None)


def test_convert_file_checks_the_stand_in_and_writes_the_whole_model(tmp_path, monkeypatch):
    import autocast_onnx.pipeline as pipeline

    seen = []
    real = pipeline.check_result

    def spy(model, full=True):
        seen.append(len(model))
        return real(model, full)

    monkeypatch.setattr(pipeline, "check_result", spy)
    monkeypatch.setattr(pipeline, "check_with_stand_in", check_with_stand_in)  # not conftest's, which checks both
    source = tmp_path / "net.onnx"
    onnx.save(weights_model(), source)
    convert_file(source, tmp_path / "out.onnx", check="full")
    written = (tmp_path / "out.onnx").read_bytes()
    [stood] = seen  # the stand-in alone: it passed
    assert stood < len(written) - 3 * 4096
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)


# ---- the pieces the save writes without joining them ---------------------------------------------


def _some_pieces(count: int) -> tuple[Pieces, bytes]:
    rng = np.random.default_rng(count)
    parts = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 40, size=count)]
    parts = [p if k % 3 else memoryview(p) for k, p in enumerate(parts)]  # bytes and views, as the splice gives
    return Pieces(parts), b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("count", [0, 1, 1023, 1024, 2500])
def test_pieces_are_written_whole_in_their_order(tmp_path, count):
    pieces, joined = _some_pieces(count)
    assert len(pieces) == len(joined) and bytes(pieces) == joined
    with open(tmp_path / "out.bin", "wb") as fh:
        pieces.write_to(fh.fileno())
    assert (tmp_path / "out.bin").read_bytes() == joined


def test_a_short_writev_is_finished_piece_by_piece(tmp_path, monkeypatch):
    import os

    from autocast_onnx import io

    pieces, joined = _some_pieces(3000)
    real = os.writev

    def short(fd, buffers):  # writes about half of what it is given, cutting a buffer
        half = sum(len(b) for b in buffers) // 2
        return os.write(fd, b"".join(bytes(b) for b in buffers)[:half]) if half else real(fd, buffers)

    monkeypatch.setattr(io.os, "writev", short)
    with open(tmp_path / "out.bin", "wb") as fh:
        pieces.write_to(fh.fileno())
    assert (tmp_path / "out.bin").read_bytes() == joined


def test_a_failed_check_of_spliced_pieces_writes_nothing(tmp_path, monkeypatch):
    """The pieces are written before the check; when it fails, the temporary goes and the file
    already at the output stays as it was."""
    import autocast_onnx.pipeline as pipeline
    from autocast_onnx.errors import InternalCheckError

    given = []

    def failing(check, whole, stand_in):
        given.append(whole)
        raise InternalCheckError("the converted model fails onnx.checker: planted")

    monkeypatch.setattr(pipeline, "check_with_stand_in", failing)
    source, out = tmp_path / "net.onnx", tmp_path / "out"
    onnx.save(weights_model(), source)
    out.mkdir()
    (out / "x.onnx").write_bytes(b"an older model")
    with pytest.raises(InternalCheckError, match="planted"):
        convert_file(source, out / "x.onnx")
    assert isinstance(given[0], Pieces)  # the spliced bytes, never joined
    assert sorted(p.name for p in out.iterdir()) == ["x.onnx"]
    assert (out / "x.onnx").read_bytes() == b"an older model"


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs FIFOs (POSIX)")
def test_spliced_pieces_reach_a_fifo_whole(tmp_path):
    import os
    import threading

    source, fifo = tmp_path / "net.onnx", tmp_path / "pipe"
    onnx.save(weights_model(), source)
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = convert_file(source, fifo, check="full")
    reader.join(timeout=20)
    assert not reader.is_alive() and got
    assert result._held is not None and len(result._held) == 3  # spliced, not inlined
    assert got[0] == convert(onnx.load(source)).model.SerializeToString()


def test_a_converted_copy_of_a_weight_read_at_both_precisions_is_written_whole(tmp_path):
    """A weight read by a low-precision MatMul and by an fp32 op (a tied embedding and head) is
    kept and gets a converted copy, which the rewrite adds to the graph after converting it: its
    payload goes into the copy (the sink's put_new), never held by reference, or the file would
    get a tensor without a value."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("ReduceSumSquare", ["w"], ["norm"], keepdims=0),
            helper.make_node("Add", ["h", "norm"], ["y"]),
        ],
        "tied",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    source = tmp_path / "tied.onnx"
    onnx.save(model, source)
    result = convert_file(source, tmp_path / "out.onnx", check="full")
    written = onnx.load(tmp_path / "out.onnx")
    copies = [t for t in written.graph.initializer if t.name != "w"]
    assert len(copies) == 1 and copies[0].data_type == TensorProto.FLOAT16 and len(copies[0].raw_data) == 2 * 64 * 64
    assert (tmp_path / "out.onnx").read_bytes() == convert(model).model.SerializeToString()
    assert result.stats.initializer_copies == 1
