"""Stage: validate. The frontier of a plan's fp32 islands: what each costs on the GPU and the error it
buys, cheapest first, so that a user sees what the precise plan costs and what it gains.

For each island of the conversion (plan/islands.py) the cost model (report/speed.py) gives what its
kernels and the Casts at its edges take; the error it buys is measured: the model converted again
with the island's nodes forced low (--include-node on their exact names), run with fp16 numerics
emulated on the inputs validation generates, against the conversion as planned. An island with an
unnamed node cannot be selected by name and is listed unmeasured."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..report.speed import island_costs


@dataclass
class FrontierRow:
    island: int
    nodes: int
    kinds: list
    cost_us: float | None  # estimated: its kernels and Casts on the GPU
    error_kept: float  # the conversion's error (the largest relative error over the outputs)
    error_low: float | None  # the error with the island's nodes low (None: not measured)
    why_unmeasured: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def frontier(model, result, options, gpu: str | None = None, batches: int = 1) -> list[FrontierRow]:
    """The islands of `result` (a ConversionResult of `model`, a path, made with the PlanOptions
    `options`) from cheapest to dearest on `gpu`, each with the error it buys."""
    from ..pipeline import convert
    from .api import validate

    def error(converted) -> float:
        report = validate(model, converted, numerics="emulate", device="cpu", speed=False, batches=batches)
        return max((o.relative_error for o in report.outputs), default=0.0)

    costs = island_costs(result, gpu)
    kept = error(result.model)
    entries = result.plan.nodes
    rows = []
    for island in result.plan.islands:
        names = [entries[i].name for i in island.nodes]
        cost = costs.get(island.number, {}).get("us")
        row = FrontierRow(island.number, len(island.nodes), island.kinds, cost, kept, None)
        if not all(names):
            row.why_unmeasured = "a node without a name cannot be forced low by name"
        else:
            include = (*options.include_nodes, *(f"^{re.escape(n)}$" for n in names))
            low = convert(model, check="none", options=replace(options, include_nodes=include))
            row.error_low = error(low.model)
        rows.append(row)
    return sorted(rows, key=lambda r: (r.cost_us is None, r.cost_us or 0.0))


def frontier_text(rows: list[FrontierRow], gpu: str) -> str:
    """The frontier as `explain --islands --frontier` prints it."""
    if not rows:
        return "no fp32 islands: nothing to trade"
    lines = [f"frontier of the {len(rows)} fp32 island(s), cheapest first (estimated on {gpu}; errors emulated):"]
    for r in rows:
        cost = f"{r.cost_us:.1f} us" if r.cost_us is not None else "cost not estimated"
        if r.error_low is None:
            buys = f"error not measured ({r.why_unmeasured})"
        else:
            buys = f"keeps the error at {r.error_kept:.3g} where running it low gives {r.error_low:.3g}"
        lines.append(f"  island {r.island} ({r.nodes} nodes; {', '.join(r.kinds)}): costs {cost}; {buys}")
    return "\n".join(lines)
