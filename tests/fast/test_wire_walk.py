"""The hand-written walk of the protobuf encoding (wire.py) against protobuf's own parser.

protobuf accepts more than one encoding of the same model: a field key or a length written as a
longer varint than it needs, fields in any order, a field given twice (the last wins), unknown
fields, repeated scalars packed or not. The walk must find each initializer of the main graph
where protobuf does, or give up (wire.Unwalked) so the file is parsed whole; and what the loader
and the weight screen take from the walk is checked against the parse, so a walk that disagrees
with it is never used. Here: the regression of issue 26 (an initializer key written as
`0xAA 0x00`, which shifted every ordinal after it and restored weights from their neighbours'
bytes), in process and through the command line; encodings the walk must refuse; mismatches the
cross-checks must catch; and a differential fuzz of the walk and the loader against protobuf on
re-encoded models (tests/wire_reencode.py)."""

from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

import helpers
import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from helpers import parse, randn
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from wire_reencode import Variations, reencode
from wire_reencode import varint as encode_varint

from autocast_onnx.cli.main import main as cli_main
from autocast_onnx.errors import AutocastError
from autocast_onnx.fast import in_file, screen_work, wire
from autocast_onnx.fast.screen import WeightScreen
from autocast_onnx.io import load_model

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker and payloads left in the file are Linux-only"
)

SHAPE = [32, 32]  # 4 KiB of fp32 each: io.LEFT_IN_FILE_MIN_BYTES, left in the file


def chain() -> onnx.ModelProto:
    """Four MatMuls in a row, each with its own 4 KiB fp32 weight of the same shape (so a weight
    read from its neighbour's bytes fits its dims)."""
    return parse(
        """
        chain (float[2,32] x) => (float[2,32] y) {
            [fc1] h1 = MatMul(x, w1)
            [fc2] h2 = MatMul(h1, w2)
            [fc3] h3 = MatMul(h2, w3)
            [fc4] y = MatMul(h3, w4)
        }
        """,
        **{f"w{k}": randn(SHAPE, seed=k, scale=0.2) for k in range(1, 5)},
    )


def with_long_first_initializer_key(model: onnx.ModelProto) -> bytes:
    """`model` serialized with its graph's initializers last and the first one's field key
    written as two bytes, 0xAA 0x00 (field 5, wire type 2, non-minimal), as protobuf accepts."""
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    del graph.initializer[:]
    body = graph.SerializeToString()
    for k, tensor in enumerate(model.graph.initializer):
        payload = tensor.SerializeToString()
        body += (b"\xaa\x00" if k == 0 else b"\x2a") + encode_varint(len(payload)) + payload
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.ClearField("graph")
    return rest.SerializeToString() + b"\x3a" + encode_varint(len(body)) + body


def long_key_model(tmp_path: Path) -> tuple[Path, onnx.ModelProto]:
    source = tmp_path / "chain.onnx"
    source.write_bytes(with_long_first_initializer_key(chain()))
    truth = onnx.load(source)
    assert [t.name for t in truth.graph.initializer] == ["w1", "w2", "w3", "w4"]
    onnx.checker.check_model(truth, full_check=True)
    return source, truth


def assert_same_weights(converted: onnx.ModelProto, truth: onnx.ModelProto) -> None:
    """Every initializer of `converted` holds the weight of the same name in `truth`: equal when
    kept fp32, the fp32 weight cast to fp16 when converted."""
    expected = {t.name: numpy_helper.to_array(t) for t in truth.graph.initializer}
    assert {t.name for t in converted.graph.initializer} == set(expected)
    for tensor in converted.graph.initializer:
        got = numpy_helper.to_array(tensor)
        want = expected[tensor.name]
        if tensor.data_type == TensorProto.FLOAT16:
            want = want.astype(np.float16)
        else:
            assert tensor.data_type == TensorProto.FLOAT
        assert np.array_equal(got, want), f"{tensor.name} is not its own weight"


def assert_runs_like(converted: onnx.ModelProto, truth: onnx.ModelProto) -> None:
    import onnxruntime as ort

    feeds = {"x": randn([2, 32], seed=9)}
    outputs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for m in (truth, converted)
    ]
    np.testing.assert_allclose(outputs[1].astype(np.float32), outputs[0], rtol=2e-2, atol=2e-2)


@linux_only
def test_a_long_initializer_key_in_process(tmp_path):
    """Issue 26: the walk took only the one-byte key 0x2A for an initializer, passed over `w1`,
    and numbered each initializer after it one too low: the loader mapped each payload it left
    in the file to the tensor before its own, and read w3's bytes back into w2, w4's into w3."""
    source, truth = long_key_model(tmp_path)
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    if loaded.left_in_file is not None:
        loaded.left_in_file.inline()
    assert_same_weights(loaded.model, truth)
    assert loaded.model == truth


worker_for_small_files = pytest.fixture(name="worker_for_small_files")(helpers.worker_for_small_files)


@linux_only
@pytest.mark.parametrize("excluded", [[], ["fc2", "fc3"]], ids=["all-fp16", "two-kept-fp32"])
def test_a_long_initializer_key_through_the_command_line(tmp_path, worker_for_small_files, excluded):
    """The same file converted by `autocast-onnx convert`, whose worker walks it before the load
    and screens the weights: every weight is its own, converted or kept, and the model runs as
    the original does."""
    source, truth = long_key_model(tmp_path)
    target = tmp_path / "out.onnx"
    args = ["convert", str(source), "-o", str(target), "-q"]
    for node in excluded:
        args += ["--exclude-node", node]
    with pytest.raises(SystemExit) as done:
        cli_main(args)
    assert done.value.code == 0
    converted = onnx.load(target)
    assert_same_weights(converted, truth)
    kept = {t.name for t in converted.graph.initializer if t.data_type == TensorProto.FLOAT}
    assert kept == {"w2", "w3"} if excluded else not kept
    assert_runs_like(converted, truth)


@linux_only
def test_a_long_initializer_key_through_the_workers_walk(tmp_path, worker_for_small_files):
    """The worker's walk, handed to the loader and to the screen directly."""
    source, truth = long_key_model(tmp_path)
    screen = WeightScreen.start(source, min_bytes=0)
    assert screen is not None
    loaded = load_model(source, load_external=False, parse=in_file.parser(screen.encoding))
    screened = screen.results(loaded.model)
    if loaded.left_in_file is not None:
        loaded.left_in_file.inline()
    assert_same_weights(loaded.model, truth)
    assert screened is not None and set(screened) == {"w1", "w2", "w3", "w4"}
    for tensor in truth.graph.initializer:
        half = numpy_helper.to_array(tensor).astype(np.float16).tobytes()
        assert bytes(screened[tensor.name][0]) == half, tensor.name


# ---- encodings the walk refuses, and protobuf's rules it follows ----------------------------------


def big_tensor(name: str = "w", seed: int = 1) -> onnx.TensorProto:
    return numpy_helper.from_array(randn(SHAPE, seed=seed), name)


def model_around(tensor_body: bytes, graph_extra: bytes = b"") -> bytes:
    """A model whose graph holds one initializer encoded as `tensor_body` (and `graph_extra`
    before it), with an Identity node that returns it."""
    model = parse(
        """
        one () => (float[32,32] y) {
            [pass] y = Identity(w)
        }
        """
    )
    graph = model.graph.SerializeToString() + graph_extra
    graph += b"\x2a" + encode_varint(len(tensor_body)) + tensor_body
    model.ClearField("graph")
    return model.SerializeToString() + b"\x3a" + encode_varint(len(graph)) + graph


def loads_like_protobuf(tmp_path: Path, data: bytes) -> onnx.ModelProto | None:
    """Load `data` with payloads left in the file and read back; assert it is what protobuf
    parses, or that both refuse it. Returns the loaded model (None when refused)."""
    source = tmp_path / "m.onnx"
    source.write_bytes(data)
    try:
        whole = onnx.ModelProto.FromString(data)
    except DecodeError:
        with pytest.raises(AutocastError, match="protobuf parse failed"):
            load_model(source, load_external=False, parse=in_file.parser())
        return None
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    if loaded.left_in_file is not None:
        loaded.left_in_file.inline()
    assert loaded.model == whole
    assert [t.SerializeToString() for t in loaded.model.graph.initializer] == [
        t.SerializeToString() for t in whole.graph.initializer
    ]
    return loaded.model


REFUSED = {
    # name: (bytes inserted before the initializer's fields, inside it)
    "a group": b"\x83\x7d" + b"\x84\x7d",  # field 2000 start/end group: protobuf skips it, the walk does not
    "a wire type 6": b"\x86\x7d",
    "a key of 6 bytes": b"\xc2\x80\x80\x80\x80\x00\x01a",
    "a length of 6 bytes": b"\x42\x81\x80\x80\x80\x80\x00a",
    "a varint of 11 bytes": b"\x10" + b"\x81" + b"\x80" * 9 + b"\x00",
    "field number 0": b"\x02\x00",
    "a key above 2**32 - 1": b"\xc2\x80\x80\x80\x10\x01a",
    "a length of 2**31": b"\x42\x80\x80\x80\x80\x08",
}


@linux_only
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_encoding_the_walk_does_not_follow_raises_unwalked(tmp_path, case):
    data = model_around(REFUSED[case] + big_tensor().SerializeToString())
    with pytest.raises(wire.Unwalked):
        list(wire.initializers(data))
    loads_like_protobuf(tmp_path, data)


@linux_only
@pytest.mark.parametrize("cut", [1, 2, 100, 4000])
def test_a_truncated_file_raises_unwalked(tmp_path, cut):
    data = model_around(big_tensor().SerializeToString())[:-cut]
    with pytest.raises(wire.Unwalked):
        list(wire.initializers(data))
    loads_like_protobuf(tmp_path, data)


def test_a_second_graph_field_raises_unwalked():
    data = model_around(big_tensor().SerializeToString())
    with pytest.raises(wire.Unwalked, match="two graph fields"):
        wire.main_graph(data + b"\x3a\x00")


FOLLOWED = {
    # name: (tensor fields before the rest of a 4 KiB fp32 tensor, what the walk must say)
    "data_type with bits above the 32nd (protobuf keeps the low 32)": (
        b"\x10\x8b\x80\x80\x80\x70",  # 11 + 7 * 2**32: FLOAT once the rest's data_type=1 is read
        {"dtype": 1, "plain": True},
    ),
    "an unknown data_location after EXTERNAL (a closed enum)": (b"\x70\x01\x70\x05", {"external": True}),
    "an unknown data_location alone": (b"\x70\x05", {"external": False, "plain": True}),
    "data_location DEFAULT given (kept as given)": (b"\x70\x00", {"external": False, "plain": False}),
    "raw_data twice (the last wins)": (b"\x4a\x03abc", {"plain": False}),
    "a name twice (the last wins)": (b"\x42\x05decoy", {"name": b"w", "plain": True}),
    "float_data packed, empty": (b"\x22\x00", {"plain": True}),
    "float_data packed": (b"\x22\x04\x00\x00\x80\x3f", {"plain": False}),
    "float_data unpacked": (b"\x25\x00\x00\x80\x3f", {"plain": False}),
    "float_data with wire type 0 (unknown)": (b"\x20\x01", {"plain": True}),
    "int64_data packed, empty": (b"\x3a\x00", {"plain": True}),
    "string_data, empty": (b"\x32\x00", {"plain": False}),
    "segment, empty": (b"\x1a\x00", {"plain": False}),
    "raw_data with wire type 0 (unknown)": (b"\x48\x05", {"plain": True}),
    "name with wire type 5 (unknown)": (b"\x45abcd", {"name": b"w"}),
    "unknown fields of wire types 0, 1, 2, 5": (
        b"\xf8\x01\x07" + b"\xf9\x01" + bytes(8) + b"\xfa\x01\x02hi" + b"\xfd\x01" + bytes(4),
        {"plain": True},
    ),
    "long keys and lengths": (b"\xc2\x80\x80\x00\x85\x80\x80\x00decoy", {"name": b"w", "plain": True}),
}


@linux_only
@pytest.mark.parametrize("case", sorted(FOLLOWED))
def test_the_walk_reads_what_protobuf_reads(tmp_path, case):
    before, expected = FOLLOWED[case]
    tensor = big_tensor()
    data = model_around(before + tensor.SerializeToString())
    (init,) = wire.initializers(data)
    parsed = onnx.ModelProto.FromString(data).graph.initializer[0]
    assert init.dtype == parsed.data_type and init.name == parsed.name.encode()
    assert init.external == (parsed.data_location == TensorProto.EXTERNAL)
    assert bytes(data[init.raw[1] : init.raw[1] + init.raw[2]]) == parsed.raw_data
    for key, value in expected.items():
        assert getattr(init, key) == value, key
    if not init.external:
        loads_like_protobuf(tmp_path, data)


@linux_only
def test_an_initializer_field_with_another_wire_type_is_not_an_initializer(tmp_path):
    """Field 5 of GraphProto with wire type 0 is an unknown field to protobuf: not counted."""
    data = model_around(big_tensor().SerializeToString(), graph_extra=b"\x28\x01")
    assert [init.ordinal for init in wire.initializers(data)] == [0]
    assert loads_like_protobuf(tmp_path, data) is not None


# ---- the cross-checks: a walk the parse does not bear out is never used -------------------------


def misnumbering(real):
    """A walk with the bug of issue 26: the first initializer passed over, the others numbered
    one too low."""

    def walk(data, graph=None):
        for init in list(real(data, graph))[1:]:
            yield init._replace(ordinal=init.ordinal - 1)

    return walk


@linux_only
def test_a_misnumbering_walk_is_caught_by_the_loader(tmp_path, monkeypatch):
    source = tmp_path / "chain.onnx"
    onnx.save(chain(), source)
    truth = onnx.load(source)
    monkeypatch.setattr(wire, "initializers", misnumbering(wire.initializers))
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    assert loaded.left_in_file is None  # parsed whole
    assert loaded.model == truth


@linux_only
def test_a_misnumbering_worker_is_caught_by_the_loader_and_the_screen(tmp_path, worker_for_small_files, monkeypatch):
    source = tmp_path / "chain.onnx"
    onnx.save(chain(), source)
    truth = onnx.load(source)
    real = wire.initializers
    monkeypatch.setattr(wire, "initializers", misnumbering(real))
    screen = WeightScreen.start(source, min_bytes=0)  # forked with the misnumbering walk
    monkeypatch.setattr(wire, "initializers", real)
    assert screen is not None
    loaded = load_model(source, load_external=False, parse=in_file.parser(screen.encoding))
    assert loaded.left_in_file is None and loaded.model == truth  # the worker's rows did not fit: parsed whole
    assert screen.results(loaded.model) is None


@linux_only
def test_a_worker_encoding_whose_rows_do_not_fit_is_not_used(tmp_path, worker_for_small_files):
    """Rows that name another tensor, or another offset, than the one the encoding puts there."""
    source = tmp_path / "chain.onnx"
    onnx.save(chain(), source)
    truth = onnx.load(source)
    for change in (
        lambda row: (row[0] + 1, *row[1:]),  # the next tensor
        lambda row: (row[0], row[1] + 4, *row[2:]),  # another offset
        lambda row: (*row[:3], b"w9"),  # another name
    ):
        screen = WeightScreen.start(source, min_bytes=0)
        encoding, rows, seen = screen.encoding()
        screen.close()
        assert rows[0][3] == b"w1"
        rows = [change(rows[0]), *rows[1:]]
        ready = (encoding, rows, seen)
        loaded = load_model(source, load_external=False, parse=in_file.parser(lambda ready=ready: ready))
        assert loaded.left_in_file is None and loaded.model == truth


@linux_only
@pytest.mark.parametrize("where", ["left-in-file", "in-memory"])
def test_a_screen_that_converted_other_bytes_is_not_used(tmp_path, worker_for_small_files, monkeypatch, where):
    """The worker's screen names each tensor right but converts another tensor's bytes (of the
    same size): the loaded model's tensor, left in the file elsewhere or held with other bytes,
    does not bear it out."""
    source = tmp_path / "chain.onnx"
    onnx.save(chain(), source)
    real = screen_work._fp32_payloads

    def swapped(data, inits=None):
        found = list(real(data, inits))
        (a, name_a, start_a, n), (b, name_b, start_b, _) = found[:2]
        return [(a, name_a, start_b, n), (b, name_b, start_a, n), *found[2:]]

    monkeypatch.setattr(screen_work, "_fp32_payloads", swapped)
    screen = WeightScreen.start(source, min_bytes=0)
    monkeypatch.setattr(screen_work, "_fp32_payloads", real)
    if where == "left-in-file":
        loaded = load_model(source, load_external=False, parse=in_file.parser(screen.encoding))
        assert loaded.left_in_file is not None and len(loaded.left_in_file) == 4
        model = loaded.model
    else:
        model = onnx.load(source)
    assert screen.results(model) is None


# ---- differential fuzz: the walk and the loader against protobuf, on re-encoded models ------------

PROFILE = os.environ.get("AUTOCAST_ONNX_FUZZ", "quick")
if PROFILE not in ("quick", "long"):
    raise ValueError(f"AUTOCAST_ONNX_FUZZ={PROFILE!r}: use quick or long")
# the profiles of tests/contracts/test_properties.py: "quick" derandomized (the same encodings every run)
FUZZ = settings(
    max_examples=int(os.environ.get("AUTOCAST_ONNX_FUZZ_EXAMPLES") or (40 if PROFILE == "quick" else 1000)),
    derandomize=PROFILE == "quick",
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def fuzz_model() -> bytes:
    """Initializers of every kind the walk tells apart: large fp32 (left in the file), one with
    data_location DEFAULT given, small fp32, fp16, int64, float_data, an odd-sized payload, a
    doc string; an If whose branches hold initializers of their own; metadata."""
    model = chain()
    extra = [
        numpy_helper.from_array(randn([8], seed=5), "small"),
        numpy_helper.from_array(randn([64, 64], seed=6).astype(np.float16), "halves"),
        numpy_helper.from_array(np.arange(-3, 600, dtype=np.int64), "ints"),
        helper.make_tensor("listed", TensorProto.FLOAT, [1024], randn([1024], seed=7).tolist()),
        numpy_helper.from_array(randn([1025], seed=8), "odd"),
        numpy_helper.from_array(randn(SHAPE, seed=9), "located"),
        numpy_helper.from_array(randn(SHAPE, seed=10), "documented"),
    ]
    extra[4].dims[:] = [1026]  # a payload that does not fit its dims
    extra[5].data_location = TensorProto.DEFAULT
    extra[6].doc_string = "a weight with a doc string"
    model.graph.initializer.extend(extra)
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["out"], name="inner_pass")],
        "branch",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)],
        [numpy_helper.from_array(randn(SHAPE, seed=11), "inner")],
    )
    model.graph.node.append(
        helper.make_node("If", ["flag"], ["picked"], name="choose", then_branch=branch, else_branch=branch)
    )
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, SHAPE))
    helper.set_model_props(model, {"source": "test_wire_walk"})
    model.doc_string = "re-encoded"
    return model.SerializeToString()


FUZZ_MODEL = fuzz_model()


def raw_data_counts(data: bytes) -> list[int]:
    """How many raw_data fields each main-graph initializer of `data` has, by protobuf's own
    parse (a message type that keeps every raw_data field: the walk leaves a tensor whose raw_data
    is given twice as it is)."""
    return [len(t.raw) for t in _RAW_COUNTER.FromString(data).graph.initializer]


def _raw_counter():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="wire_walk_counts.proto", package="wirewalk", syntax="proto2")
    message = descriptor_pb2.FieldDescriptorProto
    model = file.message_type.add(name="Model")
    model.field.add(name="graph", number=7, type=message.TYPE_MESSAGE, label=message.LABEL_OPTIONAL,
                    type_name=".wirewalk.Graph")  # fmt: skip
    graph = file.message_type.add(name="Graph")
    graph.field.add(name="initializer", number=5, type=message.TYPE_MESSAGE, label=message.LABEL_REPEATED,
                    type_name=".wirewalk.Tensor")  # fmt: skip
    tensor = file.message_type.add(name="Tensor")
    tensor.field.add(name="raw", number=9, type=message.TYPE_BYTES, label=message.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("wirewalk.Model"))


_RAW_COUNTER = _raw_counter()


def plain_as_parsed(tensor: onnx.TensorProto, raws: int) -> bool:
    """What wire.Initializer.plain must say of `tensor`, as protobuf parsed it."""
    return (
        raws == 1
        and not tensor.HasField("segment")
        and not tensor.HasField("data_location")
        and not any(
            len(getattr(tensor, f))
            for f in ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
        )
        and not tensor.external_data
    )


def assert_walk_agrees(data: bytes, parsed: onnx.ModelProto) -> list:
    """The walk of `data` gives each initializer protobuf parses, as protobuf parses it."""
    walked = list(wire.initializers(data))
    inits = parsed.graph.initializer
    raws = raw_data_counts(data)
    assert [init.ordinal for init in walked] == list(range(len(inits)))
    for init in walked:
        tensor = inits[init.ordinal]
        assert init.name == tensor.name.encode(), init.ordinal
        assert init.dtype == tensor.data_type, tensor.name
        assert init.external == (tensor.data_location == TensorProto.EXTERNAL), tensor.name
        if init.raw is None:
            assert not tensor.HasField("raw_data"), tensor.name
        else:
            assert bytes(data[init.raw[1] : init.raw[1] + init.raw[2]]) == tensor.raw_data, tensor.name
        assert init.plain == plain_as_parsed(tensor, raws[init.ordinal]), tensor.name
    return walked


variations = st.builds(
    Variations,
    long_varint=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    shuffle=st.sampled_from([0.0, 0.5, 1.0]),
    decoy=st.sampled_from([0.0, 0.2, 0.6]),
    unknown=st.sampled_from([0.0, 0.3, 0.7]),
    wrong_wire=st.sampled_from([0.0, 0.3, 1.0]),
    split_packed=st.sampled_from([0.0, 0.5, 1.0]),
    invalid=st.sampled_from([0.0] * 6 + [0.002, 0.02]),
)


@linux_only
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), how=variations)
def test_the_walk_and_the_loader_agree_with_protobuf_on_any_encoding(seed, how):
    """For a model re-encoded at random (tests/wire_reencode.py): a valid encoding is walked
    (never Unwalked) and the walk says of each initializer what protobuf's parse says; an
    encoding protobuf refuses or the walk does not follow is parsed whole; and the loader, with
    payloads left in the file and read back, gives the model onnx.load gives, or refuses what
    protobuf refuses."""
    data = reencode(FUZZ_MODEL, onnx.ModelProto.DESCRIPTOR, random.Random(seed), how)
    try:
        parsed = onnx.ModelProto.FromString(data)
    except DecodeError:
        parsed = None
    if parsed is not None and not how.invalid:
        walked = assert_walk_agrees(data, parsed)
        left = sum(wire.may_leave_in_file(init) for init in walked)
        event(f"{left} payloads left in the file")
    else:
        try:
            assert_walk_agrees(data, parsed) if parsed is not None else list(wire.initializers(data))
            event("walked" + ("" if parsed is not None else " (protobuf refuses it)"))
        except wire.Unwalked:
            event("unwalked")
    with tempfile.TemporaryDirectory() as folder:
        loaded = loads_like_protobuf(Path(folder), data)
    assert (loaded is None) == (parsed is None)


def test_the_re_encoder_changes_the_encoding_not_the_model():
    """The fuzz's own check: re-encoded, the model is the same message with other bytes (and,
    with unknown fields, more of them)."""
    rnd = random.Random(7)
    everything = Variations(long_varint=1.0, shuffle=1.0, decoy=1.0, unknown=0.0, split_packed=1.0)
    data = reencode(FUZZ_MODEL, onnx.ModelProto.DESCRIPTOR, rnd, everything)
    assert data != FUZZ_MODEL
    reparsed = onnx.ModelProto.FromString(data)
    reparsed.DiscardUnknownFields()  # an enum given a value outside it, after its own
    assert reparsed == onnx.ModelProto.FromString(FUZZ_MODEL)
    assert b"\xaa\x80" in data or b"\xaa\x00" in data  # an initializer key written long
