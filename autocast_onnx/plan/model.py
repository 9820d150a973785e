"""The precision plan: pure data saying, for every node, which precision it computes in, why,
and what each of its ports does with that precision. Classification and painting produce it;
`rewrite.apply_plan(index, plan)` applies it and needs nothing else; reports, `--plan-out`,
`explain` and `convert --plan` read it. It round-trips through JSON, and a plan written to a
file carries the fingerprint of the model it belongs to, so an edited plan can be replayed
on that model and refused on any other.

Plan JSON, version 2 (see docs/architecture.md):

    {"version": 2, "target": "fp16", "keep_io_types": true, "model_fingerprint": "...",
     "vocabulary": {...legend of the codes...}, "rule_files": [...], "summary": {...},
     "warnings": [...], "clamp_initializers": {...},
     "nodes": [{"id": 0, "name": "...", "op_type": "MatMul", "domain": "", "graph": "main",
                "category": "low_precision", "precision": "fp16", "roles_in": "pp", "roles_out": "p",
                "reasons": [...]}, ...]}

Of a node entry, replay reads `precision` (which a user may edit) and checks `id`, `name`,
`op_type`, `graph`, `roles_in` and `roles_out` against the model; the rest documents the plan.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .vocab import Category, Paint, PortRole, Precision, Seed

PLAN_VERSION = 2

# Node precisions in a plan, in report order.
PRECISIONS = tuple(p.value for p in Precision)


@dataclass
class Reason:
    code: str  # stable identifier of the rule kind, e.g. "op-category"
    message: str
    source: str | None = None  # rule file and line, e.g. "rules/default.toml:84"
    value: float | None = None  # a measured value, e.g. the largest |x| of a constant

    def text(self) -> str:
        out = self.message
        if self.source:
            out += f" [{self.source}]"
        return out


@dataclass(slots=True)
class NodePlan:
    id: int  # position in the index's node list (stable for one model)
    name: str
    op_type: str
    domain: str
    graph: str  # "main" or the path of the subgraph
    category: str  # Category.rule_name: low_precision, follow, keep_fp32, ...
    precision: str  # a Precision value
    reasons: list[Reason] = field(default_factory=list)
    roles_in: str = ""  # PortRole code per input port
    roles_out: str = ""  # PortRole code per output port
    fp32_inputs: list[int] = field(default_factory=list)  # ports pinned by a rule file
    fp32_outputs: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or f"<{self.op_type} #{self.id}>"

    def explain(self) -> str:
        """Which precision this node gets and why, as `autocast-onnx explain` prints it."""
        graph = "" if self.graph == "main" else f" in {self.graph}"
        lines = [
            f"{self.label} ({self.domain + ':' if self.domain else ''}{self.op_type}){graph}, node #{self.id}",
            f"  category: {self.category}",
            f"  precision: {self.precision}",
        ]
        if self.fp32_inputs or self.fp32_outputs:
            lines.append(f"  pinned fp32 ports: inputs {self.fp32_inputs}, outputs {self.fp32_outputs}")
        lines.append("  because:")
        for reason in self.reasons:
            value = "" if reason.value is None else f" (measured {reason.value:.4g})"
            lines.append(
                f"    - [{reason.code}] {reason.message}{value}" + (f"  ({reason.source})" if reason.source else "")
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        why = f": {self.reasons[-1].code}" if self.reasons else ""
        return f"<NodePlan #{self.id} {self.label} ({self.op_type}) {self.precision}{why}>"


@dataclass
class PlanWarning:
    """Something the user should know about the plan (an unknown op, a flushing constant)."""

    code: str
    message: str
    node: str | None = None


REGEX_CHARS = re.compile(r"[.*+?\[\](){}|^$\\]")


def looks_like_regex(text: str) -> bool:
    """Whether a node selector is meant as a pattern: it holds regex characters (. * [ ^ ...)."""
    return REGEX_CHARS.search(text) is not None


def vocabulary() -> dict:
    """The legend of the codes a plan file uses, written into it so the file explains itself:
    each code with its member's description (plan/vocab.py). Replay does not read it."""
    return {
        "precision": {p.value: p.description for p in Precision},
        "roles": {r.value: r.description for r in PortRole},
        "categories": {c.rule_name: c.description for c in Category},
    }


class PrecisionPlan:
    """node -> precision + port roles + reasons, for one model. `precisions`, `categories`,
    `roles_in` and `roles_out` are compact per-node lists (by node id), which is all the rewrite
    reads; `nodes` holds the full entries and may be built on first use."""

    def __init__(
        self,
        target: Precision | str,
        keep_io_types: bool,
        nodes: list[NodePlan] | None,
        rule_files=(),
        warnings=(),
        clamp_initializers=None,
        fingerprint: str | None = None,
        low_precision_io=(),
    ):
        self.target = Precision.target(target)
        self.keep_io_types = keep_io_types
        # model inputs and outputs (names) given the target type (--low-precision-io)
        self.low_precision_io: list[str] = list(low_precision_io)
        self._nodes = nodes
        self._build: Callable[[], list[NodePlan]] | None = None
        self._fingerprint = fingerprint
        self._fingerprint_of: Callable[[], str] | None = None
        self._codes_of: Callable[[], list] | None = None
        self.rule_files = list(rule_files)
        self.warnings: list[PlanWarning] = list(warnings)
        self.clamp_initializers: dict[str, str] = dict(clamp_initializers or {})  # name -> why (user forced)
        self.source: str | None = None  # the file a replayed plan was read from
        self.training: dict | None = None  # the training graph and its loss scaling (None: inference)
        self.search: dict | None = None  # the --target search that chose forced nodes (its log)
        nodes = nodes or []
        self.precisions: list = [Precision(n.precision) for n in nodes]
        self.categories: list[str] = [n.category for n in nodes]
        self.roles_in: list[str] = [n.roles_in for n in nodes]
        self.roles_out: list[str] = [n.roles_out for n in nodes]

    def set_lazy_nodes(self, build, precisions, categories, roles_in, roles_out, fingerprint_of, codes_of=None) -> None:
        """Painting's fast path: the compact lists now, node entries and fingerprint on demand."""
        self._nodes, self._build, self._codes_of = None, build, codes_of
        self.precisions, self.categories = precisions, categories
        self.roles_in, self.roles_out = roles_in, roles_out
        self._fingerprint_of = fingerprint_of

    def last_reason_codes(self) -> list[str | None]:
        """Per node, the code of the reason that decided its precision (the last of its reasons),
        without building the node entries when they are not built yet."""
        if self._nodes is None and self._codes_of is not None:
            return self._codes_of()
        return [n.reasons[-1].code if n.reasons else None for n in self.nodes]

    @property
    def nodes(self) -> list[NodePlan]:
        if self._nodes is None:
            self._nodes = self._build() if self._build is not None else []
        return self._nodes

    @property
    def fingerprint(self) -> str | None:
        """The digest of the model this plan belongs to (see paint.index_fingerprint)."""
        if self._fingerprint is None and self._fingerprint_of is not None:
            self._fingerprint = self._fingerprint_of()
        return self._fingerprint

    def __eq__(self, other) -> bool:
        return isinstance(other, PrecisionPlan) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        counts = ", ".join(f"{p} {n}" for p, n in self.counts().items() if n)
        return f"PrecisionPlan({self.target}, {len(self.nodes)} nodes: {counts}; {len(self.warnings)} warning(s))"

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(PRECISIONS, 0)
        out.update(Counter(self.precisions))
        return out

    def by_name(self, name: str) -> list[NodePlan]:
        return [n for n in self.nodes if n.name == name]

    def find(self, node: str | None = None, op: str | None = None) -> list[NodePlan]:
        r"""The entries `explain` shows: of op type `op` (OpType or domain:OpType) when given, then
        those `node` names - an exact name, "#ID", or a regex (re.search) when it has regex
        characters and names no node exactly. Raises re.error for a bad regex, AutocastError for
        one that takes too long on a name (matching is time-bounded: autocast_onnx/patterns.py).

            find("/Where") -> the node named /Where;  find(r"layer\.1/.*Softmax");  find(op="Softmax")"""
        entries = self.nodes
        if op is not None:
            domain, _, op_type = op.rpartition(":")
            entries = [e for e in entries if e.op_type == op_type and (not domain or e.domain == domain)]
        if node is None:
            return entries
        if node.startswith("#") and node[1:].isdigit():
            return [e for e in entries if e.id == int(node[1:])]
        exact = [e for e in entries if e.name == node]
        if exact or not looks_like_regex(node):
            return exact
        from ..patterns import UserPattern

        pattern = UserPattern(node, "explain NODE")
        return [e for e in entries if e.name and pattern.search(e.name)]

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "target": self.target.value,
            "keep_io_types": self.keep_io_types,
            **({"low_precision_io": self.low_precision_io} if self.low_precision_io else {}),
            "model_fingerprint": self.fingerprint,
            "vocabulary": vocabulary(),
            "rule_files": self.rule_files,
            "summary": self.counts(),
            "warnings": [asdict(w) for w in self.warnings],
            "clamp_initializers": self.clamp_initializers,
            **({"training": self.training} if self.training is not None else {}),
            **({"search": self.search} if self.search is not None else {}),
            "nodes": [
                {k: v for k, v in asdict(n).items() if not (k in ("fp32_inputs", "fp32_outputs") and not v)}
                for n in self.nodes
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict, where: str = "<plan>") -> PrecisionPlan:
        """A plan from its JSON form. Raises AutocastError, naming `where` and the entry, for
        anything that is not a well-formed plan of this version."""
        from .replay import plan_from_dict

        return plan_from_dict(data, where)

    @classmethod
    def from_json(cls, text: str, where: str = "<plan>") -> PrecisionPlan:
        from ..errors import AutocastError

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise AutocastError(
                f"not a plan file (invalid JSON: {exc})", where, "pass a file written by convert --plan-out"
            ) from None
        except RecursionError:
            raise AutocastError(
                "not a plan file (its JSON is nested too deeply to read)",
                where,
                "pass a file written by convert --plan-out",
            ) from None
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path) -> PrecisionPlan:
        from ..errors import AutocastError

        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise AutocastError("plan file not found", str(path), "check the --plan path") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise AutocastError(
                f"cannot read plan file: {exc}", str(path), "pass a file written by --plan-out"
            ) from None
        plan = cls.from_json(text, str(path))
        plan.source = str(path)
        return plan

    def save(self, path: str | Path) -> None:
        from ..io import write_text_atomic

        write_text_atomic(Path(path), self.to_json() + "\n")


__all__ = [
    "PLAN_VERSION",
    "PRECISIONS",
    "NodePlan",
    "Paint",
    "PlanWarning",
    "PrecisionPlan",
    "Reason",
    "Seed",
    "vocabulary",
]
