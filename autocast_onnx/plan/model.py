"""The precision plan: pure data saying, for every node, which precision it computes in and
why. Classification and painting produce it; `rewrite` applies it; reports, `--plan-out`
and later `explain` read it. It round-trips through JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PLAN_VERSION = 1

# Node precisions in a plan. "fp16"/"bf16": computes in the target type; "fp32": computes in
# fp32; "unchanged": keeps the types it had (not a float op, a control-flow node whose bodies
# are planned separately, or a float op that painting left alone).
PRECISIONS = ("fp16", "bf16", "fp32", "unchanged")


@dataclass
class Reason:
    code: str                    # stable identifier of the rule kind, e.g. "op-category"
    message: str
    source: str | None = None    # rule file and line, e.g. "rules/default.toml:84"
    value: float | None = None   # a measured value, e.g. the largest |x| of a constant

    def text(self) -> str:
        out = self.message
        if self.source:
            out += f" [{self.source}]"
        return out


@dataclass(slots=True)
class NodePlan:
    id: int                      # position in the index's node list (stable for one model)
    name: str
    op_type: str
    domain: str
    graph: str                   # "main" or the path of the subgraph
    category: str                # low_precision, follow, keep_fp32, clear, non_float, control_flow
    precision: str               # one of PRECISIONS
    reasons: list[Reason] = field(default_factory=list)
    fp32_inputs: list[int] = field(default_factory=list)    # pinned ports
    fp32_outputs: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or f"<{self.op_type} #{self.id}>"


@dataclass
class Warning_:
    code: str
    message: str
    node: str | None = None


class PrecisionPlan:
    """node -> precision + reasons, for one model. `precisions` and `categories` are compact
    per-node lists (by node id); `nodes` holds the full entries and may be built on first use."""

    def __init__(self, target: str, keep_io_types: bool, nodes: list[NodePlan] | None,
                 rule_files=(), warnings=(), clamp_initializers=None):
        self.target = target                  # "fp16" or "bf16"
        self.keep_io_types = keep_io_types
        self._nodes = nodes
        self._build = None
        self.rule_files = list(rule_files)
        self.warnings: list[Warning_] = list(warnings)
        self.clamp_initializers: dict[str, str] = dict(clamp_initializers or {})  # name -> why (user forced)
        self.precisions = [n.precision for n in nodes] if nodes is not None else []
        self.categories = [n.category for n in nodes] if nodes is not None else []

    def set_lazy_nodes(self, build, precisions, categories) -> None:
        self._nodes, self._build = None, build
        self.precisions, self.categories = precisions, categories

    @property
    def nodes(self) -> list[NodePlan]:
        if self._nodes is None:
            self._nodes = self._build() if self._build is not None else []
        return self._nodes

    def __eq__(self, other) -> bool:
        return isinstance(other, PrecisionPlan) and self.to_dict() == other.to_dict()

    def counts(self) -> dict[str, int]:
        out = {p: 0 for p in PRECISIONS}
        for precision in self.precisions:
            out[precision] += 1
        return out

    def by_name(self, name: str) -> list[NodePlan]:
        return [n for n in self.nodes if n.name == name]

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "target": self.target,
            "keep_io_types": self.keep_io_types,
            "rule_files": self.rule_files,
            "summary": self.counts(),
            "warnings": [asdict(w) for w in self.warnings],
            "clamp_initializers": self.clamp_initializers,
            "nodes": [
                {k: v for k, v in asdict(n).items() if not (k in ("fp32_inputs", "fp32_outputs") and not v)}
                for n in self.nodes
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "PrecisionPlan":
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"unsupported plan version {data.get('version')!r}")
        nodes = []
        for n in data["nodes"]:
            n = dict(n)
            n["reasons"] = [Reason(**r) for r in n.get("reasons", [])]
            nodes.append(NodePlan(**n))
        return cls(target=data["target"], keep_io_types=data["keep_io_types"], nodes=nodes,
                   rule_files=list(data.get("rule_files", [])),
                   warnings=[Warning_(**w) for w in data.get("warnings", [])],
                   clamp_initializers=dict(data.get("clamp_initializers", {})))

    @classmethod
    def from_json(cls, text: str) -> "PrecisionPlan":
        return cls.from_dict(json.loads(text))

    def save(self, path: str | Path) -> None:
        from ..io import write_text_atomic

        write_text_atomic(Path(path), self.to_json() + "\n")
