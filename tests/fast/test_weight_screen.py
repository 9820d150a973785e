"""The weight screen on the second core (plan/screen.py) gives what the in-process screen gives.

A forked worker parses the model file and converts its main graph's fp32 initializers to fp16 in
shared memory; the data rules take its bytes and its range flags. Here every conversion is run
twice from the same file, with the worker (its size threshold lowered to zero) and without, and
the written models and plans must be byte-identical: on weights at every edge the screen must
tell apart, on initializers it must leave to the in-process path (subgraph bodies, float_data,
an input's default, empty and odd-sized payloads), on the shipped models and on a training graph
whose loss scaling edits the model after the worker has read it. A worker that fails, or a file
replaced while it ran, falls back to the in-process screen."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import parse, randn
from onnx import TensorProto, helper, numpy_helper
from test_fast_paths import model_of, weights_at_the_edges

from autocast_onnx.errors import InternalCheckError
from autocast_onnx.fast import screen as screen_module
from autocast_onnx.fast import screen_work
from autocast_onnx.fast.screen import WeightScreen
from autocast_onnx.pipeline import convert_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker is forked on Linux only; elsewhere nothing starts it"
)


@pytest.fixture(autouse=True)
def any_process_size(monkeypatch):
    """The suite's own process grows past the worker's size limit as it runs; here the worker is
    what is tested (test_no_worker_from_a_large_process tests the limit)."""
    monkeypatch.setattr(screen_module, "MAX_PARENT_BYTES", 2**40)


def both_ways(monkeypatch, tmp_path: Path, source: Path, **options) -> tuple[bytes, bytes, str, str]:
    """Convert `source` with the worker and without: (model bytes, model bytes, plan, plan).
    options: convert= (convert_file's options), expect_used= (whether each read of the worker's
    results found them: [True] by default)."""
    out = []
    used = []
    results = WeightScreen.results

    def recorded(self, model, *args, **kwargs):
        found = results(self, model, *args, **kwargs)
        used.append(found is not None)
        return found

    monkeypatch.setattr(WeightScreen, "results", recorded)
    for label, threshold in (("worker", 0), ("inproc", 10**15)):
        monkeypatch.setattr(screen_module, "MIN_BYTES", threshold)
        target = tmp_path / f"{label}.onnx"
        plan = tmp_path / f"{label}.plan.json"
        convert_file(source, target, plan_out=plan, **options.get("convert", {}))
        out.append((target.read_bytes(), plan.read_text()))
        if label == "worker":
            assert used == options.get("expect_used", [True]), "the worker's results were not what was expected"
    assert used == options.get("expect_used", [True])  # no worker without it
    (worker, worker_plan), (inproc, inproc_plan) = out
    return worker, inproc, worker_plan, inproc_plan


def test_weights_at_the_edges_convert_as_in_process(monkeypatch, tmp_path):
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    worker, inproc, worker_plan, inproc_plan = both_ways(monkeypatch, tmp_path, source)
    assert worker == inproc
    assert worker_plan == inproc_plan
    stored = {t.name: t.data_type for t in onnx.load_from_string(worker).graph.initializer}
    assert stored["mostly_fine"] == TensorProto.FLOAT16  # its MatMul runs fp16; the Adds follow fp32 x


def test_weights_forced_low_convert_as_in_process(monkeypatch, tmp_path):
    """Every Add forced low: the screen's bytes are stored for the safe weights, and the unsafe
    ones are clamped (forced) or kept by the data rules exactly as in process."""
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    worker, inproc, worker_plan, inproc_plan = both_ways(
        monkeypatch, tmp_path, source, convert={"include_nodes": ["add_.*"]}
    )
    assert worker == inproc
    assert worker_plan == inproc_plan
    stored = {t.name: t.data_type for t in onnx.load_from_string(worker).graph.initializer}
    for name in ("plain", "below_the_edge", "zeros", "overflow", "all_flush"):
        assert stored[name] == TensorProto.FLOAT16, name
    assert "clamped" in worker_plan or "forced" in worker_plan


def test_the_workers_bytes_and_flags(tmp_path):
    weights = weights_at_the_edges()
    model = model_of(weights)
    model.graph.initializer.append(numpy_helper.from_array(np.arange(6, dtype=np.int64), "ints"))
    source = tmp_path / "edges.onnx"
    onnx.save(model, source)
    screen = WeightScreen.start(source, min_bytes=0)
    assert screen is not None
    results = screen.results(onnx.load(source))
    assert set(results) == set(weights)  # fp32 tensors only
    lost = {name for name, (_, flag) in results.items() if flag}
    assert lost == {
        "overflow",
        "first_overflow",
        "largest_finite",
        "all_flush",
        "some_flush",
        "not_finite",
        "nan",
        "boundary",
        "mostly_fine",
    }
    for name, arr in weights.items():
        with np.errstate(over="ignore"):
            assert bytes(results[name][0]) == arr.astype("<f2").tobytes(), name
    with pytest.raises(InternalCheckError):
        screen.results(model)  # read once: the caller holds the shared buffer
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # the worker was reaped


def mixed_initializers_model() -> onnx.ModelProto:
    """Initializers the worker must leave alone or share: a body's own weight, one stored as
    float_data, an input's default, an empty one, one read by an fp32 and an fp16 node."""
    model = parse(
        """
        mixed (bool c, float[2,4] x, float[4,4] dflt) => (float[2,4] y, float[2,4] z, float[0] e) {
            [mm_common] h = MatMul(x, common_w)
            [sm] s = Softmax(h)
            [ln] l = LayerNormalization(x, scale, common_bias)
            [add_bias] a = Add(s, common_bias)
            [mm_default] d = MatMul(a, dflt)
            [mm_fd] f = MatMul(d, listed)
            [branch] y = If(c) <
                then_branch = g1 () => (float[2,4] t) { [then_mm] t = MatMul(f, body_w) },
                else_branch = g2 () => (float[2,4] u) { [else_sm] u = Softmax(f) }
            >
            [add_l] z = Add(l, s)
            [empty_id] e = Identity(empty)
        }""",
        common_w=randn([4, 4], seed=1),
        scale=np.ones(4, np.float32),
        common_bias=randn([4], seed=2),
        dflt=randn([4, 4], seed=3),
        empty=np.zeros(0, np.float32),
    )
    listed = helper.make_tensor("listed", TensorProto.FLOAT, [4, 4], randn([16], seed=4).tolist())  # float_data
    model.graph.initializer.append(listed)
    then = model.graph.node[6].attribute[0].g
    then.initializer.append(numpy_helper.from_array(randn([4, 4], seed=5), "body_w"))
    return model


def test_initializers_left_to_the_in_process_path_convert_as_before(monkeypatch, tmp_path):
    source = tmp_path / "mixed.onnx"
    onnx.save(mixed_initializers_model(), source)
    onnx.checker.check_model(str(source), full_check=True)
    worker, inproc, worker_plan, inproc_plan = both_ways(monkeypatch, tmp_path, source)
    assert worker == inproc
    assert worker_plan == inproc_plan
    converted = onnx.load_from_string(worker)
    types = {t.name: t.data_type for t in converted.graph.initializer}
    assert types["common_w"] == TensorProto.FLOAT16 and types["listed"] == TensorProto.FLOAT16
    body = next(a.g for n in converted.graph.node if n.op_type == "If" for a in n.attribute if a.name == "then_branch")
    assert {t.name: t.data_type for t in body.initializer}["body_w"] == TensorProto.FLOAT16


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    ["examples/models/bert_tiny.onnx", "examples/models/vit_tiny.onnx", "tests/data/decoders/llama_kv.onnx"],
)
def test_shipped_models_convert_as_in_process(monkeypatch, tmp_path, path):
    worker, inproc, worker_plan, inproc_plan = both_ways(monkeypatch, tmp_path, ROOT / path)
    assert worker == inproc
    assert worker_plan == inproc_plan


def test_a_training_graph_edited_after_the_worker_read_it(monkeypatch, tmp_path):
    """Loss scaling turns the backward seed into an input before the plan: the worker's results
    describe the model as it was, so they are dropped and the weights screened in process."""
    folder = tmp_path / "mlp"
    shutil.copytree(ROOT / "tests/data/training/mlp", folder)
    closed = []
    original = WeightScreen.close

    def close(self):
        closed.append(self._done)
        original(self)

    monkeypatch.setattr(WeightScreen, "close", close)
    worker, inproc, worker_plan, inproc_plan = both_ways(
        monkeypatch, tmp_path, folder / "training_model.onnx", expect_used=[]
    )
    assert worker == inproc
    assert worker_plan == inproc_plan
    assert False in closed  # stopped before its results were read


def test_a_failing_worker_falls_back_to_the_in_process_screen(monkeypatch, tmp_path):
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    monkeypatch.setattr(screen_module, "MIN_BYTES", 10**15)
    convert_file(source, tmp_path / "expected.onnx")

    def broken(*args):
        raise RuntimeError("the worker fails")

    monkeypatch.setattr(screen_work, "_work", broken)
    assert WeightScreen.start(source, min_bytes=0).results(onnx.load(source)) is None
    monkeypatch.setattr(screen_module, "MIN_BYTES", 0)
    convert_file(source, tmp_path / "fallback.onnx")
    assert (tmp_path / "fallback.onnx").read_bytes() == (tmp_path / "expected.onnx").read_bytes()


def test_a_file_replaced_while_the_worker_ran_is_not_trusted(tmp_path):
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    screen = WeightScreen.start(source, min_bytes=0)
    model = onnx.load(source)
    replacement = tmp_path / "other.onnx"
    onnx.save(model_of({"plain": randn([4, 8], seed=9)}), replacement)
    os.replace(replacement, source)
    assert screen.results(model) is None


def test_a_worker_stopped_unread_is_reaped(tmp_path):
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    screen = WeightScreen.start(source, min_bytes=0)
    screen.close()
    screen.close()  # twice is harmless
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_no_worker_where_it_cannot_or_would_not_pay(tmp_path):
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    assert WeightScreen.start(source) is None  # a small file: the fork costs more than it saves
    assert WeightScreen.start(tmp_path / "missing.onnx", min_bytes=0) is None
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert WeightScreen.start(source, min_bytes=0) is None  # a fork copies only this thread
    finally:
        stop.set()
        other.join()


def test_the_walk_finds_the_payloads_protobuf_parses(tmp_path):
    """The worker's walk of the encoding gives each fp32 raw payload of the main graph, by
    ordinal and name, at the bytes protobuf parses; other tensors are passed over."""
    model = mixed_initializers_model()
    model.graph.initializer.append(numpy_helper.from_array(np.arange(6, dtype=np.int64), "ints"))
    model.graph.initializer.append(numpy_helper.from_array(randn([3, 5], seed=8).astype(np.float16), "halves"))
    data = model.SerializeToString()
    found = list(screen_work._fp32_payloads(data))
    inits = list(model.graph.initializer)
    expected = [(k, t.name) for k, t in enumerate(inits) if t.data_type == TensorProto.FLOAT and t.HasField("raw_data")]
    assert [(k, name.decode()) for k, name, _, _ in found] == [(k, n) for k, n in expected if inits[k].raw_data]
    assert {name for _, name, _, _ in found} >= {b"common_w", b"scale", b"common_bias", b"dflt"}
    for ordinal, _, start, length in found:
        assert data[start : start + length] == inits[ordinal].raw_data


def test_an_encoding_the_walk_does_not_follow_falls_back(monkeypatch, tmp_path):
    """Two graph fields (a parser merges them): the worker gives up and the weights are screened
    in process, with the same result."""
    model = model_of(weights_at_the_edges())
    extra = onnx.GraphProto()
    extra.initializer.append(numpy_helper.from_array(randn([4, 4], seed=6), "merged_in"))
    source = tmp_path / "two_graphs.onnx"
    payload = extra.SerializeToString()
    source.write_bytes(model.SerializeToString() + b"\x3a" + len(payload).to_bytes(1, "little") + payload)
    assert any(t.name == "merged_in" for t in onnx.load(source).graph.initializer)
    assert WeightScreen.start(source, min_bytes=0).results(onnx.load(source)) is None
    worker, inproc, worker_plan, inproc_plan = both_ways(monkeypatch, tmp_path, source, expect_used=[False])
    assert worker == inproc
    assert worker_plan == inproc_plan


def test_no_worker_from_a_large_process(monkeypatch, tmp_path):
    """Each page a fork shares is copied on the parent's next write to it: a process that already
    holds much (a service converting model after model) screens in process."""
    source = tmp_path / "edges.onnx"
    onnx.save(model_of(weights_at_the_edges()), source)
    monkeypatch.setattr(screen_module, "MAX_PARENT_BYTES", 1)
    assert WeightScreen.start(source, min_bytes=0) is None
    monkeypatch.setattr(screen_module, "MAX_PARENT_BYTES", 2**40)
    started = WeightScreen.start(source, min_bytes=0)
    assert started is not None
    started.close()
