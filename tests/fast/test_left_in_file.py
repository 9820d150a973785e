"""Payloads left in the input file (io.load_model(parse=in_file.parser()), wire.py).

When the weight screen runs, `convert` loads the model with the main graph's large, plain fp32
payloads left in the mapped file: each such initializer is parsed as external data at its own
bytes in the file, the rewrite replaces those it converts, and those kept fp32 are read back
before the save. Here: which tensors are left and which are parsed as they are; the written model
and plan are byte-identical to a conversion that parses the whole file; the returned model holds
its weights; an input rewritten during the conversion is refused; encodings the walk does not
follow, and a linked file elsewhere, are parsed whole; subgraph locations are still checked."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import parse, randn
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx import io as io_module
from autocast_onnx import pipeline
from autocast_onnx.errors import AutocastError
from autocast_onnx.fast import in_file
from autocast_onnx.fast import screen as screen_module
from autocast_onnx.graph.index import build_index
from autocast_onnx.io import external_location, load_model, tensor_bytes
from autocast_onnx.pipeline import convert_file

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the weight screen, which payloads are left for, runs on Linux only"
)

BIG = [32, 64]  # 8 KiB of fp32: above io.LEFT_IN_FILE_MIN_BYTES


@pytest.fixture(autouse=True)
def any_process_size(monkeypatch):
    """The suite's own process grows past the worker's size limit as it runs."""
    monkeypatch.setattr(screen_module, "MAX_PARENT_BYTES", 2**40)


def mlp() -> onnx.ModelProto:
    """Two large weights (one converted, one kept fp32 by --exclude-node), LayerNorm parameters
    below the threshold, and initializers that are never left: int64, fp16, float_data, a
    payload whose length does not match its dims."""
    model = parse(
        """
        mlp (float[2,32] x) => (float[2,64] y, int64[1024] idx) {
            [fc1] h = MatMul(x, w_converted)
            [ln] n = LayerNormalization(h, gamma, beta)
            [fc2] y0 = MatMul(n, w_kept)
            [add] y = Add(y0, bias)
            [pass_idx] idx = Identity(indices)
        }
        """,
        w_converted=randn(BIG, seed=1),
        gamma=np.ones(64, np.float32),
        beta=np.zeros(64, np.float32),
        w_kept=randn([64, 64], seed=2),
        indices=np.arange(1024, dtype=np.int64),
    )
    model.graph.initializer.append(helper.make_tensor("bias", TensorProto.FLOAT, [64], randn([64], seed=3).tolist()))
    halves = numpy_helper.from_array(randn([64, 64], seed=4).astype(np.float16), "halves")
    odd = numpy_helper.from_array(randn([2048], seed=5), "odd_dims")
    odd.dims[:] = [2047]  # 8 KiB of payload for 2047 elements: not a payload the loader leaves
    model.graph.initializer.extend([halves, odd])
    return model


def well_formed_mlp() -> onnx.ModelProto:
    """mlp() without odd_dims, whose payload does not fit its dims: the loader reads such a
    model (the tests above), a conversion refuses it as malformed (tests/graph/test_malformed_models.py)."""
    model = mlp()
    odd = next(t for t in model.graph.initializer if t.name == "odd_dims")
    model.graph.initializer.remove(odd)
    return model


def test_the_loader_leaves_large_plain_fp32_payloads_in_the_file(tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    whole = onnx.load(source)
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    assert loaded.left_in_file is not None and len(loaded.left_in_file) == 2
    assert not loaded.external_data and loaded.external_files == []
    by_name = {t.name: t for t in loaded.model.graph.initializer}
    assert [t.name for t in loaded.model.graph.initializer] == [t.name for t in whole.graph.initializer]
    for original in whole.graph.initializer:
        tensor = by_name[original.name]
        if original.name in ("w_converted", "w_kept"):
            assert tensor.data_location == TensorProto.EXTERNAL and not tensor.HasField("raw_data")
            assert external_location(tensor, tmp_path, "x")[3] == "mlp.onnx"
            assert tensor_bytes(tensor, tmp_path) == original.raw_data  # its own bytes in the file
            assert list(tensor.dims) == list(original.dims) and tensor.data_type == original.data_type
        else:
            assert tensor == original, original.name
    # the payloads were never copied into the parsed model
    assert loaded.model.ByteSize() < source.stat().st_size - 2 * 8192 + 1024
    assert loaded.left_in_file.inline() == 2
    assert loaded.model == whole  # read back, the model is the file's


def test_without_the_option_nothing_is_left(tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    loaded = load_model(source, load_external=False)
    assert loaded.left_in_file is None
    assert loaded.model == onnx.load(source)


def conversions(monkeypatch, tmp_path, source: Path, **options) -> tuple[tuple, tuple, list]:
    """(model bytes, plan) converted with payloads left in the file (the worker on) and parsed
    whole (the worker off), and how many payloads each load left."""
    left = []
    load = pipeline.load_model

    def recorded(*args, **kwargs):
        loaded = load(*args, **kwargs)
        left.append(len(loaded.left_in_file) if loaded.left_in_file is not None else 0)
        return loaded

    monkeypatch.setattr(pipeline, "load_model", recorded)
    out = []
    for label, threshold in (("left", 0), ("whole", 10**15)):
        monkeypatch.setattr(screen_module, "MIN_BYTES", threshold)
        target, plan = tmp_path / f"{label}.onnx", tmp_path / f"{label}.plan.json"
        result = convert_file(source, target, plan_out=plan, **options)
        out.append((target.read_bytes(), plan.read_text(), result))
    return out[0], out[1], left


def test_a_conversion_from_payloads_left_in_the_file_writes_the_same_model(monkeypatch, tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    before = source.read_bytes()
    (left_bytes, left_plan, result), (whole_bytes, whole_plan, whole), left = conversions(
        monkeypatch, tmp_path, source, exclude_nodes=["fc2"]
    )
    assert left == [2, 0]
    assert left_bytes == whole_bytes
    assert left_plan == whole_plan
    # the sizes of the payloads left in the file are the loader's, and the same
    assert (
        result.initializer_bytes_before
        == whole.initializer_bytes_before
        == sum(
            len(t.raw_data) if t.HasField("raw_data") else 4 * len(t.float_data)
            for t in well_formed_mlp().graph.initializer
        )
    )
    stored = {t.name: t for t in onnx.load_from_string(left_bytes).graph.initializer}
    assert stored["w_converted"].data_type == TensorProto.FLOAT16
    assert stored["w_kept"].data_type == TensorProto.FLOAT  # read back from the input file
    assert stored["w_kept"].raw_data == randn([64, 64], seed=2).tobytes()
    # the returned model holds its weights: nothing in it points at the input file
    assert all(t.data_location != TensorProto.EXTERNAL for t in result.model.graph.initializer)
    assert result.model.SerializeToString() == left_bytes
    assert source.read_bytes() == before


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_weight_kept_or_converted_matches(monkeypatch, tmp_path, precision):
    """Both weights converted (no exclusion), and bf16 (no worker, so nothing is left)."""
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    (left_bytes, left_plan, _), (whole_bytes, whole_plan, _), left = conversions(
        monkeypatch, tmp_path, source, precision=precision
    )
    assert left == ([2, 0] if precision == "fp16" else [0, 0])
    assert left_bytes == whole_bytes and left_plan == whole_plan


def test_an_input_rewritten_during_the_conversion_is_refused(monkeypatch, tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    monkeypatch.setattr(screen_module, "MIN_BYTES", 0)
    convert = pipeline._convert_loaded

    def rewritten_meanwhile(loaded, **kwargs):
        result = convert(loaded, **kwargs)
        st = source.stat()
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # another writer touched it
        return result

    monkeypatch.setattr(pipeline, "_convert_loaded", rewritten_meanwhile)
    target = tmp_path / "out.onnx"
    with pytest.raises(AutocastError, match="the input model changed while it was being converted") as caught:
        convert_file(source, target, exclude_nodes=["fc2"])
    assert caught.value.where == str(source)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.onnx"]  # no temporary left behind


def test_an_encoding_the_walk_does_not_follow_is_parsed_whole(tmp_path):
    """Two graph fields, which a parser merges: the file is parsed as it is."""
    model = mlp()
    extra = onnx.GraphProto()
    extra.initializer.append(numpy_helper.from_array(randn(BIG, seed=6), "merged_in"))
    source = tmp_path / "two_graphs.onnx"
    source.write_bytes(model.SerializeToString() + onnx.ModelProto(graph=extra).SerializeToString())
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    assert loaded.left_in_file is None
    assert "merged_in" in {t.name for t in loaded.model.graph.initializer}
    assert all(t.data_location != TensorProto.EXTERNAL for t in loaded.model.graph.initializer)


def linked_mlp(tmp_path: Path) -> tuple[Path, Path]:
    """(the model, a link to it from another folder): store/mlp.onnx and here/mlp.onnx."""
    (tmp_path / "store").mkdir()
    (tmp_path / "here").mkdir()
    real = tmp_path / "store" / "mlp.onnx"
    onnx.save(well_formed_mlp(), real)
    link = tmp_path / "here" / "mlp.onnx"
    link.symlink_to(real)
    return real, link


def test_a_link_to_a_model_elsewhere_is_parsed_whole(monkeypatch, tmp_path):
    """Its payloads would lie outside the folder the model is read from: nothing is left, and
    the conversion goes on as without the option."""
    real, link = linked_mlp(tmp_path)
    assert load_model(link, load_external=False, parse=in_file.parser()).left_in_file is None
    monkeypatch.setattr(screen_module, "MIN_BYTES", 0)
    convert_file(link, tmp_path / "here" / "out.onnx")
    monkeypatch.setattr(screen_module, "MIN_BYTES", 10**15)
    convert_file(real, tmp_path / "store" / "out.onnx")
    assert (tmp_path / "here" / "out.onnx").read_bytes() == (tmp_path / "store" / "out.onnx").read_bytes()


def four_floats_stored_at(name: str, location: str, offset: int) -> TensorProto:
    """A float[4] initializer whose 16 bytes are external data at `location`, `offset`."""
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    tensor.ClearField("float_data")
    for key, value in (("location", location), ("offset", str(offset)), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def test_a_subgraph_location_outside_the_folder_is_still_refused(monkeypatch, tmp_path):
    """The index leaves the main graph's locations to the loader, which checked them, but still
    checks those of subgraph bodies."""
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    folder = tmp_path / "model"
    folder.mkdir()
    hostile = four_floats_stored_at("c", "../secret.bin", 0)
    branch = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["out"], name="inner")],
        "branch",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])],
        [hostile],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="choose", then_branch=branch, else_branch=branch)],
        "g",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    source = folder / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    loaded = load_model(source, load_external=False)
    assert loaded.external_checked and not loaded.external_data  # the main graph has none
    with pytest.raises(
        AutocastError, match=re.escape("initializer 'c': external data location '../secret.bin' is outside")
    ):
        build_index(loaded.model, str(source), folder, main_checked=True)
    with pytest.raises(AutocastError, match="outside the model's folder"):
        convert_file(source, folder / "out.onnx")
    assert not (folder / "out.onnx").exists()


def test_a_location_is_resolved_once_but_a_file_gone_is_still_seen(tmp_path):
    """external_location remembers where a location leads, not that its file is there."""
    data = tmp_path / "w.data"
    data.write_bytes(b"\0" * 64)
    tensor = four_floats_stored_at("w", "w.data", 16)
    assert external_location(tensor, tmp_path, "m.onnx")[1:] == (16, 16, "w.data")
    assert (str(tmp_path), "w.data") in io_module._LOCATED
    data.write_bytes(b"\0" * 20)
    with pytest.raises(AutocastError, match=re.escape("exceeds 'w.data' (20 bytes)")):
        external_location(tensor, tmp_path, "m.onnx")
    data.unlink()
    with pytest.raises(AutocastError, match=re.escape("external data file 'w.data' is missing")):
        external_location(tensor, tmp_path, "m.onnx")


def test_a_file_whose_only_candidate_does_not_fit_its_dims_is_read_as_it_is(tmp_path):
    """The payload is put back in its tensor after the parse: nothing is left, and the model is
    the file's."""
    model = parse(
        """
        one (float[2,2047] x) => (float[2,2047] y) {
            [add] y = Add(x, odd_dims)
        }
        """,
        odd_dims=randn([2047], seed=5),
    )
    model.graph.initializer[0].raw_data = randn([2048], seed=5).tobytes()  # one element too many
    source = tmp_path / "odd.onnx"
    source.write_bytes(model.SerializeToString())
    loaded = load_model(source, load_external=False, parse=in_file.parser())
    assert loaded.left_in_file is None
    assert loaded.model == onnx.load(source)
    assert len(loaded.model.graph.node) == 1 and len(loaded.model.graph.initializer) == 1
