"""Stage: report. Turns a ConversionResult into the summary the CLI prints (and a dict)."""

from __future__ import annotations

import re
from collections import Counter

from ..catalog.kernels import runtime_label
from ..errors import printable_lines
from ..plan.model import NOTE_CODES, PRECISIONS
from .cost import conversion_cost, cost_line
from .speed import speed, speed_line

CATEGORY_ORDER = ("low_precision", "follow", "keep_fp32", "clear", "non_float", "control_flow")


def _mb(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:.1f} KiB"
    return f"{n} B"


def summary_dict(result) -> dict:
    plan = result.plan
    by_cat: dict[str, Counter] = {}
    for (category, precision), count in Counter(zip(plan.categories, plan.precisions)).items():
        by_cat.setdefault(category, Counter())[precision] = count
    return {
        "target": plan.target,
        "keep_io_types": plan.keep_io_types,
        "low_precision_io": list(plan.low_precision_io),
        "nodes": len(plan.precisions),
        "precision": plan.counts(),
        "by_category": {c: dict(by_cat[c]) for c in CATEGORY_ORDER if c in by_cat},
        "casts_added": result.stats.casts_added,
        "initializers_converted": result.stats.initializers_converted,
        "initializer_copies": result.stats.initializer_copies,
        "attributes_retargeted": result.stats.attributes_retargeted,
        "initializer_bytes_before": result.initializer_bytes_before,
        "initializer_bytes_after": result.initializer_bytes_after,
        "constant_bytes_before": result.constant_bytes_before,
        "constant_bytes_after": result.constant_bytes_after,
        "fp32_by_reason": fp32_by_reason(plan),
        "warnings": sum(1 for w in plan.warnings if w.code not in NOTE_CODES),
        "notes": sum(1 for w in plan.warnings if w.code in NOTE_CODES),
        **({"edited_nodes": [n.label for n in plan.nodes if n.edited]} if plan.replayed else {}),
        **_islands(plan),
        **_no_kernel(plan),
        **_kernel_fp32(plan),
        **_fast_plan(plan),
        "runtime": plan.runtime,  # --runtime cuda, tensorrt, dml; None: planned for any
        "outputs_renamed": list(result.stats.outputs_renamed),
        "graphs_sorted": list(result.stats.graphs_sorted),
        "clamped_values": result.stats.clamped_values,
        "mask_sentinels": dict(result.plan.mask_sentinels),
        "seconds": {k: round(v, 4) for k, v in result.seconds.items()},
        "training": plan.training,
        "opset": plan.opset,  # the upgrade made before planning (--opset): {"from": 17, "to": 22}
        # the nodes only: reading result.model would give every held payload to its tensor
        "cost": conversion_cost(
            result.shapes, result.macs, result.nodes, result.stats.cast_outputs, result.plan.precisions
        ),
        "speed": speed(result, getattr(result, "gpu", None)),  # estimated GPU latency (report/speed.py)
    }


REASON_LABELS = {
    "op-category": "op category",
    "fp32-taint": "fed by fp32 (follow/clear)",
    "output-head": "output head",
    "calibration": "calibration range",
    "accuracy-search": "--target search",
    "node-rule": "[[nodes]] rule",
    "cli-exclude": "--exclude-node/--exclude-op",
    "unchanged": "not reached by low precision",
    "data-range": "constant beyond the range",
    "data-flush": "constant that would flush to 0",
    "schema": "no low-precision schema type",
    "qdq-unit": "Q/DQ unit kept whole",
    "unknown-op": "unknown op",
    "unknown-type": "unknown tensor type",
    "control-flow": "control flow",
    "consumers-need": "feeds only fp32 consumers",
    "plan-edit": "edited in the plan",
    "plan-replay": "replayed plan",
    "no-kernel": "no kernel in the --runtime",
}


def _kernel_fp32(plan) -> dict:
    """{"kernel_fp32": {"nodes": 12, "ops": {"Softmax": 12}}}: the keep_fp32 nodes planned low because the runtime's
    kernel computes them in fp32 and rounds once (plan/kernel_io.py, reason "kernel-fp32"); empty without any."""
    lowered = [i for i, code in enumerate(plan.last_reason_codes()) if code == "kernel-fp32"]
    if not lowered:
        return {}  # the plan's node entries are built only where there is something to count
    nodes = plan.nodes
    ops = Counter(nodes[i].op_type for i in lowered if plan.precisions[i] != "fp32")
    return {"kernel_fp32": {"nodes": sum(ops.values()), "ops": dict(sorted(ops.items()))}} if ops else {}


def _fast_plan(plan) -> dict:
    """{"fast_plan": {"nodes": 24, "ops": {"LayerNormalization": 12, ...}, "cast_bytes": 1572864}}: the keep_fp32
    nodes the fast plan runs low with their neighbours (plan/kernel_io.py, reason "fast-plan"), and the bytes the
    Casts on their own tensors would move in the precise plan (--precise; None where a shape is unknown): a floor
    of its extra cost, since the streams between them stay fp32 there too. Empty without any."""
    picked = [i for i, code in enumerate(plan.last_reason_codes()) if code == "fast-plan"]
    if not picked:
        return {}
    nodes = plan.nodes
    lowered = [i for i in picked if nodes[i].category == "keep_fp32"]
    upstream = [i for i in picked if nodes[i].category != "keep_fp32"]
    ops = Counter(nodes[i].op_type for i in lowered)
    sizes = [nodes[i].reasons[-1].value for i in lowered]
    known = None if any(v is None for v in sizes) else int(sum(v for v in sizes if v is not None))
    out = {"nodes": len(lowered), "ops": dict(sorted(ops.items())), "cast_bytes": known}
    if upstream:
        out["upstream"] = {
            "nodes": len(upstream),
            "ops": dict(sorted(Counter(nodes[i].op_type for i in upstream).items())),
        }
    return {"fast_plan": out}


def _islands(plan) -> dict:
    """{"fp32_islands": {"islands": 6, "nodes": 45, "kinds": {"range-bound": 5, ...}}}: the plan's fp32 islands and
    how many name each kind of cause (plan/islands.py); empty without any."""
    from ..plan.islands import summary

    found = plan.islands
    return {"fp32_islands": summary(found)} if found else {}


def island_line(islands: dict) -> str:
    """'fp32 islands: 6 (45 nodes); what keeps them fp32: range-bound 5, ...; explain --islands names each'."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in islands["kinds"].items()) or "nothing found"
    return (
        f"fp32 islands: {islands['islands']} ({islands['nodes']} nodes); what keeps them fp32 (islands per kind): "
        f"{kinds}; `explain --islands` names each cause"
    )


def _no_kernel(plan) -> dict:
    """{"no_kernel": {"runtime": "cuda", "nodes": 2, "ops": ["GridSample"]}}: the fp32 nodes kept so for want of a
    kernel in the runtime named with --runtime (reason "no-kernel"); empty without any, so that a plan made for no
    runtime reports as it always did."""
    runtime: str | None = None
    ops: Counter = Counter()
    for node in plan.nodes:
        if node.precision != "fp32":
            continue
        reason = next((r for r in node.reasons if r.code == "no-kernel"), None)
        if reason is not None:
            runtime = (reason.source or "").removeprefix("data/kernels_").removesuffix(".json") or None
            ops[node.op_type] += 1
    if not ops:
        return {}
    return {"no_kernel": {"runtime": runtime, "nodes": sum(ops.values()), "ops": sorted(ops)}}


def _runtime_line(plan, cost: dict) -> str:
    """What the plan made for a runtime runs at the target type there: the share of the MatMul/Gemm/Conv work
    (bf16 on ONNX Runtime's CUDA provider is where this is least: its kernels take bf16 for far fewer ops)."""
    where = f"planned for {runtime_label(plan.runtime)}"
    total = cost.get("macs") if cost.get("computed") else None
    if not total:
        return f"{where}: share of the MatMul/Gemm/Conv work in {plan.target} there unknown (no shapes known)"
    share = cost["macs_low_precision"] / total * 100
    return f"{where}: {share:.1f}% of the MatMul/Gemm/Conv work runs in {plan.target} there"


_FLUSHED = re.compile(r"^(\d+) of (\d+) nonzero values")


def fp32_by_reason(plan) -> dict[str, int]:
    """How many nodes are fp32, by the code of the reason that decided each (its last reason),
    most first: {"op-category": 7, "fp32-taint": 9, ...}."""
    counts: Counter = Counter()
    for precision, code in zip(plan.precisions, plan.last_reason_codes()):
        if precision == "fp32":
            counts[code or "unexplained"] += 1
    return dict(counts.most_common())


def conversion_summary(result, in_path=None, out_path=None, max_warnings: int = 10, verbose: bool = False) -> str:
    """The summary `convert` prints (docs/summary.md, line by line); `verbose` (-v) lists each
    note that the summary otherwise counts in one line."""
    s = summary_dict(result)
    plan = result.plan
    cols = [p for p in PRECISIONS if s["precision"].get(p)]
    lines = []
    head = f"converted to {plan.target}" + (
        " (model inputs/outputs keep their types)" if plan.keep_io_types else " (model inputs/outputs may change type)"
    )
    if in_path is not None:
        head = f"{in_path} -> {out_path}: " + head
    lines.append(head)
    if plan.opset is not None:
        change = f"{plan.opset['from']} -> {plan.opset['to']}"
        lines.append(f"opset upgraded: {change} (--opset, ONNX version converter), before planning")
    if plan.low_precision_io:
        names = plan.low_precision_io
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
        lines.append(f"{plan.target} model inputs/outputs (--low-precision-io): {shown}")
    lines.append(f"nodes: {s['nodes']}  " + "  ".join(f"{p}: {s['precision'][p]}" for p in cols))
    width = max([len(c) for c in s["by_category"]] + [8])
    lines.append("  " + "category".ljust(width) + "".join(p.rjust(11) for p in cols))
    for cat, counts in s["by_category"].items():
        lines.append("  " + cat.ljust(width) + "".join(str(counts.get(p, 0)).rjust(11) for p in cols))
    lines.append(
        f"casts added: {s['casts_added']}  initializers converted: {s['initializers_converted']}"
        f" (+{s['initializer_copies']} copies)  dtype attributes retargeted: {s['attributes_retargeted']}"
    )
    weights = f"weights: initializers {_mb(s['initializer_bytes_before'])} -> {_mb(s['initializer_bytes_after'])}"
    if s["constant_bytes_before"]:
        weights += f", Constant nodes {_mb(s['constant_bytes_before'])} -> {_mb(s['constant_bytes_after'])}"
    lines.append(weights)
    if s["fp32_by_reason"]:
        lines.append(
            "fp32 nodes by reason: "
            + ", ".join(f"{REASON_LABELS.get(code, code)} {n}" for code, n in s["fp32_by_reason"].items())
        )
    if s.get("fp32_islands"):
        lines.append(island_line(s["fp32_islands"]))
    if "no_kernel" in s:
        lack = s["no_kernel"]
        lines.append(
            f"kept fp32 for want of a {lack['runtime']} kernel: {lack['nodes']} (ops {', '.join(lack['ops'])})"
        )
    if "kernel_fp32" in s:
        done = s["kernel_fp32"]
        lines.append(
            f"keep_fp32 nodes at {plan.target} inputs and outputs, no Casts: {done['nodes']} "
            f"({', '.join(f'{op} {n}' for op, n in done['ops'].items())}; the runtime's kernels compute them in fp32 "
            "and round once, so Casts around them would change no number)"
        )
    if "fast_plan" in s:
        fast = s["fast_plan"]
        cost = f" (their Casts alone: {fast['cast_bytes']:,} bytes per inference)" if fast["cast_bytes"] else ""
        up = fast.get("upstream")
        feeding = (
            f", and {up['nodes']} fp32 only because nothing low fed them go low with the nodes they feed "
            f"({', '.join(f'{op} {n}' for op, n in up['ops'].items())}; their constants fit {plan.target})"
            if up
            else ""
        )
        lines.append(
            f"fast plan: {fast['nodes']} keep_fp32 nodes run at {plan.target} inputs and outputs with their neighbours "
            f"({', '.join(f'{op} {n}' for op, n in fast['ops'].items())}; the runtime's kernels compute them in fp32)"
            f"{feeding}; --precise keeps them and the streams between them fp32{cost}"
        )
    if plan.runtime is not None:
        lines.append(_runtime_line(plan, s["cost"]))
    lines.append(cost_line(s["cost"]))
    lines.append(speed_line(s["speed"]))
    stats = result.stats
    if plan.training is not None:
        lines.extend(_training_lines(plan.training))
    # Changes beyond the plan's casts, said out loud.
    if stats.outputs_renamed:
        names = ", ".join(stats.outputs_renamed[:5]) + (" ..." if len(stats.outputs_renamed) > 5 else "")
        lines.append(f"graph outputs now written by a Cast to their declared type (producer output renamed): {names}")
    if stats.graphs_sorted:
        lines.append(
            f"graphs that were not topologically sorted and were written sorted: {', '.join(stats.graphs_sorted)}"
        )
    if plan.mask_sentinels:
        values = sorted(set(plan.mask_sentinels.values()))
        lines.append(
            f"attention-mask sentinels beyond the {plan.target} range: {len(plan.mask_sentinels)} constant(s) "
            f"({stats.sentinel_values} value(s)) take {', '.join(f'{v:g}' for v in values)}, so the mask Add and the "
            "Softmax can run low (docs/rules-format.md#mask-sentinels)"
        )
    if stats.clamped_values:
        lines.append(f"values clamped to the finite {plan.target} range (forced by a rule): {stats.clamped_values}")
    if plan.replayed:
        lines.append(replay_line(plan))
    lines.extend(warning_lines(plan.warnings, plan.target.value, max_warnings, verbose))
    secs = result.seconds
    stages = ", ".join(f"{k} {v:.3f}" for k, v in secs.items() if k != "total")
    lines.append(f"time: {secs.get('total', sum(secs.values())):.3f} s ({stages})")
    return printable_lines(lines)


def _training_lines(training: dict) -> list[str]:
    lines = [f"training graph: {training['graph']}"]
    if training["kind"] == "loss":
        lines.append("  the loss stays fp32; no backward pass, so no loss scaling")
        return lines
    params = training.get("parameters") or []
    if params:
        lines.append(
            f"  master weights: {len(params)} parameters stay fp32 inputs (one Cast each where fp16 nodes read them)"
        )
    scaling = training.get("loss_scaling") or {}
    mode = scaling.get("mode", "none")
    if scaling.get("output"):
        feed = (
            f"the fp32 input '{scaling['input']}' seeds the backward pass"
            if scaling.get("input")
            else (f"the constant {mode} seeds the backward pass")
        )
        lines.append(
            f"  loss scaling: {mode} - {feed}; {scaling['gradients']} gradients are unscaled in fp32 before "
            f"accumulation; bool output '{scaling['output']}' says whether all are finite"
        )
    elif training["kind"] == "ort-training":
        lines.append(f"  loss scaling: {mode} (already in the model)" if mode != "none" else "  loss scaling: none")
    else:
        lines.append("  loss scaling: not applicable (gradients computed by ai.onnx.preview.training ops, kept fp32)")
    return lines


def replay_line(plan) -> str:
    """Where a replayed plan came from and which of its nodes the file edits (their precision
    differs from the one planning gave when the file was written)."""
    source = plan.source or "a plan given in memory"
    if all(n.planned is None for n in plan.nodes):
        return (
            f"plan replayed from {source} (the file records no planned precisions: edits cannot be told apart; "
            "--plan-out writes them)"
        )
    edited = [n for n in plan.nodes if n.edited]
    if not edited:
        return f"plan replayed from {source}: no node edited"
    shown = ", ".join(f"{n.label} {n.planned} -> {n.precision}" for n in edited[:5])
    more = f", ... ({len(edited)} in all)" if len(edited) > 5 else ""
    return f"plan replayed from {source}: {len(edited)} of {len(plan.nodes)} nodes edited ({shown}{more})"


def flushed_fraction(message: str) -> float | None:
    """The fraction of a constant's nonzero values that flush, read from a flush note's own
    counts ('3 of 589824 nonzero values of ...'); None for any other message."""
    found = _FLUSHED.match(message)
    if found is None or not int(found.group(2)):
        return None
    return int(found.group(1)) / int(found.group(2))


def warning_lines(warnings, target: str, max_warnings: int = 10, verbose: bool = False) -> list[str]:
    """The warnings that need action, one line each (the first `max_warnings`), then the notes
    that need none (NOTE_CODES) in one line with their count and worst fraction; `verbose` lists
    each note too."""
    act = [w for w in warnings if w.code not in NOTE_CODES]
    notes = [w for w in warnings if w.code in NOTE_CODES]
    lines = []
    if act:
        lines.append(f"warnings: {len(act)}")
        for w in act[:max_warnings]:
            lines.append(f"  [{w.code}] {w.message}")
        if len(act) > max_warnings:
            lines.append(f"  ... {len(act) - max_warnings} more (see --plan-out)")
    if notes:
        fractions = [f for f in (flushed_fraction(w.message) for w in notes) if f is not None]
        worst = f"; worst {max(fractions) * 100:.2g}% of a tensor's nonzero values" if fractions else ""
        lines.append(
            f"notes: {len(notes)} constant(s) with a few values that flush to zero in {target}, converted as "
            f"the rules allow{worst} ({'listed below' if verbose else '-v lists them'}; --plan-out keeps them)"
        )
        if verbose:
            lines.extend(f"  [{w.code}] {w.message}" for w in notes)
    return lines
