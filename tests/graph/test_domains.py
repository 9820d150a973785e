"""The default ONNX domain may be spelled "" or "ai.onnx": the graph index normalises it once
(graph.domains.normalize_domain), so every stage treats both spellings alike, while plans and
the converted model keep the spelling the author wrote."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.catalog import load_rules
from autocast_onnx.graph import build_index
from autocast_onnx.plan.classify import classify
from autocast_onnx.plan.paint import global_order, paint
from autocast_onnx.plan.vocab import Precision
from autocast_onnx.rewrite.apply import apply_plan

PACKAGE = Path(autocast_onnx.__file__).parent
DEFAULT = "ai.onnx"

# Files outside this change's reach that still spell the default domain out, and how often.
# pipeline.py: the opset test (the model's opset_import, which the index does not normalise);
# graph/sanity.py: the name shown in an error message.
ALLOWED = {"pipeline.py": 1, "graph/sanity.py": 1}


def _block():
    """Attention-like block touching the default-domain tests: a Constant, an author's Cast pair,
    a pinned LayerNormalization, Softmax (kept fp32), MatMuls (low precision)."""
    return parse(
        """
        block (float[2,4,8] q, float[2,4,4] mask) => (float[2,4,8] out) {
            [scale] scale = Constant <value = float {2.0}> ()
            [scores] scores = MatMul(q, kt)
            [scale_div] scaled = Div(scores, scale)
            [mask_add] masked = Add(scaled, mask)
            [softmax] probs = Softmax <axis = -1> (masked)
            [context] ctx = MatMul(probs, v)
            [down] ctx16 = Cast <to = 10> (ctx)
            [up] ctx32 = Cast <to = 1> (ctx16)
            [norm] out = LayerNormalization <axis = -1> (ctx32, gamma, beta)
        }""",
        kt=randn([8, 4], 1, 0.3),
        v=randn([4, 8], 2, 0.3),
        gamma=np.ones(8, np.float32),
        beta=np.zeros(8, np.float32),
    )


def _spelled_out(m: onnx.ModelProto) -> onnx.ModelProto:
    """`m` with "ai.onnx" written out on its nodes and its opset import."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for node in out.graph.node:
        node.domain = DEFAULT
    for opset in out.opset_import:
        if opset.domain == "":
            opset.domain = DEFAULT
    return out


def test_index_stores_the_default_domain_normalised():
    index = build_index(_spelled_out(_block()))
    assert {node.domain for node in index.nodes} == {""}
    assert {node.authored_domain for node in index.nodes} == {DEFAULT}
    assert index.opset(DEFAULT) == index.opset("") == 17


def _planned_and_applied(m: onnx.ModelProto, precision: str):
    """Plan `m` (index, classify, paint) and apply the plan to it in place. The stages are called
    one by one: onnx.checker, which convert() runs first, refuses "ai.onnx" spelled out."""
    index = build_index(m)
    rules = load_rules()
    target = Precision(precision)
    plan = paint(index, classify(index, rules, target), target, True, rules.files, order=global_order(index))
    apply_plan(index, plan)
    return plan, m


def test_explicit_default_domain_converts_like_the_empty_one():
    for precision in ("fp16", "bf16"):
        plain, plain_model = _planned_and_applied(_block(), precision)
        spelled, spelled_model = _planned_and_applied(_spelled_out(_block()), precision)
        assert spelled.precisions == plain.precisions
        assert "fp32" in plain.precisions and precision in plain.precisions
        assert [e.category for e in spelled.nodes] == [e.category for e in plain.nodes]
        assert [[r.code for r in e.reasons] for e in spelled.nodes] == [
            [r.code for r in e.reasons] for e in plain.nodes
        ]
        assert [(n.op_type, n.name, list(n.input)) for n in spelled_model.graph.node] == [
            (n.op_type, n.name, list(n.input)) for n in plain_model.graph.node
        ]
        assert [a for n in spelled_model.graph.node for a in n.attribute] == [
            a for n in plain_model.graph.node for a in n.attribute
        ]
        # The author's spelling is kept: in the plan and on the nodes the model had.
        assert {e.domain for e in spelled.nodes} == {DEFAULT}
        authored = {n.name for n in _block().graph.node}
        assert {n.domain for n in spelled_model.graph.node if n.name in authored} == {DEFAULT}


def test_explicit_default_domain_lints_like_the_empty_one():
    plain = autocast_onnx.lint(_block())
    spelled = autocast_onnx.lint(_spelled_out(_block()))
    assert [(d.code, d.node, d.protected) for d in spelled.findings] == [
        (d.code, d.node, d.protected) for d in plain.findings
    ]


def _default_domain_literals(path: Path) -> int:
    """How many "ai.onnx" string constants the file holds outside normalize_domain."""
    tree = ast.parse(path.read_text())
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "normalize_domain":
            inside |= {id(n) for n in ast.walk(fn)}
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == DEFAULT and id(n) not in inside)


def test_default_domain_is_spelled_out_only_where_it_is_normalised():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        count = _default_domain_literals(path)
        if count:
            found[path.relative_to(PACKAGE).as_posix()] = count
    assert found == ALLOWED
