"""The speed paths of the conversion give what the plain paths give.

- The data rules screen fp32 weights by converting them to fp16 and hand the fp16 bytes to the
  rewrite (`converted`): the verdicts are those of the exact screen, the bytes are numpy's, and the
  converted model is byte-identical to one converted without the hand-over.
- The rewrite appends new nodes and sorts the node list in place: the NodeProtos the index holds
  stay the model's own (body graphs included), and the order is topological.
- The console entry (`python -m autocast_onnx`) exits with the command's code after flushing.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from helpers import cli_process, parse, randn

from autocast_onnx.catalog import load_rules
from autocast_onnx.graph import build_index
from autocast_onnx.plan import Precision, classify, global_order, paint
from autocast_onnx.rewrite import apply_plan

TINY = np.float32(2.0**-25)  # half the smallest fp16 subnormal: rounds to zero (ties to even)


def weights_at_the_edges() -> dict[str, np.ndarray]:
    """One initializer per case the screen must tell apart."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    cases = {
        "plain": w,
        "overflow": np.where(np.arange(32).reshape(4, 8) == 5, 70000.0, w).astype(np.float32),
        "largest_finite": np.full((4, 8), 65519.0, np.float32),  # rounds to 65504: no headroom
        "below_the_edge": np.full((4, 8), 65488.0, np.float32),  # the tie rounds to 65472: in range
        "first_overflow": np.full((4, 8), 65520.0, np.float32),  # rounds to inf
        "all_flush": np.full((4, 8), 1e-9, np.float32),  # an epsilon-like constant
        "boundary": np.full((4, 8), TINY, np.float32),  # becomes 0 in fp16, yet is no flush by the rule
        "zeros": np.zeros((4, 8), np.float32),  # exact zeros stay exact
        "some_flush": np.where(np.arange(32).reshape(4, 8) % 8 == 0, 1e-9, w).astype(np.float32),
        "not_finite": np.where(np.arange(32).reshape(4, 8) == 3, np.inf, w).astype(np.float32),
        "nan": np.where(np.arange(32).reshape(4, 8) == 7, np.nan, w).astype(np.float32),
    }
    big = rng.standard_normal((64, 8)).astype(np.float32)
    big[10, 3] = 1e-12  # one flushing value among many: a note, under max_flush_fraction
    cases["mostly_fine"] = big
    return cases


def model_of(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """One Add (or MatMul) per weight, each reading the model input: a verdict on one weight cannot
    reach another's node (an out-of-range value is followed through Add)."""
    lines, outs = [], []
    for k, (name, arr) in enumerate(weights.items()):
        small = arr.shape == (4, 8)
        lines.append(f"[add_{name}] a{k} = Add(x, {name})" if small else f"[mm_{name}] a{k} = MatMul(x64, {name})")
        outs.append(f"float[4,8] a{k}" if small else f"float[2,8] a{k}")
    body = "\n".join(lines)
    return parse(
        f"""
        edges (float[4,8] x, float[2,64] x64) => ({", ".join(outs)}) {{
            {body}
        }}""",
        **weights,
    )


def plan_and_apply(model: onnx.ModelProto, payloads: dict | None):
    rules = load_rules([])
    index = build_index(model)
    classification = classify(index, rules, Precision.FP16, converted=payloads)
    plan = paint(index, classification, Precision.FP16, True, rules.files, order=global_order(index))
    stats = apply_plan(index, plan, converted=payloads)
    return classification, plan, stats


def test_screen_by_conversion_gives_the_exact_screens_verdicts_and_numpys_bytes():
    weights = weights_at_the_edges()
    payloads: dict = {}
    plain = classify(build_index(model_of(weights)), load_rules([]), Precision.FP16)
    model = model_of(weights)
    index = build_index(model)
    fast = classify(index, load_rules([]), Precision.FP16, converted=payloads)

    def verdicts(c):
        return [(s, [(r.code, r.message) for r in rs]) for s, rs in zip(c.seeds, c.reasons)], sorted(
            v.name for v, _ in c.flush_notes.values()
        )

    assert verdicts(fast) == verdicts(plain)
    seeds = {index.nodes[i].name: s for i, s in enumerate(fast.seeds)}
    for kept in ("add_overflow", "add_first_overflow", "add_largest_finite", "add_all_flush"):
        assert seeds[kept] is not None, kept  # the screen found them
    for free in ("add_plain", "add_below_the_edge", "add_zeros", "add_boundary", "mm_mostly_fine"):
        assert seeds[free] is None, free
    assert sorted(v.name for v, _ in fast.flush_notes.values()) == ["mostly_fine", "some_flush"]
    # every screened tensor left its fp16 bytes, equal to numpy's rounding
    by_name = {init.name: init for init in model.graph.initializer}
    assert payloads, "the screen converted nothing"
    for name, arr in weights.items():
        held = payloads.get(id(index.main.values[name].initializer))
        if held is not None:
            with np.errstate(over="ignore"):
                assert bytes(held) == arr.astype("<f2").tobytes(), name
    assert set(by_name) == set(weights)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_converted_with_the_handed_over_bytes_is_byte_identical(seed):
    rng = np.random.default_rng(seed)
    weights = {
        f"w{k}": (rng.standard_normal((8, 8)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32) for k in range(6)
    }
    weights["w2"][0, 0] = 1e5  # one weight that keeps its MatMul fp32
    body = "\n".join(f"[mm{k}] h{k + 1} = MatMul(h{k}, w{k})" for k in range(6))
    text = f"""
        chain (float[2,8] h0) => (float[2,8] y) {{
            {body}
            [sm] y = Softmax(h6)
        }}"""
    fast_model, slow_model = parse(text, **weights), parse(text, **weights)
    payloads: dict = {}
    _, fast_plan, fast_stats = plan_and_apply(fast_model, payloads)
    _, slow_plan, slow_stats = plan_and_apply(slow_model, None)
    # what is left was screened but not converted: w2, whose MatMul stays fp32
    assert len(payloads) == 1
    assert {i.name for i in fast_model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT} == {"w2"}
    assert fast_plan.precisions == slow_plan.precisions
    assert fast_stats.initializers_converted == slow_stats.initializers_converted > 0
    assert fast_model.SerializeToString() == slow_model.SerializeToString()
    onnx.checker.check_model(fast_model, full_check=True)


def test_sorted_node_lists_keep_the_index_protos_including_bodies():
    then_w, else_w = randn([4, 4]), randn([4, 4])
    model = parse(
        """
        branchy (bool c, float[2,4] x, float[4,4] w) => (float[2,4] y) {
            [pre] h = MatMul(x, w)
            [sm] s = Softmax(h)
            [choose] y = If(c) <
                then_branch = g1 () => (float[2,4] t) { [then_mm] t = MatMul(s, w) },
                else_branch = g2 () => (float[2,4] e) { [else_sm] e = Softmax(s) }
            >
        }""",
        w=randn([4, 4]),
    )
    del then_w, else_w
    index = build_index(model)
    rules = load_rules([])
    classification = classify(index, rules, Precision.FP16)
    plan = paint(index, classification, Precision.FP16, True, rules.files, order=global_order(index))
    apply_plan(index, plan)
    # the index's protos are the model's own messages: an edit through them shows in the model
    for node in index.nodes:
        node.proto.doc_string = f"seen {node.id}"
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    docs = {n.doc_string for g in graphs for n in g.node if n.op_type != "Cast"}
    assert docs == {f"seen {node.id}" for node in index.nodes}
    assert any(n.op_type == "Cast" for n in model.graph.node)
    onnx.checker.check_model(model, full_check=True)  # topological in every graph


@pytest.mark.slow
def test_the_console_entry_exits_with_the_commands_code(tmp_path):
    model = parse(
        """
        tiny (float[2,4] x) => (float[2,4] y) { [fc] h = MatMul(x, w) [sm] y = Softmax(h) }""",
        w=randn([4, 4]),
    )
    onnx.save(model, tmp_path / "m.onnx")
    ok = cli_process("convert", "m.onnx", "-o", "m16.onnx", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "casts" in ok.stdout + ok.stderr  # the summary was flushed before the exit
    assert (tmp_path / "m16.onnx").is_file()
    bad = cli_process("convert", "missing.onnx", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "missing.onnx" in bad.stderr


def test_the_console_entry_keeps_the_result_until_the_exit_and_main_keeps_nothing(tmp_path, monkeypatch):
    """run() ends with os._exit, so the conversion's result is kept rather than freed object by
    object when the command returns; main() (tests, callers) keeps nothing between calls."""
    from autocast_onnx.cli import guard
    from autocast_onnx.cli import main as cli
    from autocast_onnx.pipeline import ConversionResult

    model = parse(
        """
        tiny (float[2,4] x) => (float[2,4] y) { [fc] h = MatMul(x, w) [sm] y = Softmax(h) }""",
        w=randn([4, 4]),
    )
    onnx.save(model, tmp_path / "m.onnx")

    class Exited(Exception):
        pass

    def no_exit(code):
        raise Exited(code)

    monkeypatch.setattr(guard, "_KEPT_UNTIL_EXIT", None)
    monkeypatch.setattr(cli.os, "_exit", no_exit)
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)  # pytest's handlers stay open
    monkeypatch.setattr(
        sys, "argv", ["autocast-onnx", "convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "a.onnx"), "-q"]
    )
    with pytest.raises(Exited) as exited:
        cli.run()
    assert exited.value.args == (0,)
    kept = guard._KEPT_UNTIL_EXIT
    assert [type(obj) for obj in kept] == [ConversionResult]
    assert [n.op_type for n in kept[0].model.graph.node].count("Cast") >= 1

    monkeypatch.setattr(guard, "_KEPT_UNTIL_EXIT", None)
    with pytest.raises(SystemExit) as done:
        cli.main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "b.onnx"), "-q"])
    assert done.value.code == 0 and guard._KEPT_UNTIL_EXIT is None
    assert (tmp_path / "b.onnx").read_bytes() == (tmp_path / "a.onnx").read_bytes()


def test_a_conversion_leaves_the_programs_frozen_objects_frozen():
    """The collector trick after indexing (freeze, unfreeze) must not undo a program's own
    gc.freeze() (servers freeze before forking), and leaves nothing frozen otherwise."""
    import gc

    import autocast_onnx

    model = parse(
        """
        tiny (float[2,4] x) => (float[2,4] y) { [fc] h = MatMul(x, w) [sm] y = Softmax(h) }""",
        w=randn([4, 4]),
    )
    assert gc.get_freeze_count() == 0
    autocast_onnx.convert(model)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        autocast_onnx.convert(model)
        # still frozen (an unfreeze would leave 0; a few frozen objects may die meanwhile)
        assert gc.get_freeze_count() > 0.9 * frozen
    finally:
        gc.unfreeze()
