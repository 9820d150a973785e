"""Stage: accuracy recovery. Finds a small set of nodes to keep in fp32 so that the converted
model meets accuracy targets on the given inputs.

The reference outputs are computed once. Each evaluation converts the model with a set S of
nodes forced to fp32, runs it (emulated on CPU), and checks the targets. With every
low-precision node forced fp32 the targets must hold (else no set can help). Then, while the
targets fail with S, a binary search over the remaining candidates in topological order finds
the shortest prefix P with which S + P passes; the last node of P is a culprit and joins S.
Each culprit costs O(log n) evaluations, so k culprits cost O(k log n). Candidates include the
nodes of If/Loop/Scan bodies, in the order they run.
"""

from __future__ import annotations

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
        self.evaluations += 1
        result = self.convert(forced)
        sess = runner.session(emulation_model(result.model).SerializeToString(), "cpu", optimize=False)
        stats = [OutputStats(n) for n in self.names]
        for feeds, ref_out in zip(self.batches, self.reference):
            inputs = {i.name: feeds[i.name].astype(_np(i.type)) for i in sess.get_inputs()}
            for s, r, o in zip(stats, ref_out, runner.run(sess, inputs)):
                s.add(r, o.astype(r.dtype) if o.dtype != r.dtype and r.dtype.kind == "f" else o)
        failures = []
        for s in stats:
            _, why = verdict(s.summary(), self.target)
            failures += [f"{s.name}: {w}" for w in why]
        return not failures, failures


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


def search(
    model: onnx.ModelProto, batches, convert_options: dict, target: Thresholds, device: str = "cpu", progress=None
) -> tuple[dict, dict]:
    """(node id -> Reason for the nodes to keep fp32, a log of the search)."""
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
        "initial_failures": [],
        "passed": True,
    }
    ok, failures = ev.passes({})
    log["initial_failures"] = failures
    if ok:
        log["evaluations"] = ev.evaluations
        return {}, log

    def forced(ids):
        return {
            i: Reason(
                "accuracy-search",
                "kept fp32 by the --target search: with it in low precision the targets fail on the given inputs",
            )
            for i in ids
        }

    ok_all, failures_all = ev.passes(forced(order))
    if not ok_all:
        raise AutocastError(
            "the --target cannot be met even with every low-precision node kept fp32: " + "; ".join(failures_all[:3]),
            "--target",
            "loosen the target, or check the inputs (the fp32 model is the reference)",
        )
    kept: list[int] = []
    remaining = list(order)
    bar = progress("searching", len(order)) if progress else None
    while True:
        ok, _ = ev.passes(forced(kept))
        if ok:
            break
        lo, hi = 1, len(remaining)  # S + remaining[:hi] passes; find the smallest such prefix
        while lo < hi:
            mid = (lo + hi) // 2
            if ev.passes(forced(kept + remaining[:mid]))[0]:
                hi = mid
            else:
                lo = mid + 1
        culprit = remaining.pop(lo - 1)
        kept.append(culprit)
        log["kept"].append(labels[culprit])
        if bar:
            bar.update(1)
    if bar:
        bar.finish()
    log["evaluations"] = ev.evaluations
    return forced(kept), log
