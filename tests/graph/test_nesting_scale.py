"""Scale and structure of the graph index: the path of a nested If/Loop/Scan body names each
ancestor once (it was doubled at every level, so memory, time and the --plan-out file grew as
2^depth), the work of a conversion and the plan's size grow with the depth of nesting as the
model does, bodies nested deeper than protobuf can read back are refused in one line, and a cycle
is reported with edges the graph really has, however long the cycle.

Work is counted, not timed (a loaded machine must not fail these tests): the function calls a
conversion makes, Python's and built-in ones, as cProfile counts them, and the peak of the memory
it allocates, as tracemalloc measures it."""

import json
import re
import tracemalloc
from itertools import pairwise

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_one_error, invoke
from helpers import F32, check, nested_ifs, run
from onnx import helper
from work_helpers import call_count, profiled

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index
from autocast_onnx.graph import index as index_module
from autocast_onnx.graph.index import MAX_NESTING
from autocast_onnx.pipeline import convert_file


def calls(fn, *args, **kwargs) -> int:
    """The function calls (Python and built-in, generator steps included) made while
    fn(*args, **kwargs) runs: a measure of its work that does not move with the machine's speed."""
    return call_count(profiled(fn, *args, **kwargs))


def peak_bytes(fn, *args, **kwargs) -> int:
    """The most memory allocated at once while fn(*args, **kwargs) runs (tracemalloc)."""
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---- models ------------------------------------------------------------------------------------
def chain_with_cycle(n: int) -> onnx.ModelProto:
    """n nodes n0..n{n-1} (Identity and Relu by turns), each reading the previous one's output,
    and n0 reading the last one's: a cycle of n nodes. An Add reads the cycle for the output."""
    nodes = [
        helper.make_node("Relu" if k % 2 else "Identity", [f"t{(k - 1) % n}"], [f"t{k}"], name=f"n{k}")
        for k in range(n)
    ]
    nodes.append(helper.make_node("Add", ["x", f"t{n - 1}"], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "cycle", [helper.make_tensor_value_info("x", F32, [2])], [helper.make_tensor_value_info("y", F32, [2])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# ---- paths of nested scopes --------------------------------------------------------------------
LEVEL1 = "main/<If #2>.then_branch"
LEVEL2 = LEVEL1 + "/<If #2>.then_branch"
LEVEL3 = LEVEL2 + "/<If #2>.then_branch"


def test_scope_paths_name_each_ancestor_once():
    index = build_index(nested_ifs(3))
    assert [scope.path for scope in index.scopes] == [
        "main",
        LEVEL1,
        LEVEL2,
        LEVEL3,
        LEVEL2 + "/<If #2>.else_branch",
        LEVEL1 + "/<If #2>.else_branch",
        "main/<If #2>.else_branch",
    ]
    assert [scope.depth for scope in index.scopes] == [0, 1, 2, 3, 3, 2, 1]
    innermost = next(node for node in index.nodes if node.scope.path == LEVEL3 and node.op == "MatMul")
    assert innermost.label == f"<MatMul #0 in {LEVEL3}>"


def test_plan_entries_name_each_ancestor_once():
    """The plan's graph of each entry, and the node labels in its reasons, are scope paths."""
    plan = autocast_onnx.convert(nested_ifs(3)).plan
    paths = {scope.path for scope in build_index(nested_ifs(3)).scopes}
    assert {entry.graph for entry in plan.nodes} == paths
    add = next(e for e in plan.nodes if e.graph == LEVEL3 and e.op_type == "Add")
    assert add.reasons[-1].message == f"fed by low-precision node <MatMul #0 in {LEVEL3}> (MatMul) and by no fp32 node"
    in_labels = re.findall(r"<\w+ #\d+ in (main(?:/<\w+ #\d+>\.\w+)*)>", plan.to_json())
    assert len(in_labels) >= 3 and set(in_labels) <= paths, in_labels


def test_named_bodies_and_one_level_keep_their_paths():
    """What plans written before held where nothing was doubled: one level of bodies, or named
    control-flow nodes at any depth."""
    assert [s.path for s in build_index(nested_ifs(1)).scopes] == ["main", LEVEL1, "main/<If #2>.else_branch"]
    paths = [s.path for s in build_index(nested_ifs(2, named=True)).scopes]
    assert paths[:3] == ["main", "main/if0.then_branch", "main/if0.then_branch/if1.then_branch"]


# ---- growth with depth -------------------------------------------------------------------------
def _convert_measured(tmp_path, depth: int) -> tuple[int, int, int]:
    """Plan bytes, function calls and peak bytes allocated of convert_file with --plan-out, at
    `depth` (after one conversion that warms the caches a first conversion fills)."""
    path = tmp_path / f"nested{depth}.onnx"
    onnx.save(nested_ifs(depth), path)
    args = (path, tmp_path / f"out{depth}.onnx")
    plan_out = tmp_path / f"plan{depth}.json"
    convert_file(*args, plan_out=plan_out)
    work = calls(convert_file, *args, plan_out=plan_out)
    memory = peak_bytes(convert_file, *args, plan_out=plan_out)
    return plan_out.stat().st_size, work, memory


def test_plan_size_and_work_grow_with_depth_as_the_model_does(tmp_path):
    """Depth 7, 14 and 28 (28 is close to the deepest protobuf reads back). The model grows
    linearly; so must the work: each doubling of the depth adds at most 2.5 times the calls the one
    before added (measured 59k, 84k and 135k calls: +25k, then +51k, 2.07 times; a quadratic term
    would make it 4 times, and doubling per level 2^14 times), and the memory at most 4 times for 4 times
    the depth (measured 0.43, 0.45 and 0.92 MB). The plan holds each node's graph path, of length
    linear in depth, so its size has a small quadratic term: measured 21.7 KB, 45.7 KB and 108 KB
    (ratio 5.0 for 4x the depth). Doubling per level would give 2^21 times the bytes at depth 28."""
    (small, w_small, m_small), (mid, w_mid, m_mid) = (_convert_measured(tmp_path, d) for d in (7, 14))
    assert w_mid < 2 * w_small, (w_small, w_mid)  # before depth 28, which work doubling per level would never end
    large, w_large, m_large = _convert_measured(tmp_path, 28)
    assert mid < 2.5 * small and large < 6 * small, (small, mid, large)
    assert w_small < w_mid < w_large and w_large - w_mid < 2.5 * (w_mid - w_small), (w_small, w_mid, w_large)
    assert m_large < 4 * m_small, (m_small, m_mid, m_large)
    plan = json.loads((tmp_path / "plan28.json").read_text())
    longest = max(len(entry["graph"]) for entry in plan["nodes"])
    assert longest == len("main") + 28 * len("/<If #2>.then_branch")


def test_deepest_nesting_protobuf_reads_back_converts_and_runs(tmp_path):
    m = nested_ifs(MAX_NESTING)
    path = tmp_path / "deep.onnx"
    onnx.save(m, path)
    result = convert_file(path, tmp_path / "deep16.onnx", plan_out=tmp_path / "plan.json")
    converted = onnx.load(tmp_path / "deep16.onnx")
    check(converted)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_allclose(run(converted, feeds)[0], run(m, feeds)[0], rtol=1e-3)
    assert result.plan.counts()["fp16"] > 0


@pytest.mark.parametrize("copy", [True, False])
def test_nesting_deeper_than_protobuf_reads_is_one_clear_error(copy):
    """Depth 40 cannot be saved and read back (protobuf stops at 100 message levels; a file of
    it is refused as unreadable by the loader). Built in memory it is refused in one line, with
    or without the API's copy of the model, never a DecodeError or a RecursionError."""
    with pytest.raises(AutocastError) as info:
        autocast_onnx.convert(nested_ifs(40), copy=copy)
    line = info.value.line()
    assert "\n" not in line and len(line) < 400, line
    assert re.search(r"nest|nested", line) and "protobuf" in line, line


# ---- cycles ------------------------------------------------------------------------------------
def _edges(m: onnx.ModelProto) -> set[tuple[str, str]]:
    """(producer name, consumer name) of every edge between two nodes of the main graph."""
    producer = {out: node.name for node in m.graph.node for out in node.output}
    return {(producer[name], node.name) for node in m.graph.node for name in node.input if name in producer}


def _reported_cycle(m: onnx.ModelProto) -> list[str]:
    with pytest.raises(AutocastError, match="the graph has a cycle") as info:
        build_index(m)
    return info.value.what.split("the graph has a cycle: ", 1)[1].split(" -> ")


@pytest.mark.parametrize("n", [2, 3, 9])
def test_short_cycle_is_shown_whole_with_real_edges(n):
    m = chain_with_cycle(n)
    shown = _reported_cycle(m)
    assert shown == [f"n{k}" for k in range(n)] + ["n0"]
    edges = _edges(m)
    assert all(pair in edges for pair in pairwise(shown))


def _same(a, b) -> bool:
    return a is b


def test_long_cycle_is_elided_between_real_edges(monkeypatch):
    """40,000 nodes: the report shows the cycle's head and tail, says how many nodes it leaves
    out, and every arrow it draws is an edge of the graph (it used to close the cycle with an edge
    from the 8th node back to the first, which does not exist). Indexing the graph, finding the
    cycle and reporting it take calls in proportion to its length: twice the nodes, twice the calls
    (measured 30 per node; a quadratic search, 4 times). Nodes and values compare by identity
    through a Python __eq__ here, so that a scan of a list of them (a `node in path` where a set
    should be) is counted too."""
    monkeypatch.setattr(index_module.Node, "__eq__", _same)
    monkeypatch.setattr(index_module.Value, "__eq__", _same)
    small, large = (calls(_reported_cycle, chain_with_cycle(n)) for n in (2_000, 4_000))
    assert large < 2.1 * small, (small, large)
    m = chain_with_cycle(40_000)
    shown = _reported_cycle(m)
    assert shown == ["n0", "n1", "n2", "n3", "... (39993 more)", "n39997", "n39998", "n39999", "n0"]
    edges = _edges(m)
    drawn = [(a, b) for a, b in pairwise(shown) if not a.startswith("...") and not b.startswith("...")]
    assert len(drawn) == 6 and all(pair in edges for pair in drawn), drawn


def test_long_cycle_cli_error_is_one_line(tmp_path):
    path = tmp_path / "cycle.onnx"
    onnx.save(chain_with_cycle(40_000), path)
    line = assert_one_error(invoke(["convert", path, "-o", tmp_path / "o.onnx"]), "cycle", "n39999 -> n0")
    assert "n7 -> n0" not in line and not (tmp_path / "o.onnx").exists()
