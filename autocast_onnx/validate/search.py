"""Stage: accuracy recovery. Finds a small set of nodes to keep in fp32 so that the converted
model meets accuracy targets on the given inputs.

The reference outputs are computed once. Each evaluation converts the model with a set S of
nodes forced to fp32, runs it (emulated on CPU), and checks the targets. With every
low-precision node forced fp32 the targets must hold (else no set can help). Outputs are measured
as validation measures them: padded positions left out (masks.Padding), a probability map judged
by the IoU of its masks when the target sets iou=; and the output error that ranks candidates is
the verdict's own (metrics.search_error: 1 - IoU for such a map, else the relative L2 error).

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
import time
from typing import Any

import numpy as np
import onnx

from .. import roofline
from ..errors import AutocastError
from ..graph import build_index
from ..plan import global_order
from ..plan.model import Reason
from ..report.speed import speed
from . import runner
from .emulate import emulation_model
from .masks import Padding
from .metrics import RELATIVE_FLOOR, OutputStats, Thresholds, search_error, verdict
from .options import TARGET_NAMES


class _Evaluator:
    """Converts with a set of nodes kept fp32 and measures the result as validation does: on the
    unpadded positions (masks.Padding), with maps judged by the IoU of their masks."""

    def __init__(
        self,
        model: onnx.ModelProto,
        batches,
        convert_options: dict,
        target: Thresholds,
        device: str,
        padding: Padding | None = None,
        callback=None,
    ):
        from ..pipeline import convert_checked, load_argument
        from ..plan.options import plan_options_in

        self._convert = convert_checked
        self.model = load_argument(model, True).model  # read and checked once, converted many times
        self.batches = batches
        # the planning options made once (a PlanOptions as options=, or planning keywords), the
        # conversion's other keywords (calibration, gpu) beside them
        self.plan_options, self.stages = plan_options_in(convert_options, "search")
        self.target = target
        ref = runner.session(model.SerializeToString(), device)
        self.names = [o.name for o in ref.get_outputs()]
        self.reference = [runner.run(ref, feeds) for feeds in batches]
        padding = padding or Padding(model)
        self.keep = [
            [padding.keep(feeds, n, r) for n, r in zip(self.names, out)] for feeds, out in zip(batches, self.reference)
        ]
        self.floor = RELATIVE_FLOOR[_target_type(convert_options)]
        self.evaluations = 0
        self.callback = callback
        if callback is not None:
            for out in self.reference:
                if not _says_yes(callback, out, out):
                    raise AutocastError(
                        "the verdict callback returns False for the fp32 model's outputs compared with themselves",
                        "verdict",
                        "make it accept the reference outputs (it gets the reference outputs, then the converted ones)",
                    )

    def convert(self, forced: dict):
        return self._convert(self.model, options=self.plan_options, force_fp32=forced, **self.stages)

    def passes(self, forced: dict) -> tuple[bool, list]:
        ok, failures, _ = self.measure(forced)
        return ok, failures

    def measure(self, forced: dict) -> tuple[bool, list, float]:
        """(targets met, why not, the largest error over the outputs in the verdict's terms:
        metrics.search_error); the plan's precisions are left in `last_precisions`."""
        self.evaluations += 1
        result = self.convert(forced)
        self.last_result = result
        self.last_precisions = list(result.plan.precisions)
        sess = runner.session(emulation_model(result.model).SerializeToString(), "cpu", optimize=False)
        stats = [
            OutputStats(n, relative_floor=self.floor, map_threshold=self.target.for_output(n).map_threshold)
            for n in self.names
        ]
        refused = 0
        for feeds, ref_out, keeps in zip(self.batches, self.reference, self.keep):
            inputs = {i.name: feeds[i.name].astype(_np(i.type)) for i in sess.get_inputs()}
            got = runner.run(sess, inputs)
            if self.callback is not None and not _says_yes(self.callback, ref_out, got):
                refused += 1
            for s, r, o, keep in zip(stats, ref_out, got, keeps):
                o = o.astype(r.dtype) if o.dtype != r.dtype and r.dtype.kind == "f" else o
                s.add(r, o, keep)
        failures = (
            [f"the verdict callback returned False on {refused} of {len(self.batches)} batches"] if refused else []
        )
        for s in stats:
            _, why = verdict(s.summary(), self.target)
            failures += [f"{s.name}: {w}" for w in why]
        error = max((search_error(s, self.target) for s in stats), default=0.0)
        return not failures, failures, error


def judged_by(target: Thresholds, callback) -> list[str]:
    """What decides that a conversion passes: each threshold the target sets (`rtol=0.01`), and
    the caller's verdict callback where there is one."""
    out = [
        f"{alias}={getattr(target, key):g}" for key, alias in TARGET_NAMES.items() if getattr(target, key) is not None
    ]
    return out + (["the verdict callback"] if callback is not None else [])


def _says_yes(callback, reference: list, converted: list) -> bool:
    """The verdict callback's answer on one batch: True or False (numpy's too); anything else,
    or an exception it raises, is refused naming it."""
    try:
        said = callback(list(reference), list(converted))
    except Exception as exc:  # the caller's code: its failure is the caller's to see, in one line
        raise AutocastError(
            f"the verdict callback raised {type(exc).__name__}: {exc}", "verdict", "fix the callback"
        ) from None
    if not isinstance(said, (bool, np.bool_)):
        raise AutocastError(
            f"the verdict callback returned {type(said).__name__}, not True or False",
            "verdict",
            "return a bool (e.g. bool(np.allclose(...)))",
        )
    return bool(said)


def _target_type(convert_options: dict) -> str:
    """ "fp16" or "bf16": the type the search's conversions target (a PlanOptions under "options",
    or a "precision" keyword), for the relative error's floor (metrics.RELATIVE_FLOOR)."""
    planned = convert_options.get("options")
    value = getattr(getattr(planned, "target", None), "value", None) or convert_options.get("precision")
    value = getattr(value, "value", value)
    return value if value in RELATIVE_FLOOR else "fp16"


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
COST_FLOOR_US = 1.0  # per node a band makes fp32: the least a band is priced at (and all, without shapes)


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
    compare_padded: bool = False,
    callback=None,
) -> tuple[dict, dict]:
    """(node id -> Reason for the nodes to keep fp32, a log of the search). `progress(label,
    total)` gives a bar (a terminal); `note(text)` is called once per step (no terminal). The
    outputs are measured as validation measures them: padded positions left out unless
    `compare_padded`, maps judged by IoU when the target sets iou=. `callback(reference,
    converted) -> bool`, the caller's own judgement of one batch (the two lists of output arrays,
    in the model's output order, the converted ones in the converted model's output types), must
    hold too, beside the thresholds that `target` sets (it may set none); the log's `judged_by`
    names both.

    The stages (see the module docstring): check the two ends (nothing kept fp32 may already
    pass; everything kept fp32 must), attribute the error to nodes, rank the candidates, find the
    culprits one by one, and finish with the smallest passing set."""
    padding = Padding(model, compare_padded)
    run = _Search(model, batches, convert_options, target, device, progress, note, padding, callback)
    if run.passes_as_is():
        return run.finish([])
    run.check_reachable()
    run.attribute(model, batches[0])
    budget_hit = run.find_culprits(run.rank())
    return run.finish_search(budget_hit)


class _Search:
    """The state of one --target search: the evaluator, the candidates (the nodes the plain
    conversion makes low precision, in execution order), their scores and regions, the culprits
    found and the smallest passing set seen, the bar and the log."""

    def __init__(
        self, model, batches, convert_options: dict, target: Thresholds, device: str, progress, note, padding, callback
    ):
        self.start = time.perf_counter()
        self.ev = _Evaluator(model, batches, convert_options, target, device, padding, callback)
        self.first = self.ev.convert({})
        self.index = build_index(onnx.ModelProto.FromString(model.SerializeToString()))
        self.low = {p.id for p in self.first.plan.nodes if p.precision in ("fp16", "bf16") and not _forced_low(p)}
        self.order = [n.id for n in global_order(self.index) if n.id in self.low]
        self.labels = {n.id: n.label for n in self.index.nodes}
        self.log: dict[str, Any] = {
            "candidates": len(self.order),
            "evaluations": 0,
            "kept": [],
            "attribution": {},
            "initial_failures": [],
            "passed": True,
            "seconds": 0.0,
            "judged_by": judged_by(target, callback),
        }
        # the search never runs more than this many evaluations (the budget, plus the last check of a
        # culprit and the two checks up front): an honest upper bound for the bar
        bound = MAX_EVALUATIONS + 3
        self.bar = progress(f"--target search (at most {bound} evaluations)", bound) if progress else None
        self.note = note
        self.scores: dict[int, float] = {}
        self.position: dict[int, int] = {}
        self.regions: dict = {}
        self.base_error = 0.0
        self.best: list = list(self.order)  # the smallest passing set seen so far
        self.culprits: list = []
        # the GPU the cost model prices evaluations on, and the plain conversion's estimate (None: no shapes)
        self.gpu = convert_options.get("gpu")
        plain = speed(self.first, self.gpu)
        self.base_ms = plain["converted_ms"] if plain["computed"] else None

    # -- bookkeeping

    def step(self, what: str, ok: bool, failures) -> None:
        """One evaluation done: advance the bar, or note what was tried and how it went."""
        if self.bar:
            self.bar.update(1)
        if self.note:
            why = "" if ok else f": {failures[0]}" if failures else ""
            self.note(f"--target search: evaluation {self.ev.evaluations}: {what} -> {'pass' if ok else 'fail'}{why}")

    def forced(self, ids) -> dict:
        """node id -> the Reason that keeps it fp32, for each of `ids`."""
        scores = self.scores
        return {
            i: Reason(
                "accuracy-search",
                "kept fp32 by the --target search: with it in low precision the targets fail on the given inputs"
                + (f" (attributed error {scores[i]:.3g})" if scores.get(i) else ""),
                value=scores.get(i),
            )
            for i in ids
        }

    def finish(self, kept_ids) -> tuple[dict, dict]:
        """Close the bar and the log; (the forced nodes, the log)."""
        if self.bar:
            self.bar.finish()
        self.log["evaluations"] = self.ev.evaluations
        self.log["seconds"] = round(time.perf_counter() - self.start, 3)
        return self.forced(kept_ids), self.log

    # -- the two ends

    def passes_as_is(self) -> bool:
        """Whether the conversion passes with nothing kept fp32 (then there is nothing to search)."""
        ok, failures = self.ev.passes({})
        self.step("nothing kept fp32", ok, failures)
        self.log["initial_failures"] = failures
        return ok

    def check_reachable(self) -> None:
        """Refuse a target that fails even with every candidate kept fp32: no set can help."""
        ok_all, failures_all = self.ev.passes(self.forced(self.order))
        self.step(f"all {len(self.order)} candidates kept fp32", ok_all, failures_all)
        if ok_all:
            return
        if self.bar:
            self.bar.finish()
        raise AutocastError(
            "the --target cannot be met even with every low-precision node kept fp32: " + "; ".join(failures_all[:3]),
            "--target",
            "loosen the target, or check the inputs (the fp32 model is the reference)",
        )

    # -- ranking

    def attribute(self, model, batch) -> None:
        """Score the candidates by the error they introduce (one diagnosis of the first batch),
        grow each into its region, and measure the output error with nothing kept fp32."""
        self.scores, input_sensitive = _scores(model, self.first.model, batch, self.index, self.low)
        self.position = {i: k for k, i in enumerate(self.order)}
        self.regions = _regions(self.index, self.first.plan, self.low, input_sensitive)
        _, _, self.base_error = self.ev.measure({})

    def rank(self) -> list:
        """The candidates, most promising first. Where along the graph does keeping fp32 pay? Each
        band of consecutive candidates (in execution order) is kept fp32 once, and the drop in
        output error per node ranks the bands; the best band is refined the same way; within a
        band, the nodes are ranked by the error they introduce."""
        bands = _bands(self.order, BANDS)
        gains = [self._band_gain(band, f"band {b + 1}/{len(bands)}") for b, band in enumerate(bands)]
        if max(gains) <= 0:  # no band helps alone (e.g. an overflow that two bands must fix together)
            return self._by_score(self.order)
        ranked_bands = [band for _, band in sorted(zip(gains, bands), key=lambda p: -p[0])]
        return self._refine(ranked_bands[0]) + [i for band in ranked_bands[1:] for i in self._by_score(band)]

    def _band_gain(self, band: list, label: str) -> float:
        """The drop in output error per estimated microsecond on the GPU that keeping the band fp32
        costs (report/speed.py; per node made fp32 where the model has no shapes to price)."""
        ok_b, failures_b, error_b = self.ev.measure(self.forced(band))
        self.step(f"{label} ({len(band)} nodes) kept fp32", ok_b, failures_b)
        # the nodes this makes fp32 (the band and the follow nodes that follow it to fp32)
        made = sum(1 for i in self.order if self.ev.last_precisions[i] in ("fp32", "unchanged"))
        cost = self.cost_us(self.ev.last_result)
        # the estimated microseconds, but never below a floor per node made fp32: on a model small
        # enough that fp32 is faster (the Casts' launches dominate), fp32 everywhere is not the answer
        return _gain(self.base_error, error_b) / max(cost if cost is not None else 0.0, made * COST_FLOOR_US, 1e-9)

    def cost_us(self, result) -> float | None:
        """The estimated microseconds a conversion takes beyond the plain one (None: not priced)."""
        if self.base_ms is None:
            return None
        estimate = speed(result, self.gpu)
        return (estimate["converted_ms"] - self.base_ms) * 1e3 if estimate["computed"] else None

    def _by_score(self, nodes: list) -> list:
        return sorted(nodes, key=lambda i: (-self.scores.get(i, 0.0), self.position[i]))

    def _refine(self, band: list, depth: int = 1) -> list:
        """The band's nodes, the sub-band where keeping fp32 pays most first (recursively)."""
        if len(band) <= 2:
            return self._by_score(band)
        subs = _bands(band, 4)
        gains_sub = [
            self._band_gain(sub, f"band level {depth + 1}, part {k + 1}/{len(subs)}") for k, sub in enumerate(subs)
        ]
        if max(gains_sub) <= 0:  # no part helps alone: attribution decides
            return self._by_score(band)
        ranked_subs = [sub for _, sub in sorted(zip(gains_sub, subs), key=lambda p: -p[0])]
        return self._refine(ranked_subs[0], depth + 1) + [i for sub in ranked_subs[1:] for i in self._by_score(sub)]

    # -- culprits

    def expand(self, ids) -> list:
        """The nodes of the regions of `ids`, in order, each once."""
        out: dict = {}
        for i in ids:
            for j in sorted(self.regions[i], key=self.position.__getitem__):
                out[j] = None
        return list(out)

    def attempt(self, ids: list, what: str) -> bool:
        """Evaluate with `ids` kept fp32; a passing set smaller than the best so far becomes the best."""
        ok, failures = self.ev.passes(self.forced(ids))
        self.step(what, ok, failures)
        if ok and len(ids) < len(self.best):
            self.best = ids
            if self.bar is not None and hasattr(self.bar, "describe"):
                count = f"{len(self.best)} node{'s' if len(self.best) != 1 else ''}"
                self.bar.describe(f"--target search (best so far: {count} kept fp32)")
        return ok

    def find_culprits(self, ranked: list) -> bool:
        """Culprits one at a time, each the shortest prefix of the remaining ranking that passes
        with those already kept (found by doubling, then bisection): with a good ranking a culprit
        sits near the front and costs a few evaluations; each one kept is needed given the
        ranking. Returns whether the evaluation budget ran out first (then the smallest passing set
        seen so far is the answer)."""
        remaining = list(ranked)
        while not self.attempt(self.expand(self.culprits), f"{len(self.culprits)} culprits kept fp32"):
            if self.ev.evaluations >= MAX_EVALUATIONS:
                return True
            found = self._next_culprit(remaining)
            if found is None:
                return True
            self.culprits.append(remaining.pop(found))
        return False

    def _next_culprit(self, remaining: list) -> int | None:
        """The position in `remaining` of the next culprit, or None when the budget ran out."""
        bounds = self._doubling(remaining)
        if bounds is None:
            return None
        lo, hi = bounds
        while hi - lo > 1 and self.ev.evaluations < MAX_EVALUATIONS:
            mid = (lo + hi) // 2
            if self._with_prefix(remaining, mid):
                hi = mid
            else:
                lo = mid
        return hi - 1 if hi - lo <= 1 else None

    def _doubling(self, remaining: list) -> tuple[int, int] | None:
        """(a failing prefix length, a passing one), doubling from one; None when the budget ran out."""
        lo, hi = 0, 1
        while self.ev.evaluations < MAX_EVALUATIONS:
            if self._with_prefix(remaining, hi):
                return lo, hi
            if hi >= len(remaining):
                raise AutocastError("the --target search could not pass", "--target", "this is a bug; please report it")
            lo, hi = hi, min(2 * hi, len(remaining))
        return None

    def _with_prefix(self, remaining: list, count: int) -> bool:
        culprits = self.culprits
        return self.attempt(
            self.expand(culprits + remaining[:count]), f"{len(culprits)} culprits + the next {count} ranked"
        )

    def finish_search(self, budget_hit: bool) -> tuple[dict, dict]:
        """Tidy the answer (the smallest passing set when the budget ran out, else the culprits'
        regions), record it in the log and finish."""
        self.log["budget_reached"] = budget_hit
        kept = _tidy(self.ev, self.best if budget_hit else self.expand(self.culprits), self.index, self.first.plan)
        self.log["kept"] = [self.labels[i] for i in kept]
        self.log["attribution"] = {self.labels[i]: self.scores.get(i, 0.0) for i in kept}
        self.log["trade"] = self._trade(kept)
        return self.finish(kept)

    def _trade(self, kept: list) -> dict | None:
        """What the kept set costs for the targets it meets: the plain conversion's output error (the
        verdict's measure) and the estimated microseconds the set adds on the GPU (a conversion, no
        run: not an evaluation)."""
        if not kept:
            return None
        cost = self.cost_us(self.ev.convert(self.forced(kept)))
        return {"error_before": self.base_error, "cost_us": cost, "gpu": roofline.gpu(self.gpu).key}
