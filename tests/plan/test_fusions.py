"""Fusions kept (issue 37, item 6): plan/fusions.py finds the node patterns ONNX Runtime's CUDA
provider fuses and the Casts that split them; the default plan keeps them whole where the numbers
allow (the embedding sum before a LayerNormalization runs low with it, its tables stored low);
lint's AC305 reports a Cast that splits one. Minimal graphs for each pattern, with and without a
Cast, and the shipped transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import F16, F32, convert, parse, randn, run
from lint_helpers import findings

import autocast_onnx
from autocast_onnx.graph import build_index
from autocast_onnx.plan.fusions import PATTERNS, counts, find
from autocast_onnx.plan.options import PlanOptions
from autocast_onnx.validate.emulate import emulation_model

ROOT = Path(__file__).resolve().parents[2]

# One graph per pattern: `{cast}` is replaced by nothing (`a0` read as `a`) or by a Cast pair between the first two
# nodes of the pattern (the tensor `a` goes fp16 and back), which splits it.
BODIES = {
    "SkipLayerNormalization": """
        [p0] a = Add(x, r)
        {cast}
        [p1] y = LayerNormalization <axis = -1> (a0, g, b)""",
    "BiasSoftmax": """
        [p0] a = Add(x, r)
        {cast}
        [p1] y = Softmax <axis = -1> (a0)""",
    "Gelu": """
        [p0] a = Div(x, sq2)
        {cast}
        [p1] e = Erf(a0)
        [p2] e1 = Add(e, one)
        [p3] y = Mul(x, e1)""",
    "FastGelu": """
        [p0] a = Mul(x, c)
        {cast}
        [p1] t = Tanh(a0)
        [p2] t1 = Add(t, one)
        [p3] y = Mul(x, t1)""",
    "FusedMatMul": """
        [p0] a = MatMul(x, w)
        {cast}
        [p1] y = Mul(a0, c)""",
    "Gemm": """
        [p0] a = MatMul(x, w)
        {cast}
        [p1] y = Add(a0, bias)""",
}
CAST = """
        [c0] a16 = Cast <to = 10> (a)
        [c1] a0 = Cast <to = 1> (a16)"""


def pattern_model(name: str, split: bool):
    body = BODIES[name].replace("{cast}", CAST) if split else BODIES[name].replace("{cast}", "").replace("a0", "a")
    return parse(
        f"""
        m (float[4,8] x, float[4,8] r) => (float[4,8] y)
            <float sq2 = {{1.4142135}}, float one = {{1.0}}, float c = {{0.7978846}}> {{{body}
        }}""",
        g=np.ones(8, np.float32),
        b=np.zeros(8, np.float32),
        w=randn([8, 8], 1, 0.3),
        bias=randn([8], 2, 0.1),
    )


@pytest.mark.parametrize("name", sorted(BODIES))
@pytest.mark.parametrize("split", [False, True])
def test_each_pattern_is_found_whole_and_split(name, split):
    m = pattern_model(name, split)
    found = [i for i in find(build_index(m)) if i.pattern.name == name]
    assert len(found) == 1, [i.text() for i in find(build_index(m))]
    [inst] = found
    assert inst.split == split
    assert [n.name for n in inst.nodes][:2] == ["p0", "p1"]
    if split:
        assert [c.name for c in inst.casts] == ["c0", "c1"]


def test_an_intermediate_with_a_second_reader_is_not_fused():
    m = parse(
        """
        m (float[4,8] x) => (float[4,8] y, float[4,8] a)
            <float sq2 = {1.4142135}, float one = {1.0}> {
            [p0] a = Div(x, sq2)
            [p1] e = Erf(a)
            [p2] e1 = Add(e, one)
            [p3] y = Mul(x, e1)
        }"""
    )
    assert counts(find(build_index(m))).get("Gelu") is None


def test_a_matmul_scaled_by_a_tensor_is_no_fused_matmul():
    m = parse(
        """
        m (float[4,8] x, float[4,8] s) => (float[4,8] y) {
            [p0] a = MatMul(x, w)
            [p1] y = Mul(a, s)
        }""",
        w=randn([8, 8], 1, 0.3),
    )
    assert "FusedMatMul" not in counts(find(build_index(m)))


def test_every_pattern_cites_its_optimizer_source():
    for pattern in PATTERNS:
        assert pattern.cite.startswith("onnxruntime/core/optimizer/") and pattern.source.endswith("_fusion.cc")


# ---- the plan -----------------------------------------------------------------------------
def embeddings(table_max=None):
    """token ids -> word and position Gathers -> Add -> LayerNormalization -> MatMul: BERT's
    embedding block. `table_max` puts one value of that size in the word table."""
    words = randn([32, 8], 3, 0.5)
    if table_max is not None:
        words[5, 2] = table_max
    return parse(
        """
        m (int64[2,6] ids, int64[2,6] pos) => (float[2,6,8] y) {
            [gw] ew = Gather(words, ids)
            [gp] ep = Gather(positions, pos)
            [add] e = Add(ew, ep)
            [ln] n = LayerNormalization <axis = -1> (e, g, b)
            [mm] y = MatMul(n, w)
        }""",
        words=words,
        positions=randn([6, 8], 4, 0.5),
        g=randn([8], 5, 0.1) + 1.0,
        b=randn([8], 6, 0.1),
        w=randn([8, 8], 7, 0.3),
    )


def feeds():
    r = np.random.default_rng(0)
    return {"ids": r.integers(0, 32, (2, 6)), "pos": np.tile(np.arange(6), (2, 1))}


def test_the_embedding_sum_runs_low_with_the_normalization_it_feeds():
    m = embeddings()
    result = convert(m)
    p = {n.name: n.precision for n in result.plan.nodes if n.name}
    assert p["add"] == p["ln"] == p["gw"] == p["gp"] == "fp16"
    assert result.plan.by_name("add")[0].reasons[-1].code == "fast-plan"
    inits = {t.name: t.data_type for t in result.model.graph.initializer}
    assert inits["words"] == F16 and inits["positions"] == F16
    assert counts(find(build_index(result.model))) == {"SkipLayerNormalization": [1, 0]}
    ref = run(m, feeds())[0]
    out = run(emulation_model(result.model), feeds())[0]
    assert np.abs(out - ref).max() <= 1e-2 * np.abs(ref).max()
    precise = convert(m, precise=True)
    assert {n.name: n.precision for n in precise.plan.nodes if n.name}["add"] != "fp16"


def test_an_embedding_table_beyond_fp16_keeps_the_sum_fp32():
    result = convert(embeddings(table_max=1e5))
    p = {n.name: n.precision for n in result.plan.nodes if n.name}
    assert p["add"] != "fp16" and p["gw"] != "fp16"
    inits = {t.name: t.data_type for t in result.model.graph.initializer}
    assert inits["words"] == F32


@pytest.mark.parametrize("name", ["gpt2_tiny", "vit_tiny", "bert_tiny"])
def test_the_default_plan_keeps_the_shipped_transformers_fusions(name):
    path = ROOT / "examples" / "models" / f"{name}.onnx"
    after = counts(find(build_index(autocast_onnx.convert(path).model)))
    fp32 = counts(find(build_index(onnx.load(str(path)))))
    assert {k: sum(v) for k, v in after.items()} == {k: sum(v) for k, v in fp32.items()}
    split = {k: v[1] for k, v in after.items() if v[1]}
    # bert_tiny's last LayerNormalization feeds the fp32 output head: its Add -> Cast -> LN stays
    # split, the price of an fp32 head input; every other pattern is whole.
    assert split == ({"SkipLayerNormalization": 1} if name == "bert_tiny" else {})


# ---- lint ---------------------------------------------------------------------------------
def test_lint_reports_a_cast_that_splits_a_fusion():
    [d] = findings(pattern_model("SkipLayerNormalization", True), "AC305")
    assert d.node == "c0" and "SkipLayerNormalization" in d.message and "skip_layer_norm_fusion.cc" in d.message
    assert findings(pattern_model("SkipLayerNormalization", False), "AC305") == []
    assert findings(pattern_model("BiasSoftmax", True), "AC305", plan=PlanOptions(runtime="tensorrt")) == []
    assert len(findings(pattern_model("BiasSoftmax", True), "AC305", plan=PlanOptions(runtime="cuda"))) == 1
