"""The fp32 islands of a plan, each with what keeps it fp32.

An island is a connected region of fp32 nodes (joined by the float tensors between them) in a plan
for a low-precision target. What keeps it fp32 is one or more causes, each of a kind:

    range-measured   calibration measured values beyond the low type (a data rule with headroom)
    range-bound      the graph bounds the values beyond the low type, or proves no bound: a square
                     or other power, a sum over a long axis, an exp, a log of values that can flush,
                     a rotary angle (plan/ranges.py)
    range-constant   a constant beyond the low type, or one that would flush to 0
    model-output     a model output that keeps its type, or the output head that feeds one
    model-input      nothing low feeds it: it reads only model inputs and constants, which keep
                     their types (at fp16 the fast plan lowers such a region where its constants
                     fit and it feeds low nodes: an embedding sum, a mask's Where)
    user-rule        a rule file, selector or plan edit the user wrote
    accuracy-search  the --target search kept it on measured error
    runtime          the runtime has no low-precision kernel for it, or the schema no low type
    quantized        its Q/DQ unit keeps it whole
    arithmetic       the op needs fp32 arithmetic (its category) and the runtime's low-precision
                     kernel would not give it: it computes in the low type or rounds between steps
                     (the kernel table, catalog/compute.py), or the plan counts on no runtime
    precise          the runtime's kernel computes it in fp32, and the plan stores the tensors
                     around it fp32 by choice: --precise, a bf16 target (8 bits of mantissa), or a
                     runtime whose vendor advises fp32 normalizations (TensorRT)

The categories say where a computation needs fp32 arithmetic, the kernel tables where the runtime
gives it anyway; an island is fp32 for its storage (range), for a choice someone made, or for
arithmetic no kernel gives. Nodes fp32 only because fp32 reaches them (follow and clear ops) are
members without a cause of their own. Built on demand from the plan and the graph (nothing here
changes a plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..catalog.compute import computes_in_fp32
from ..dtypes import FLOAT, FLOAT16
from ..graph import GraphIndex
from ..graph.regions import regions
from .ranges import Bounds, judge

KINDS = {
    "range-measured": "values measured beyond the low type",
    "range-bound": "values the graph does not bound within the low type",
    "range-constant": "a constant beyond the low type",
    "model-output": "a model output or its output head",
    "model-input": "nothing low feeds it: it reads only model inputs and constants, which keep their types",
    "user-rule": "a rule, selector or plan edit",
    "accuracy-search": "kept by the --target search",
    "runtime": "no low-precision kernel or schema type",
    "quantized": "its Q/DQ unit",
    "arithmetic": "fp32 arithmetic no low-precision kernel gives",
    "precise": "stored fp32 for precision by choice (--precise; bf16; a runtime that wants fp32 norms)",
}
_BY_CODE = {
    "calibration": "range-measured",
    "data-range": "range-constant",
    "data-flush": "range-constant",
    "output-head": "model-output",
    "node-rule": "user-rule",
    "cli-exclude": "user-rule",
    "plan-edit": "user-rule",
    "plan-replay": "user-rule",
    "accuracy-search": "accuracy-search",
    "no-kernel": "runtime",
    "schema": "runtime",
    "unknown-op": "runtime",
    "unknown-type": "runtime",
    "qdq-unit": "quantized",
    "unchanged": "model-input",
}
SHIPPED_RULES = "rules/default.toml"


@dataclass
class Cause:
    kind: str  # a key of KINDS
    node: str  # the node's label
    text: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "node": self.node, "text": self.text}


@dataclass
class Island:
    number: int
    nodes: list[int]  # node ids, in graph order
    ops: dict[str, int]
    causes: list[Cause] = field(default_factory=list)
    # what its kernels and the Casts at its edges are estimated to take ({"us", "cast_us", "share"}: report/speed.py)
    cost: dict | None = None

    @property
    def kinds(self) -> list[str]:
        return sorted({c.kind for c in self.causes})

    def text(self) -> str:
        """One line: 'island 2 (7 nodes: Pow 1, ReduceMean 1, ...): range-bound: Pow /x: ...'."""
        ops = ", ".join(f"{op} {n}" for op, n in self.ops.items())
        causes = "; ".join(f"{c.kind}: {c.node}: {c.text}" for c in self.causes) or "no cause found"
        return f"island {self.number} ({len(self.nodes)} nodes: {ops}): {causes}"

    def to_dict(self) -> dict:
        return {
            "island": self.number,
            "nodes": len(self.nodes),
            "ops": self.ops,
            "kinds": self.kinds,
            "causes": [c.to_dict() for c in self.causes],
            **({"cost": self.cost} if self.cost is not None else {}),
        }


@dataclass(frozen=True)
class Context:
    """What a plan was made for: the runtime whose kernels it counts on ("any": none), whether the
    fast plan ran, and the low type's TensorProto code."""

    kernels: str
    fast: bool
    low_type: int
    why_not_fast: str = "--precise keeps the tensors around it fp32"


def context_of(kernels: str, fast: bool, low_type: int) -> Context:
    """The Context of a plan made for `kernels` ("any", "cuda", ...) with the fast plan asked
    (`fast`: not --precise, not a training graph) at `low_type`."""
    from .kernel_io import FAST_RUNTIMES

    if not fast:
        return Context(kernels, False, low_type)
    if low_type != FLOAT16:
        return Context(kernels, False, low_type, "at bf16 the plan keeps the tensors around it fp32 (8-bit mantissa)")
    if kernels not in FAST_RUNTIMES:
        return Context(kernels, False, low_type, f"the plan for {kernels} keeps the tensors around it fp32")
    return Context(kernels, True, low_type)


def summary(islands: list) -> dict:
    """{"islands": 6, "nodes": 45, "kinds": {"range-bound": 5, ...}}: how many islands name each kind."""
    kinds: dict[str, int] = {}
    for island in islands:
        for kind in island.kinds:
            kinds[kind] = kinds.get(kind, 0) + 1
    return {"islands": len(islands), "nodes": sum(len(i.nodes) for i in islands), "kinds": dict(sorted(kinds.items()))}


def find(index: GraphIndex, plan, context: Context, shapes: Mapping | None = None) -> list[Island]:
    """The fp32 islands of `plan` (a PrecisionPlan of `index`), in graph order."""
    fp32 = [i for i, p in enumerate(plan.precisions) if str(p) == "fp32"]
    if not fp32:
        return []

    def producers(i: int):  # the fp32 nodes whose float outputs node i reads
        for value in index.nodes[i].inputs:
            if value is not None and value.producer is not None and value.dtype == FLOAT:
                yield value.producer.id

    groups = regions(fp32, producers)
    entries = plan.nodes
    bounds = Bounds(index, shapes)
    islands = []
    for number, ids in enumerate(groups, start=1):
        ops: dict[str, int] = {}
        for i in ids:
            ops[entries[i].op_type] = ops.get(entries[i].op_type, 0) + 1
        island = Island(number, ids, dict(sorted(ops.items())))
        seen = set()
        for i in ids:
            for cause in _causes(index.nodes[i], entries[i], context, bounds, plan):
                if (cause.kind, cause.node) not in seen:
                    seen.add((cause.kind, cause.node))
                    island.causes.append(cause)
        islands.append(island)
    return islands


def _causes(node, entry, context: Context, bounds: Bounds, plan) -> list[Cause]:
    """What keeps one fp32 node fp32 of its own accord (none for a node that fp32 merely reaches)."""
    label = entry.label
    out = []
    for reason in entry.reasons:
        kind = _BY_CODE.get(reason.code)
        if reason.code == "op-category" and reason.source and not reason.source.startswith(SHIPPED_RULES):
            kind = "user-rule"
        if kind is not None:
            out.append(Cause(kind, label, _short(reason.message, reason.source)))
    if _writes_kept_output(node, plan):
        out.append(Cause("model-output", label, "writes a model output that keeps its type"))
    if not out and entry.category == "keep_fp32" and entry.reasons and entry.reasons[-1].code == "op-category":
        cause = _category_cause(node, entry, context, bounds)
        if cause is not None:
            out.append(cause)
    return out


def _category_cause(node, entry, context: Context, bounds: Bounds) -> Cause | None:
    """The cause of a keep_fp32 node its category alone keeps fp32: its range where the runtime's
    kernel would compute it in fp32, else the arithmetic no kernel gives, or the plan's choice of
    precision; None for one the fast plan would run low but for its fp32 neighbours (a member)."""
    label = entry.label
    if context.kernels == "any":
        return Cause("arithmetic", label, "the plan counts on no runtime's kernels (--runtime any)")
    fact = computes_in_fp32(context.kernels, node.domain, node.op, context.low_type)
    if fact is None or not fact.fp32_once:
        said = (
            f"{fact.note} ({fact.source})" if fact is not None else "the kernel table does not say it computes in fp32"
        )
        return Cause("arithmetic", label, f"{context.kernels}'s low-precision {node.op} kernel: {said}")
    verdict = judge(node, bounds, context.low_type)
    if verdict is not None and not verdict.fits:
        return Cause("range-bound", label, f"{verdict.kind}: {verdict.text}")
    if not context.fast:
        return Cause("precise", label, f"the runtime's kernel computes it in fp32, and {context.why_not_fast}")
    return None


def _writes_kept_output(node, plan) -> bool:
    if not plan.keep_io_types:
        return False
    low_io = set(plan.low_precision_io)
    return any(
        v is not None and v.dtype == FLOAT and v.name not in low_io and v.graph_outputs and node.scope.path == "main"
        for v in node.outputs
    )


def _short(message: str, source: str | None) -> str:
    text = message if len(message) <= 200 else message[:197] + "..."
    return f"{text} [{source}]" if source else text
