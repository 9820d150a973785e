"""Range, not category, decides the fp32 islands (issue 37, item 3): an op whose outputs can grow
(Exp, Pow, sums, Log, Sin/Cos) runs low in the fast plan where the graph bounds its outputs within
fp16 (plan/ranges.py), and every fp32 island left names what keeps it fp32 (plan/islands.py):
a range the graph bounds or calibration measured, a constant, a model output, a rule, the
search, or arithmetic no low-precision kernel gives. Minimal graphs for each, and the shipped
models."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import F32, check, convert, init, model, randn, run, tensor
from onnx import helper

import autocast_onnx
from autocast_onnx.graph import build_index
from autocast_onnx.plan.ranges import Bounds, judge, power
from autocast_onnx.report.summary import conversion_summary, summary_dict
from autocast_onnx.validate.emulate import emulation_model

ROOT = Path(__file__).resolve().parents[2]
H = 16


def between_matmuls(middle, width=H, rows=4, extra_inits=()):
    """x -> MatMul -> `middle` (nodes reading 'h', writing 'm') -> MatMul -> y."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), *middle]
    nodes.append(helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2"))
    inits = [init("w1", randn([width, width], 1, 0.3)), init("w2", randn([width, width], 2, 0.3)), *extra_inits]
    m = model(nodes, [tensor("x", F32, [rows, width])], [tensor("y", F32, [rows, width])], inits)
    check(m)
    return m


def decomposed_softmax(width=H):
    return between_matmuls(
        [
            helper.make_node("ReduceMax", ["h"], ["mx"], name="max", axes=[-1], keepdims=1),
            helper.make_node("Sub", ["h", "mx"], ["sh"], name="sub"),
            helper.make_node("Exp", ["sh"], ["e"], name="exp"),
            helper.make_node("ReduceSum", ["e", "ax"], ["s"], name="sum", keepdims=1),
            helper.make_node("Div", ["e", "s"], ["m"], name="div"),
        ],
        width,
        extra_inits=[init("ax", np.array([-1], dtype=np.int64))],
    )


def plan_of(result, name):
    [entry] = result.plan.by_name(name)
    return entry


def island_of(result, name):
    entry = plan_of(result, name)
    [island] = [i for i in result.plan.islands if entry.id in i.nodes]
    return island


def test_a_decomposed_softmax_runs_low_because_its_exp_and_sum_are_bounded():
    m = decomposed_softmax()
    fast = convert(m)
    for name in ("exp", "sum"):
        entry = plan_of(fast, name)
        assert entry.precision == "fp16", name
        assert entry.reasons[-1].code == "fast-plan"
    assert "exp is at most 1" in plan_of(fast, "exp").reasons[-1].message
    assert "at most 16" in plan_of(fast, "sum").reasons[-1].message  # 16 values of at most 1
    assert fast.plan.islands == [] and fast.stats.casts_added == 2
    precise = convert(m, precise=True)
    assert plan_of(precise, "exp").precision == "fp32"
    assert {"precise"} <= set(island_of(precise, "exp").kinds)
    feeds = {"x": randn([4, H], 3, 2.0)}
    ref = run(m, feeds)[0]
    out = run(emulation_model(fast.model), feeds)[0]
    assert np.abs(out - ref).max() <= 1e-2 * np.abs(ref).max()


AX = init("ax", np.array([-1], dtype=np.int64))


def summed(first, name="f", extra=()):
    """h -> `first` nodes (writing 'a') -> ReduceSum over the last axis -> Sub(h, .) -> m: the op
    under test has an fp32 reader in the conservative plan, so pass 6 alone cannot lower it."""
    return between_matmuls(
        [
            *first,
            helper.make_node("ReduceSum", ["a", "ax"], ["s"], name="sum", keepdims=1),
            helper.make_node("Sub", ["h", "s"], ["m"], name="sub"),
        ],
        extra_inits=[AX, *extra],
    )


def test_an_exp_of_an_unbounded_tensor_stays_fp32_and_its_island_says_why():
    m = summed([helper.make_node("Exp", ["h"], ["a"], name="exp")])
    result = convert(m)
    assert plan_of(result, "exp").precision == "fp32" and plan_of(result, "sum").precision == "fp32"
    causes = {c.node: c for c in island_of(result, "exp").causes}
    assert causes["exp"].kind == "range-bound"
    assert "exp can reach inf" in causes["exp"].text and "65504" in causes["exp"].text
    assert causes["sum"].kind == "range-bound" and "16 values" in causes["sum"].text


@pytest.mark.parametrize(("width", "fits"), [(300, True), (70000, False)])
def test_a_sum_is_judged_by_the_length_of_its_axis(width, fits):
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["g"], name="sig"),
        helper.make_node("ReduceSum", ["g", "ax"], ["s"], name="sum", keepdims=1),
        helper.make_node("Mul", ["s", "k"], ["y"], name="scale"),
    ]
    inits = [AX, init("k", np.array([0.5], dtype=np.float32))]
    m = model(nodes, [tensor("x", F32, [2, width])], [tensor("y", F32, [2, 1])], inits)
    index = build_index(m)
    [node] = [n for n in index.nodes if n.op == "ReduceSum"]
    verdict = judge(node, Bounds(index, {"g": (1, (2, width))}), 10)
    assert verdict.fits is fits and verdict.kind == "sum"
    assert verdict.bound == pytest.approx(width)
    assert f"{width:,} values" in verdict.text


def test_a_sum_of_unknown_length_is_not_bounded():
    nodes = [helper.make_node("ReduceSum", ["x", "ax"], ["y"], name="sum", keepdims=1)]
    m = model(nodes, [tensor("x", F32, [2, "n"])], [tensor("y", F32, [2, 1])], [AX])
    index = build_index(m)
    verdict = judge(index.nodes[0], Bounds(index, {"x": (1, (2, None))}), 10)
    assert not verdict.fits and "not known" in verdict.text


def test_a_square_of_an_unbounded_tensor_stays_fp32_and_of_a_tanh_runs_low():
    two = init("two", np.array(2.0, dtype=np.float32))
    raw = convert(summed([helper.make_node("Pow", ["h", "two"], ["a"], name="sq")], extra=[two]))
    assert plan_of(raw, "sq").precision == "fp32"
    causes = {c.node: c for c in island_of(raw, "sq").causes}
    assert causes["sq"].kind == "range-bound"
    assert causes["sq"].text.startswith("square: x**2 of |x| up to 6.55e+04 can reach 4.29")
    low = convert(
        summed(
            [
                helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
                helper.make_node("Pow", ["t", "two"], ["a"], name="sq"),
            ],
            extra=[two],
        )
    )
    for name, said in (("sq", "is at most 1"), ("sum", "at most 16")):
        entry = plan_of(low, name)
        assert entry.precision == "fp16" and entry.reasons[-1].code == "fast-plan", name
        assert said in entry.reasons[-1].message, name
    assert low.plan.islands == []


def test_a_log_of_a_softmax_stays_fp32_because_small_probabilities_flush():
    m = between_matmuls(
        [
            helper.make_node("Softmax", ["h"], ["p"], name="softmax", axis=-1),
            helper.make_node("Log", ["p"], ["m"], name="log"),
        ]
    )
    result = convert(m)
    assert plan_of(result, "log").precision == "fp32" and plan_of(result, "softmax").precision == "fp32"
    island = island_of(result, "log")
    assert plan_of(result, "softmax").id in island.nodes
    [cause] = island.causes
    assert cause.kind == "range-bound" and "smallest normal" in cause.text and "-inf" in cause.text


def test_a_log_of_values_bounded_away_from_zero_runs_low():
    m = summed(
        [
            helper.make_node("Sigmoid", ["h"], ["g"], name="sig"),
            helper.make_node("Add", ["g", "one"], ["g1"], name="plus1"),
            helper.make_node("Log", ["g1"], ["a"], name="log"),
        ],
        extra=[init("one", np.array([1.0], dtype=np.float32))],
    )
    result = convert(m)
    assert plan_of(result, "log").precision == "fp16" and plan_of(result, "sum").precision == "fp16"
    assert "input is at least 1" in plan_of(result, "log").reasons[-1].message


def test_a_rotary_angle_stays_fp32_and_a_small_angle_runs_low():
    big = convert(summed([helper.make_node("Sin", ["h"], ["a"], name="sin")]))
    assert plan_of(big, "sin").precision == "fp32"
    [cause] = island_of(big, "sin").causes
    assert cause.kind == "range-bound" and cause.node == "sin" and "wrong phase" in cause.text
    small = convert(
        summed([helper.make_node("Tanh", ["h"], ["t"], name="tanh"), helper.make_node("Sin", ["t"], ["a"], name="sin")])
    )
    assert plan_of(small, "sin").precision == "fp16" and plan_of(small, "sum").precision == "fp16"


def test_each_other_cause_names_its_kind():
    m = between_matmuls(
        [
            helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], name="ln", axis=-1),
            helper.make_node("Softmax", ["n"], ["m"], name="softmax", axis=-1),
        ],
        extra_inits=[init("g", np.ones(H, np.float32)), init("b", np.zeros(H, np.float32))],
    )
    assert convert(m).plan.islands == []  # the fast plan runs both low
    assert island_of(convert(m, precise=True), "ln").kinds == ["precise"]
    [cause, _] = island_of(convert(m, runtime="any"), "ln").causes
    assert cause.kind == "arithmetic" and "--runtime any" in cause.text
    bf16 = island_of(convert(m, precision="bf16"), "ln")
    assert bf16.kinds == ["precise"] and "bf16" in bf16.causes[0].text
    assert island_of(convert(m, exclude_nodes=["ln"]), "ln").kinds == ["user-rule"]
    out = model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], name="ln", axis=-1),
        ],
        [tensor("x", F32, [4, H])],
        [tensor("y", F32, [4, H])],
        [init("w1", randn([H, H], 1)), init("g", np.ones(H, np.float32)), init("b", np.zeros(H, np.float32))],
    )
    [cause] = island_of(convert(out), "ln").causes
    assert cause.kind == "model-output" and "model output" in cause.text


def test_an_island_is_one_connected_fp32_region():
    m = between_matmuls(
        [
            helper.make_node("Exp", ["h"], ["e"], name="exp"),
            helper.make_node("Add", ["e", "e"], ["e2"], name="add"),
            helper.make_node("Exp", ["e2"], ["e3"], name="exp2"),
            helper.make_node("MatMul", ["e3", "w3"], ["l"], name="mm3"),
            helper.make_node("Exp", ["l"], ["l2"], name="exp3"),
            helper.make_node("Log", ["l2"], ["m"], name="log3"),
        ],
        extra_inits=[init("w3", randn([H, H], 4, 0.3))],
    )
    result = convert(m)
    first, second = result.plan.islands
    names = {e.id: e.name for e in result.plan.nodes}
    assert {names[i] for i in first.nodes} == {"exp", "add", "exp2"}
    assert {names[i] for i in second.nodes} == {"exp3", "log3"}
    assert [c.node for c in first.causes] == ["exp", "exp2"]
    assert [c.node for c in second.causes] == ["exp3", "log3"]


@pytest.mark.slow
def test_the_summary_and_explain_name_the_islands(tmp_path):
    m = summed([helper.make_node("Exp", ["h"], ["a"], name="exp")])
    result = convert(m)
    assert summary_dict(result)["fp32_islands"] == {"islands": 1, "nodes": 3, "kinds": {"range-bound": 1}}
    [line] = [x for x in conversion_summary(result).splitlines() if x.startswith("fp32 islands:")]
    assert "range-bound 1" in line
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    cli = [sys.executable, "-m", "autocast_onnx", "explain", str(path)]
    listed = subprocess.run([*cli, "--islands"], capture_output=True, text=True, check=True).stdout
    assert listed.startswith("1 fp32 island(s), estimated on H100")
    assert re.search(
        r"island 1: 3 nodes \(Exp 1, ReduceSum 1, Sub 1\); its kernels and Casts take [\d.]+ us \(\d+% of the "
        r"model\), the Casts [\d.]+ us\n  - \[range-bound\] exp: exp: its input",
        listed,
    )
    a100 = subprocess.run([*cli, "--islands", "--gpu", "A100"], capture_output=True, text=True, check=True).stdout
    assert a100.startswith("1 fp32 island(s), estimated on A100")
    alone = subprocess.run([*cli, "exp", "--gpu", "A100"], capture_output=True, text=True)
    assert alone.returncode == 2 and "--gpu has no effect without --islands" in alone.stderr
    one = subprocess.run([*cli, "exp"], capture_output=True, text=True, check=True).stdout
    assert "island 1 (3 nodes: Exp 1, ReduceSum 1, Sub 1): range-bound: exp:" in one
    clean = tmp_path / "clean.onnx"
    clean.write_bytes(decomposed_softmax().SerializeToString())
    out = subprocess.run([*cli[:-1], str(clean), "--islands"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("no fp32 islands")


def test_interval_rules():
    assert power((-3.0, 2.0), 2) == (0.0, 9.0)
    assert power((-3.0, 2.0), -1) is None and power((-3.0, -1.0), 0.5) is None
    assert power((2.0, 4.0), -1) == (0.25, 0.5)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Clip", ["r", "lo", "hi"], ["c"]),
        helper.make_node("Div", ["c", "d"], ["q"]),
        helper.make_node("Div", ["c", "x"], ["bad"]),
    ]
    inits = [init(n, np.array(v, np.float32)) for n, v in (("lo", 0.0), ("hi", 6.0), ("d", [2.0, 4.0]))]
    m = model(nodes, [tensor("x", F32, [2])], [tensor("q", F32, [2]), tensor("bad", F32, [2])], inits)
    index = build_index(m)
    bounds = Bounds(index)
    values = {v.name: v for n in index.nodes for v in n.outputs}
    assert bounds.of(values["r"]) == (0.0, math.inf)
    assert bounds.of(values["c"]) == (0.0, 6.0)
    assert bounds.of(values["q"]) == (0.0, 3.0)
    assert bounds.of(values["bad"]) is None


SHIPPED = sorted(
    p
    for folder in ("examples/models", "tests/data/evidence", "tests/data/decoders")
    for p in (ROOT / folder).glob("*.onnx")
)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_fp32_island_of_a_shipped_model_names_a_cause(path, precision):
    """Every island of every default conversion names at least one cause; in the fast plan none
    is kept by the plan's choice (`precise`), and every range-bound cause states its bound."""
    result = autocast_onnx.convert(str(path), precision=precision)
    for island in result.plan.islands:
        assert island.causes, island.text()
        if precision == "fp16":
            assert "precise" not in island.kinds, island.text()
        for cause in island.causes:
            if cause.kind == "range-bound":
                assert re.search(r"\d", cause.text), cause.text


def test_the_api_lists_the_islands_as_explain_does():
    m = summed([helper.make_node("Exp", ["h"], ["a"], name="exp")])
    [island] = autocast_onnx.explain(m, islands=True)
    assert island.kinds == ["range-bound"] and island.to_dict()["causes"][0]["node"] == "exp"
    cost = island.to_dict()["cost"]
    assert cost["us"] > cost["cast_us"] > 0 and 0 < cost["share"] < 1
    [slower] = autocast_onnx.explain(m, islands=True, gpu="RTX3060")
    assert slower.cost["us"] >= cost["us"]
    with pytest.raises(autocast_onnx.AutocastError, match="no effect without islands"):
        autocast_onnx.explain(m, "exp", gpu="A100")
    assert autocast_onnx.explain(decomposed_softmax(), islands=True) == []


@pytest.mark.slow
def test_the_frontier_prices_each_island_and_measures_the_error_it_buys(tmp_path):
    """explain --islands --frontier (API frontier=True): the precise plan's islands from cheapest to
    dearest, each with the error it buys. bert_tiny's precise plan keeps its residual stream fp32
    in one island: running it low raises the emulated error by tens of times."""
    bert = str(ROOT / "examples/models/bert_tiny.onnx")
    rows = autocast_onnx.explain(bert, islands=True, frontier=True, precise=True)
    costs = [r.cost_us for r in rows]
    assert costs == sorted(costs) and all(c > 0 for c in costs)
    stream = max(rows, key=lambda r: r.nodes)
    assert "precise" in stream.kinds and stream.error_low > 10 * stream.error_kept
    cli = [sys.executable, "-m", "autocast_onnx", "explain", bert]
    out = subprocess.run([*cli, "--islands", "--frontier", "--precise"], capture_output=True, text=True, check=True)
    assert "frontier of the 2 fp32 island(s), cheapest first (estimated on H100" in out.stdout
    assert re.search(r"costs [\d.]+ us; keeps the error at [\d.e-]+ where running it low gives", out.stdout)
    bad = subprocess.run([*cli, "/Where", "--frontier"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--frontier needs --islands" in bad.stderr
    with pytest.raises(autocast_onnx.AutocastError, match="frontier= needs islands=True"):
        autocast_onnx.explain(bert, "/Where", frontier=True)
