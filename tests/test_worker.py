"""The worker forked before the load (worker.py) walks the file once for the loader and the
weight screen, and the command line forks it before its own imports.

Here: the encoding the worker hands the loader is byte for byte the one the loader's own walk
makes, with the same payloads left in the file; a conversion that takes an early worker over
parses that encoding without walking the file itself and writes what a conversion without any
worker writes; an early worker for another file, or for a file replaced since, is stopped and
not used; a worker whose walk fails leaves the loader to walk; and the command line stops an
early worker nothing took over, leaving no process behind."""

from __future__ import annotations

import os
import sys

import onnx
import pytest
from test_left_in_file import linked_mlp, mlp, well_formed_mlp  # conversions refuse mlp()'s odd_dims

from autocast_onnx import io as io_module
from autocast_onnx import pipeline, wire, worker
from autocast_onnx.cli.main import main as cli_main
from autocast_onnx.pipeline import convert_file
from autocast_onnx.plan import screen as screen_module
from autocast_onnx.plan.screen import WeightScreen

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
    worker.discard_early()


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
    assert seen == worker.identity(source)
    with pytest.raises(Exception, match="read twice"):
        screen.encoding()
    assert screen.results(onnx.load(source)) is not None  # the screen's message follows it
    assert no_child_left()


def test_an_early_worker_is_taken_over_and_the_file_is_walked_once(tmp_path, monkeypatch):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    expected = without_worker(monkeypatch, source, tmp_path / "expected.onnx")
    worker.start_early(source)
    assert worker._early is not None

    def walked_here(*args, **kwargs):
        raise AssertionError("the loader walked the file itself")

    monkeypatch.setattr(wire, "initializers", walked_here)  # in this process only: the worker has forked
    left = []
    load = pipeline.load_model

    def recorded(*args, **kwargs):
        loaded = load(*args, **kwargs)
        left.append(len(loaded.left_in_file))
        return loaded

    monkeypatch.setattr(pipeline, "load_model", recorded)
    target = tmp_path / "early.onnx"
    convert_file(source, target, plan_out=target.with_suffix(".plan.json"))
    assert worker._early is None and left == [2]
    assert (target.read_bytes(), target.with_suffix(".plan.json").read_text()) == expected
    assert no_child_left()


@pytest.mark.parametrize("case", ["another-file", "replaced-since"])
def test_an_early_worker_for_another_or_a_changed_file_is_stopped(tmp_path, monkeypatch, case):
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    expected = without_worker(monkeypatch, source, tmp_path / "expected.onnx")
    other = tmp_path / "other.onnx"
    onnx.save(well_formed_mlp(), other)
    worker.start_early(other if case == "another-file" else source)
    early = worker._early
    assert early is not None
    if case == "replaced-since":
        fresh = tmp_path / "fresh.onnx"
        onnx.save(well_formed_mlp(), fresh)
        os.replace(fresh, source)  # the same model in another file: not the one the worker walked
    taken = []
    start = screen_module.WeightScreen.__init__

    def recorded(self, handle):
        taken.append(handle.pid)
        start(self, handle)

    monkeypatch.setattr(screen_module.WeightScreen, "__init__", recorded)
    target = tmp_path / "out.onnx"
    convert_file(source, target, plan_out=target.with_suffix(".plan.json"))
    assert len(taken) == 1 and taken[0] != early.pid  # a worker of its own
    assert (target.read_bytes(), target.with_suffix(".plan.json").read_text()) == expected
    assert worker._early is None and no_child_left()


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
    loaded = io_module.load_model(source, load_external=False, leave_in_file=True, prepared=lambda: None)
    assert len(loaded.left_in_file) == 2  # walked here
    monkeypatch.setattr(wire, "main_graph", unwalked)
    worker.start_early(source)
    monkeypatch.setattr(wire, "main_graph", real)
    target = tmp_path / "out.onnx"
    convert_file(source, target, plan_out=target.with_suffix(".plan.json"))
    assert (target.read_bytes(), target.with_suffix(".plan.json").read_text()) == expected
    assert no_child_left()


def test_the_command_line_stops_an_early_worker_nothing_took_over(tmp_path, monkeypatch):
    """The command line forks the worker before it reads its configuration: a configuration that
    chooses bf16 (nothing to screen) and an input refused after the fork leave no worker behind;
    an fp16 conversion takes it over."""
    source = tmp_path / "mlp.onnx"
    onnx.save(well_formed_mlp(), source)
    forked, stopped = [], []
    fork, stop = worker.fork, worker.stop
    monkeypatch.setattr(worker, "fork", lambda *a, **k: forked.append(fork(*a, **k)) or forked[-1])
    monkeypatch.setattr(worker, "stop", lambda w: stopped.append(w.pid) or stop(w))
    config = tmp_path / "autocast-onnx.toml"
    config.write_text('precision = "bf16"\n')
    with pytest.raises(SystemExit) as done:
        cli_main(["convert", str(source), "-o", str(tmp_path / "bf16.onnx"), "--config", str(config), "-q"])
    assert done.value.code == 0
    assert {t.data_type for t in onnx.load(tmp_path / "bf16.onnx").graph.initializer} >= {onnx.TensorProto.BFLOAT16}
    assert len(forked) == 1 and stopped == [forked[0].pid]  # forked early, stopped unused
    with pytest.raises(SystemExit) as done:
        cli_main(["convert", str(source), "-o", str(source), "-q"])
    assert done.value.code == 2  # the output would overwrite the input
    assert worker._early is None and no_child_left()
    forked.clear()
    with pytest.raises(SystemExit) as done:
        cli_main(["convert", str(source), "-o", str(tmp_path / "out.onnx"), "-q"])
    assert done.value.code == 0 and len(forked) == 1  # the early worker, taken over: no second fork
    assert no_child_left() and onnx.load(tmp_path / "out.onnx").graph.node


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
