"""The parts of benchmarks/bench_gpu_plan.py that need neither torch nor the peers: the bytes-moved
count (against a hand count on a tiny graph, and against the tensors ONNX Runtime really produces
on shipped models) and the table and ratio printers on made-up results."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
FLOAT, FP16 = TensorProto.FLOAT, TensorProto.FLOAT16


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu_plan", ROOT / "benchmarks" / "bench_gpu_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu_plan"] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_gpu_plan", None)


def test_importing_the_benchmark_needs_no_torch(bench):
    assert "torch" not in sys.modules and "transformers" not in sys.modules


def tiny_model() -> onnx.ModelProto:
    """x float[N,4] -> Cast fp16 -> MatMul w [4,2] -> Add c (a Constant) -> MatMul w2 [2,600] -> Cast float
    -> a node of an unknown domain. w2 has 1200 elements, over INLINE_ELEMENTS: it is shaped as an input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float16), "w")
    w2 = numpy_helper.from_array(rng.standard_normal((2, 600)).astype(np.float16), "w2")
    nodes = [
        helper.make_node("Cast", ["x"], ["y"], to=FP16, name="cast_in"),
        helper.make_node("MatMul", ["y", "w"], ["z"], name="mm"),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(0.5, np.float16)), name="k"),
        helper.make_node("Add", ["z", "c"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "w2"], ["z2"], name="mm2"),
        helper.make_node("Cast", ["z2"], ["out"], to=FLOAT, name="cast_out"),
        helper.make_node("Foo", ["out"], ["extra"], domain="x.custom", name="foo"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", FLOAT, ["N", 600]), helper.make_tensor_value_info("extra", FLOAT, None)],
        [w, w2],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("x.custom", 1)], ir_version=9
    )


def hand_count(n: int) -> tuple[int, int]:
    """Total and Cast bytes of tiny_model at batch n, node by node (inputs + outputs)."""
    cast_in = n * 4 * 4 + n * 4 * 2  # x float [n,4] read, y fp16 [n,4] written
    mm = n * 4 * 2 + 4 * 2 * 2 + n * 2 * 2  # y, w fp16 [4,2], z fp16 [n,2]
    add = n * 2 * 2 + 2 + n * 2 * 2  # z, c (fp16 scalar), a; the Constant node itself is not counted
    mm2 = n * 2 * 2 + 2 * 600 * 2 + n * 600 * 2  # a, w2 fp16 [2,600], z2 fp16 [n,600]
    cast_out = n * 600 * 2 + n * 600 * 4  # z2 read, out float [n,600] written
    foo = n * 600 * 4  # out read; its output has no shape (unknown op): left out
    return cast_in + mm + add + mm2 + cast_out + foo, cast_in + cast_out


def test_bytes_moved_matches_a_hand_count(bench):
    moved = bench.bytes_moved(tiny_model(), batch=8)
    total, casts = hand_count(8)
    assert (moved.total, moved.casts) == (total, casts) == (60_402, 28_992)
    assert moved.slots == 15 and moved.unshaped == 1  # Constant left out; Foo's output has no shape
    assert moved.unshaped_share == pytest.approx(1 / 15)
    assert moved.by_op["Cast"] == casts and moved.by_op["MatMul"] == 112 + 12_032 and "Constant" not in moved.by_op
    assert bench.bytes_moved(tiny_model(), batch=3).total == hand_count(3)[0]


def test_cast_sites_name_types_shapes_and_neighbours(bench):
    sites = {s["name"]: s for s in bench.bytes_moved(tiny_model(), batch=8).cast_sites}
    assert sites["cast_out"] == {
        "name": "cast_out", "input": "z2", "from": "float16", "to": "float", "shape": [8, 600],
        "bytes": 8 * 600 * 6, "producer": "MatMul", "consumers": ["Foo"],
    }  # fmt: skip
    assert sites["cast_in"]["producer"] == "graph input/initializer" and sites["cast_in"]["consumers"] == ["MatMul"]
    top = bench.top_casts(list(sites.values()), 1)
    assert [s["name"] for s in top] == ["cast_out"]
    text = bench.cast_text("tiny", "autocast", list(sites.values()))
    assert "float16->float [8x600]  MatMul -> Foo  cast_out" in text and "0.0 MB" in text


def test_bytes_moved_takes_nodes_out_of_order_and_leaves_the_model_alone(bench):
    """ONNX Runtime's float16 converter writes graphs whose nodes are not in topological order; the
    count sorts a copy first, and neither the nodes nor the initializers of the model change."""
    model = tiny_model()
    nodes = list(model.graph.node)
    random.Random(3).shuffle(nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    before = model.SerializeToString()
    assert bench.bytes_moved(model, batch=8).total == hand_count(8)[0]
    assert model.SerializeToString() == before


def test_declared_types_do_not_override_what_the_nodes_produce(bench):
    """A converter that declares a value fp32 while its node writes fp16 (onnxconverter-common on
    BERT) is counted at fp16: the declarations are dropped before inference."""
    model = tiny_model()
    model.graph.value_info.append(helper.make_tensor_value_info("z2", FLOAT, ["N", 600]))
    assert bench.bytes_moved(model, batch=8).total == hand_count(8)[0]


def all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every node output a graph output (typed from ONNX inference), so ONNX Runtime
    returns every intermediate tensor."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    declared = {o.name for o in out.graph.output}
    for node in out.graph.node:
        for name in node.output:
            if name and name not in declared:
                out.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
                declared.add(name)
    return out


def run_bytes(model: onnx.ModelProto, feeds: dict) -> int:
    """The bytes moved as bytes_moved defines them, with every tensor's size taken from what ONNX
    Runtime computes (graph optimizations off, so every node runs as written)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    full = all_outputs(model)
    sess = onnxruntime.InferenceSession(full.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, feeds)))
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(feeds)
    total = 0
    for node in model.graph.node:
        if node.op_type == "Constant":
            continue
        total += sum(values[x].nbytes for x in [*node.input, *node.output] if x)
    return total


@pytest.mark.parametrize("name", ["resnet_tiny", "digits_cnn"])
def test_bytes_moved_equals_what_onnx_runtime_computes_on_a_shipped_model(bench, name):
    model = onnx.load(str(ROOT / "examples" / "models" / f"{name}.onnx"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    feeds = {model.graph.input[0].name: np.random.default_rng(0).standard_normal([8, *shape]).astype(np.float32)}
    moved = bench.bytes_moved(model, batch=8)
    assert moved.unshaped == 0 and moved.slots > 3 * len(model.graph.node) // 2
    assert moved.total == run_bytes(model, feeds)


def test_bytes_moved_reports_the_share_it_cannot_shape(bench):
    """bert_tiny's position ids come from Slice/Range on computed bounds, which ONNX's data
    propagation does not follow: those slots are left out and their share reported; the rest
    still adds up, and a larger batch moves more."""
    model = onnx.load(str(ROOT / "examples" / "models" / "bert_tiny.onnx"))
    moved = bench.bytes_moved(model, batch=8, dims={"sequence": 16})
    counted = sum(len([x for x in [*n.input, *n.output] if x]) for n in model.graph.node if n.op_type != "Constant")
    assert moved.slots == counted and 0 < moved.unshaped < moved.slots // 2
    assert 0 < moved.unshaped_share < 0.5 and moved.total > 0
    assert bench.bytes_moved(model, batch=16, dims={"sequence": 16}).total > moved.total


def results() -> list[dict]:
    def row(conversion, nodes, casts, mb, cast_mb, error, **extra):
        return {
            "conversion": conversion, "ok": True, "nodes": nodes, "casts": casts, "bytes": int(mb * 1e6),
            "cast_bytes": int(cast_mb * 1e6), "unshaped_share": 0.0, "rel_error": error, **extra,
        }  # fmt: skip

    return [
        {
            "model": "bert",
            "info": "BERT-base, seq 128",
            "rows": [
                row("fp32", 1000, 3, 900.0, 0.0, None, fusions={"Attention": 12, "SkipLayerNormalization": 24}),
                row("autocast", 1100, 100, 600.0, 60.0, 1e-4, cpu_nodes=0,
                    fusions={"Attention": 0, "LayerNormalization": 25}),
                row("ort float16", 1010, 12, 500.0, 5.0, 2e-3, cpu_nodes=0, fusions={"Attention": 12}),
                {"conversion": "onnxconverter-common", "ok": False, "error": "ValueError: broken"},
                row("ort-opt -> autocast", 400, 50, 300.0, 20.0, 3e-3, cpu_nodes=1),
                row("ort-opt --float16", 380, 4, 290.0, 1.0, 2e-3, error_note="ORT cannot load: Type Error"),
            ],
        },
        {"model": "resnet50", "error": "MemoryError (exit 1)"},
        {"model": "convnext", "seconds": 41.2, "peak_rss_mb": 900,
         "rows": [row("autocast", 10, 2, 1.0, 0.1, 1e-3, bn_left=0, bn_exported=0, measure_peak_rss_mb=2048)]},
    ]  # fmt: skip


def test_table_has_a_row_per_conversion_and_shows_failures(bench):
    text = bench.table(results())
    lines = text.splitlines()
    assert lines[0] == "### bert - BERT-base, seq 128"
    assert lines[1] == "| " + " | ".join(bench.COLUMNS) + " |"
    assert "| fp32 | 1,000 | 3 | 900.0 | 0.0% | 0.0 | - | SkipLN 24, Attn 12 | - |" in lines
    assert "| autocast | 1,100 | 100 | 600.0 | 0.0% | 60.0 | 0 | LN 25 | 1.00e-04 |" in lines
    assert any(x.startswith("| onnxconverter-common | failed: ValueError: broken |") for x in lines)
    assert "| ort-opt --float16 | 380 | 4 | 290.0 | 0.0% | 1.0 | - | - | ORT cannot load: Type Error |" in lines
    assert "### resnet50" in lines and "failed: MemoryError (exit 1)" in lines
    assert "| autocast | 10 | 2 | 1.0 | 0.0% | 0.1 | - | BN 0/0 | 1.00e-03 |" in lines
    assert "### convnext (41 s, peak 2.0 GiB)" in lines
    assert all(x.count("|") == len(bench.COLUMNS) + 1 for x in lines if x.startswith("| "))


def test_ratios_hold_each_pair_to_its_goal(bench):
    rows = {(r["model"], r["ours"]): r for r in bench.ratios(results())}
    default = rows[("bert", "autocast")]
    assert default["bytes_ratio"] == pytest.approx(1.2) and default["bytes_ok"] is False
    assert default["error"] == 1e-4 and default["peer_error"] == 2e-3 and default["error_ok"] is True
    fused = rows[("bert", "ort-opt -> autocast")]
    assert fused["bytes_ratio"] == pytest.approx(300 / 290) and fused["goal"] == 1.05 and fused["bytes_ok"] is True
    assert fused["error_ok"] is False
    missing = rows[("bert", "autocast precise")]  # no such row: nothing to compare
    assert missing["bytes_ratio"] is None and missing["bytes_ok"] is None
    assert ("resnet50", "autocast") not in rows and ("convnext", "autocast") in rows
    text = bench.ratio_table(bench.ratios(results()))
    assert "| bert | autocast | ort float16 | 1.200 | <= 1.10 | NO | 1.00e-04 | 2.00e-03 | yes |" in text
    fused_line = "| bert | ort-opt -> autocast | ort-opt --float16 | 1.034 | <= 1.05 | yes | 3.00e-03 | 2.00e-03 | NO |"
    assert fused_line in text


def test_report_adds_the_cast_sites_and_the_bytes_by_op(bench):
    res = results()
    res[0]["rows"][1]["cast_sites"] = [
        {"name": "c1", "from": "float16", "to": "float", "shape": [8, 12, 128, 128], "bytes": 18_874_368,
         "producer": "MatMul", "consumers": ["Softmax"]},
    ]  # fmt: skip
    res[0]["rows"][1]["by_op"] = {"Cast": 60_000_000, "Softmax": 10_000_000, "MatMul": 1}
    res[0]["rows"][2]["by_op"] = {"Cast": 5_000_000, "Softmax": 12_000_000, "MatMul": 1}
    res[2]["rows"][0]["cast_sites"] = []
    text = bench.report(res, "total 1 s")
    assert "top 5 Cast sites by bytes, bert, autocast (1 Casts):" in text
    assert "    18.9 MB  float16->float [8x12x128x128]  MatMul -> Softmax  c1" in text
    assert "  bert: bytes by op, autocast - ort float16: Cast +55.0 MB" in text
    assert "top 5 Cast sites by bytes, bert, ort-opt -> autocast (0 Casts):" in text
    assert "  bert: bytes by op, ort-opt -> autocast - ort-opt --float16: none higher" in text


def test_short_error_keeps_onnx_runtimes_reason(bench):
    message = (
        "AutocastError: x.onnx: ONNX Runtime cannot load the converted model: [ONNXRuntimeError] : 1 : FAIL : "
        "Load model from x.onnx failed:Type Error: Type (tensor(float16)) of output arg (g) does not match"
    )
    reason = "Type Error: Type (tensor(float16)) of output arg (g) does not match"
    assert bench.short_error(message) == "ORT cannot load: " + reason
    assert bench.short_error("ValueError: no") == "failed: ValueError: no"
    assert bench.fusion_text({"fusions": {"Attention": 0}}) == "none"
    assert bench.fusion_text({"fusions_error": "failed: X"}) == "failed: X"
