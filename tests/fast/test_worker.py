"""The worker forked before the load (worker.py) walks the file once for the loader and the
weight screen.

Here: the encoding the worker hands the loader is byte for byte the one the loader's own walk
makes, with the same payloads left in the file; a conversion with a worker parses that encoding
without walking the file itself and writes what a conversion without any worker writes; a
worker whose walk fails leaves the loader to walk; and no worker process is left behind."""

from __future__ import annotations

import os
import sys

import onnx
import pytest
from test_left_in_file import linked_mlp, mlp, well_formed_mlp  # conversions refuse mlp()'s odd_dims

from autocast_onnx import io as io_module
from autocast_onnx import pipeline
from autocast_onnx.fast import in_file, wire, worker
from autocast_onnx.fast import screen as screen_module
from autocast_onnx.fast.screen import WeightScreen
from autocast_onnx.filesys import identity
from autocast_onnx.pipeline import convert_file

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker is forked on Linux only; elsewhere nothing starts it"
)


@pytest.fixture(autouse=True)
def any_process_size(monkeypatch):
    """The suite's own process is past the worker's size limit, and the models here are small."""
    monkeypatch.setattr(worker, "MAX_PARENT_BYTES", 2**40)
    monkeypatch.setattr(worker, "MIN_BYTES", 0)
    monkeypatch.setattr(screen_module, "MAX_PARENT_BYTES", 2**40)
    yield


def no_child_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def without_worker(monkeypatch, source, target) -> tuple[bytes, str]:
    monkeypatch.setattr(screen_module, "MIN_BYTES", 10**15)
    plan = target.with_suffix(".plan.json")
    convert_file(source, target, plan_out=plan)
    monkeypatch.setattr(screen_module, "MIN_BYTES", 0)
    return target.read_bytes(), plan.read_text()


def test_the_workers_encoding_is_the_loaders_own(tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    data = source.read_bytes()
    graph = wire.main_graph(data)
    chosen = [init for init in wire.initializers(data, graph) if wire.may_leave_in_file(init)]
    # odd_dims too: its payload does not fit its dims, which the loader finds and puts it back
    assert [init.name for init in chosen] == [b"w_converted", b"w_kept", b"odd_dims"]
    screen = WeightScreen.start(source, min_bytes=0)
    encoding, rows, seen = screen.encoding()
    assert encoding == b"".join(bytes(p) for p in wire.leaving_payloads(data, graph, chosen, "mlp.onnx"))
    assert rows == [(init.ordinal, init.raw[1], init.raw[2], init.name) for init in chosen]
    assert seen == identity(source)
    with pytest.raises(Exception, match="read twice"):
        screen.encoding()
    assert screen.results(onnx.load(source)) is not None  # the screen's message follows it
    assert no_child_left()


def test_a_conversion_parses_the_workers_encoding_without_walking_the_file_itself(tmp_path, monkeypatch):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    expected = without_worker(monkeypatch, source, tmp_path / "expected.onnx")

    class NoWalkHere:
        """wire as the loader sees it (in_file's own reference): any walk fails the test; the
        worker, a process of its own with fast/worker.py's reference, walks as ever."""

        def __getattr__(self, name):
            if name in ("main_graph", "initializers", "leaving_payloads"):
                raise AssertionError("the loader walked the file itself")
            return getattr(wire, name)

    monkeypatch.setattr(in_file, "wire", NoWalkHere())
    left = []
    load = pipeline.load_model

    def recorded(*args, **kwargs):
        loaded = load(*args, **kwargs)
        left.append(len(loaded.left_in_file))
        return loaded

    monkeypatch.setattr(pipeline, "load_model", recorded)
    target = tmp_path / "walked-once.onnx"
    convert_file(source, target, plan_out=target.with_suffix(".plan.json"))
    assert left == [2]
    assert (target.read_bytes(), target.with_suffix(".plan.json").read_text()) == expected
    assert no_child_left()


def test_a_worker_whose_walk_fails_leaves_the_loader_to_walk(tmp_path, monkeypatch):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    expected = without_worker(monkeypatch, source, tmp_path / "expected.onnx")

    def unwalked(*args, **kwargs):
        raise wire.Unwalked("planted")

    real = wire.main_graph
    monkeypatch.setattr(wire, "main_graph", unwalked)
    screen = WeightScreen.start(source, min_bytes=0)  # forked with the failing walk
    monkeypatch.setattr(wire, "main_graph", real)
    assert screen.encoding() is None
    assert screen.results(onnx.load(source)) is None
    loaded = io_module.load_model(source, load_external=False, parse=in_file.parser(lambda: None))
    assert len(loaded.left_in_file) == 2  # walked here
    target = tmp_path / "out.onnx"
    convert_file(source, target, plan_out=target.with_suffix(".plan.json"))
    assert (target.read_bytes(), target.with_suffix(".plan.json").read_text()) == expected
    assert no_child_left()


def test_the_loader_reads_the_workers_encoding_even_where_it_leaves_nothing(tmp_path, monkeypatch):
    """A link to a model elsewhere is parsed whole, but the worker's first message is read at
    the load all the same: the worker waits for it to be read before it converts, so leaving
    it unread would hold the conversion up until the screen's results are asked for."""
    _, link = linked_mlp(tmp_path)
    reads = []
    encoding = WeightScreen.encoding

    def recorded(self):
        reads.append(pipeline.time.perf_counter())
        return encoding(self)

    left = []
    load = pipeline.load_model

    def loaded(*args, **kwargs):
        out = load(*args, **kwargs)
        left.append(out.left_in_file)
        reads.append("loaded")
        return out

    monkeypatch.setattr(WeightScreen, "encoding", recorded)
    monkeypatch.setattr(pipeline, "load_model", loaded)
    monkeypatch.setattr(screen_module, "MIN_BYTES", 0)
    convert_file(link, tmp_path / "here" / "out.onnx")
    assert left == [None] and len(reads) == 2 and reads[1] == "loaded"  # read during the load
    assert no_child_left()
