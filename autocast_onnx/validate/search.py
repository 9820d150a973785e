"""Stage: accuracy recovery. Finds a small set of nodes to keep in fp32 so that the converted
model meets accuracy targets on the given inputs.

The reference outputs are computed once. Each evaluation converts the model with a set S of
nodes forced to fp32, runs it (emulated on CPU), and checks the targets. With every
low-precision node forced fp32 the targets must hold (else no set can help).

Candidates are ranked in two levels. Bands of consecutive candidates (in execution order) are
each kept fp32 once: the drop in output error per node made fp32 ranks the bands (where keeping
fp32 pays); the best band is split in four again, and again, down to a node or two. Within a
band, error attribution (diagnose.py, one pass on the first batch) ranks the
nodes by the error each introduces from exact inputs, raised by the gain of an fp32 consumer
that amplifies it (a subtraction that cancels, a sigmoid near its threshold). Each candidate stands
for its region: the node with its low-precision follow/clear neighbours, so that keeping it fp32
does not leave a cast on each side of a lone node. The regions that meet the targets are found
culprit by culprit: the shortest prefix of the remaining
ranking that passes with the culprits already kept, by doubling then bisecting, gives the next
culprit (its last node). With a good ranking each culprit is near the front and costs a few
evaluations; each one kept is needed, given the ranking. After MAX_EVALUATIONS evaluations the
search stops with the smallest passing set it has seen (and says so in its log).
Nodes of If/Loop/Scan bodies are candidates too, ranked after the attributed ones.
"""

from __future__ import annotations

import math
from typing import Any

import onnx

from ..errors import AutocastError
from ..graph import build_index
from ..plan import global_order
from ..plan.model import Reason
from . import runner
from .emulate import emulation_model
from .metrics import OutputStats, Thresholds, verdict

TARGET_KEYS = {
    "atol": "atol",
    "rtol": "rtol",
    "cosine": "min_cosine",
    "min_cosine": "min_cosine",
    "top1": "min_top1",
    "min_top1": "min_top1",
}


def parse_target(items) -> Thresholds:
    """`atol=1e-3,top1=0.99` (repeatable) -> Thresholds with only those set."""
    found = Thresholds(atol=None, rtol=None, min_cosine=None, min_top1=None)
    parts = [p for item in items for p in item.split(",") if p.strip()]
    if not parts:
        raise AutocastError("--target needs at least one KEY=VALUE", "--target", "e.g. --target cosine=0.9999")
    for part in parts:
        key, _, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if key not in TARGET_KEYS or not value:
            raise AutocastError(
                f"bad --target entry {part!r}", "--target", "use atol=, rtol=, cosine= or top1= with a number"
            )
        try:
            setattr(found, TARGET_KEYS[key], float(value))
        except ValueError:
            raise AutocastError(f"bad number in --target {part!r}", "--target", "e.g. cosine=0.9999") from None
    return found


class _Evaluator:
    def __init__(self, model: onnx.ModelProto, batches, convert_options: dict, target: Thresholds, device: str):
        from ..pipeline import convert

        self._convert = convert
        self.model = model
        self.batches = batches
        self.options = convert_options
        self.target = target
        ref = runner.session(model.SerializeToString(), device)
        self.names = [o.name for o in ref.get_outputs()]
        self.reference = [runner.run(ref, feeds) for feeds in batches]
        self.evaluations = 0

    def convert(self, forced: dict):
        return self._convert(self.model, check="none", force_fp32=forced, **self.options)

    def passes(self, forced: dict) -> tuple[bool, list]:
        ok, failures, _ = self.measure(forced)
        return ok, failures

    def measure(self, forced: dict) -> tuple[bool, list, float]:
        """(targets met, why not, the largest relative L2 error over the outputs); the plan's
        precisions are left in `last_precisions`."""
        from .diagnose import relative_error

        self.evaluations += 1
        result = self.convert(forced)
        self.last_precisions = list(result.plan.precisions)
        sess = runner.session(emulation_model(result.model).SerializeToString(), "cpu", optimize=False)
        stats = [OutputStats(n) for n in self.names]
        error = 0.0
        for feeds, ref_out in zip(self.batches, self.reference):
            inputs = {i.name: feeds[i.name].astype(_np(i.type)) for i in sess.get_inputs()}
            for s, r, o in zip(stats, ref_out, runner.run(sess, inputs)):
                o = o.astype(r.dtype) if o.dtype != r.dtype and r.dtype.kind == "f" else o
                s.add(r, o)
                if r.dtype.kind == "f":
                    error = max(error, relative_error(o, r))
        failures = []
        for s in stats:
            _, why = verdict(s.summary(), self.target)
            failures += [f"{s.name}: {w}" for w in why]
        return not failures, failures, error


def _np(ort_type: str):
    import numpy as np

    return {
        "tensor(float16)": np.float16,
        "tensor(float)": np.float32,
        "tensor(double)": np.float64,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
        "tensor(bool)": np.bool_,
        "tensor(int8)": np.int8,
        "tensor(uint8)": np.uint8,
    }.get(ort_type, np.float32)


def _forced_low(entry) -> bool:
    """The user forced this node low (--include-node or a node rule): the search leaves it be."""
    return any(r.code == "cli-include" or (r.code == "node-rule" and "forces low" in r.message) for r in entry.reasons)


def _scores(model, converted, batch, index, candidates) -> tuple[dict, set]:
    """(node id -> attribution score for the main-graph candidates, the ids whose error comes
    from the rounding of their inputs) - see the module docstring."""
    from .diagnose import diagnose

    report = diagnose(model, converted, batch=batch, top=1)
    by_name = {n["name"]: n for n in report["nodes"]}
    input_sensitive = {
        node.id
        for node in index.main.nodes
        if node.name in by_name
        and by_name[node.name]["introduced"] > max(1e-3, 10 * by_name[node.name]["introduced_exact_inputs"])
    }
    scores: dict[int, float] = {}
    for node in index.main.nodes:
        entry = by_name.get(node.name)
        if entry is not None and node.id in candidates:
            scores[node.id] = entry["introduced"]
    for node in index.main.nodes:  # an fp32 node that amplifies what it receives raises its feeders' scores
        entry = by_name.get(node.name)
        gain = entry.get("amplification") if entry and entry["precision"] == "fp32" else None
        if not gain or not math.isfinite(gain) or gain <= 10:
            continue
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer is not None and producer.id in scores:
                scores[producer.id] = max(scores[producer.id], scores[producer.id] * gain)
    return scores, input_sensitive


def _regions(index, plan, candidates, input_sensitive) -> dict:
    """node id -> its region: the node, the low-precision follow/clear nodes it feeds (kept fp32
    together, they leave one cast where a lone fp32 node leaves one on each side), and - when the
    rounding of its inputs is what hurts - its low-precision follow/clear producers (one hop)."""
    category = {p.id: p.category for p in plan.nodes}
    out = {}
    for node in index.nodes:
        if node.id not in candidates:
            continue
        region = {node.id}
        neighbours = [c for v in node.outputs if v is not None for c, _ in v.consumers]
        if node.id in input_sensitive:
            neighbours += [v.producer for v in node.inputs if v is not None and v.producer is not None]
        for other in neighbours:
            if other.id in candidates and category.get(other.id) in ("follow", "clear"):
                region.add(other.id)
        out[node.id] = region
    return out


BANDS = 12
MAX_EVALUATIONS = 100  # then the smallest passing set found so far is kept


def _bands(order: list, parts: int) -> list:
    """Up to `parts` runs of consecutive candidates, in execution order."""
    count = min(parts, len(order))
    size = -(-len(order) // count) if count else 1
    return [order[k : k + size] for k in range(0, len(order), size)]


def _gain(before: float, after: float) -> float:
    """How much an evaluation's output error dropped (infinite errors count as very large)."""
    big = 1e30
    before = before if math.isfinite(before) else big
    after = after if math.isfinite(after) else big
    return max(0.0, before - after)


def _tidy(ev, kept: list, index, plan) -> list:
    """Drop the follow/clear nodes of `kept` that are fed only by kept nodes (they follow them to
    fp32 anyway), when the conversion without them is the same: the list then names only what the
    search had to decide. Two conversions, no evaluation."""
    category = {p.id: p.category for p in plan.nodes}
    kept_set = set(kept)
    nodes = {n.id: n for n in index.nodes}
    droppable = set()
    for i in kept:
        if category.get(i) not in ("follow", "clear"):
            continue
        producers = [v.producer for v in nodes[i].inputs if v is not None and v.producer is not None]
        if producers and all(p.id in kept_set for p in producers):
            droppable.add(i)
    if not droppable:
        return kept
    probe = {i: Reason("accuracy-search", "probe") for i in kept}
    full = ev.convert(probe).plan.precisions
    smaller = ev.convert({i: r for i, r in probe.items() if i not in droppable}).plan.precisions
    return [i for i in kept if i not in droppable] if list(full) == list(smaller) else kept


def search(
    model: onnx.ModelProto,
    batches,
    convert_options: dict,
    target: Thresholds,
    device: str = "cpu",
    progress=None,
    note=None,
) -> tuple[dict, dict]:
    """(node id -> Reason for the nodes to keep fp32, a log of the search). `progress(label,
    total)` gives a bar (a terminal); `note(text)` is called once per step (no terminal)."""
    import time

    start = time.perf_counter()
    ev = _Evaluator(model, batches, convert_options, target, device)
    first = ev.convert({})
    index = build_index(onnx.ModelProto.FromString(model.SerializeToString()))
    low = {p.id for p in first.plan.nodes if p.precision in ("fp16", "bf16") and not _forced_low(p)}
    order = [n.id for n in global_order(index) if n.id in low]
    labels = {n.id: n.label for n in index.nodes}
    log: dict[str, Any] = {
        "candidates": len(order),
        "evaluations": 0,
        "kept": [],
        "attribution": {},
        "initial_failures": [],
        "passed": True,
        "seconds": 0.0,
    }
    # the search never runs more than this many evaluations (the budget, plus the last check of a
    # culprit and the two checks up front): an honest upper bound for the bar
    bound = MAX_EVALUATIONS + 3
    bar = progress(f"--target search (at most {bound} evaluations)", bound) if progress else None

    def step(what: str, ok: bool, failures) -> None:
        if bar:
            bar.update(1)
        if note:
            why = "" if ok else f": {failures[0]}" if failures else ""
            note(f"--target search: evaluation {ev.evaluations}: {what} -> {'pass' if ok else 'fail'}{why}")

    def finish(kept_ids) -> tuple[dict, dict]:
        if bar:
            bar.finish()
        log["evaluations"] = ev.evaluations
        log["seconds"] = round(time.perf_counter() - start, 3)
        return forced(kept_ids), log

    def forced(ids):
        return {
            i: Reason(
                "accuracy-search",
                "kept fp32 by the --target search: with it in low precision the targets fail on the given inputs"
                + (f" (attributed error {scores[i]:.3g})" if scores.get(i) else ""),
                value=scores.get(i),
            )
            for i in ids
        }

    scores: dict[int, float] = {}
    ok, failures = ev.passes({})
    step("nothing kept fp32", ok, failures)
    log["initial_failures"] = failures
    if ok:
        return finish([])
    ok_all, failures_all = ev.passes(forced(order))
    step(f"all {len(order)} candidates kept fp32", ok_all, failures_all)
    if not ok_all:
        if bar:
            bar.finish()
        raise AutocastError(
            "the --target cannot be met even with every low-precision node kept fp32: " + "; ".join(failures_all[:3]),
            "--target",
            "loosen the target, or check the inputs (the fp32 model is the reference)",
        )
    scores, input_sensitive = _scores(model, first.model, batches[0], index, low)
    position = {i: k for k, i in enumerate(order)}
    regions = _regions(index, first.plan, low, input_sensitive)
    # Where along the graph does keeping fp32 pay? Each band of consecutive candidates (in
    # execution order) is kept fp32 once, and the drop in output error per node ranks the bands;
    # within a band, the nodes are ranked by the error they introduce.
    _, _, base_error = ev.measure({})

    def band_gain(band: list, label: str) -> float:
        ok_b, failures_b, error_b = ev.measure(forced(band))
        step(f"{label} ({len(band)} nodes) kept fp32", ok_b, failures_b)
        # per node that this makes fp32 (the band and the follow nodes that follow it to fp32)
        cost = sum(1 for i in order if ev.last_precisions[i] in ("fp32", "unchanged"))
        return _gain(base_error, error_b) / max(cost, 1)

    def by_score(nodes: list) -> list:
        return sorted(nodes, key=lambda i: (-scores.get(i, 0.0), position[i]))

    def refine(band: list, depth: int = 1) -> list:
        """The band's nodes, the sub-band where keeping fp32 pays most first (recursively)."""
        if len(band) <= 2:
            return by_score(band)
        subs = _bands(band, 4)
        gains_sub = [band_gain(sub, f"band level {depth + 1}, part {k + 1}/{len(subs)}") for k, sub in enumerate(subs)]
        if max(gains_sub) <= 0:  # no part helps alone: attribution decides
            return by_score(band)
        ranked_subs = [sub for _, sub in sorted(zip(gains_sub, subs), key=lambda p: -p[0])]
        return refine(ranked_subs[0], depth + 1) + [i for sub in ranked_subs[1:] for i in by_score(sub)]

    bands = _bands(order, BANDS)
    gains = [band_gain(band, f"band {b + 1}/{len(bands)}") for b, band in enumerate(bands)]
    if max(gains) <= 0:  # no band helps alone (e.g. an overflow that two bands must fix together)
        ranked = by_score(order)
    else:
        ranked_bands = [band for _, band in sorted(zip(gains, bands), key=lambda p: -p[0])]
        ranked = refine(ranked_bands[0]) + [i for band in ranked_bands[1:] for i in by_score(band)]

    def expand(ids) -> list:
        out: dict = {}
        for i in ids:
            for j in sorted(regions[i], key=position.__getitem__):
                out[j] = None
        return list(out)

    # Culprits one at a time, each the shortest prefix of the remaining ranking that passes with
    # those already kept (found by doubling, then bisection): with a good ranking a culprit sits
    # near the front and costs a few evaluations; each one kept is needed given the ranking. The
    # smallest passing set seen so far is always at hand: when the evaluation budget runs out
    # (many culprits), the search stops there.
    best: list = list(order)
    kept_core: list = []
    remaining = list(ranked)

    def attempt(ids: list, what: str) -> bool:
        nonlocal best
        ok, failures = ev.passes(forced(ids))
        step(what, ok, failures)
        if ok and len(ids) < len(best):
            best = ids
            if bar is not None and hasattr(bar, "describe"):
                count = f"{len(best)} node{'s' if len(best) != 1 else ''}"
                bar.describe(f"--target search (best so far: {count} kept fp32)")
        return ok

    budget_hit = False
    while not attempt(expand(kept_core), f"{len(kept_core)} culprits kept fp32"):
        if ev.evaluations >= MAX_EVALUATIONS:
            budget_hit = True
            break
        lo, hi = 0, 1
        passed = False
        while ev.evaluations < MAX_EVALUATIONS:
            if attempt(expand(kept_core + remaining[:hi]), f"{len(kept_core)} culprits + the next {hi} ranked"):
                passed = True
                break
            if hi >= len(remaining):
                raise AutocastError("the --target search could not pass", "--target", "this is a bug; please report it")
            lo, hi = hi, min(2 * hi, len(remaining))
        if not passed:
            budget_hit = True
            break
        while hi - lo > 1 and ev.evaluations < MAX_EVALUATIONS:
            mid = (lo + hi) // 2
            if attempt(expand(kept_core + remaining[:mid]), f"{len(kept_core)} culprits + the next {mid} ranked"):
                hi = mid
            else:
                lo = mid
        if hi - lo > 1:
            budget_hit = True
            break
        kept_core.append(remaining.pop(hi - 1))
    log["budget_reached"] = budget_hit
    if budget_hit:
        kept = _tidy(ev, best, index, first.plan)
        log["kept"] = [labels[i] for i in kept]
        log["attribution"] = {labels[i]: scores.get(i, 0.0) for i in kept}
        return finish(kept)
    kept = _tidy(ev, expand(kept_core), index, first.plan)
    log["kept"] = [labels[i] for i in kept]
    log["attribution"] = {labels[i]: scores.get(i, 0.0) for i in kept}
    return finish(kept)
