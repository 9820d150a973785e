"""The precision plan: pure data saying, for every node, which precision it computes in, why,
and what each of its ports does with that precision. Classification and painting produce it;
`rewrite.apply_plan(index, plan)` applies it and needs nothing else; reports, `--plan-out`,
`explain` and `convert --plan` read it. It round-trips through JSON, and a plan written to a
file carries the fingerprint of the model it belongs to, so an edited plan can be replayed
on that model and refused on any other.

Plan JSON, version 2 (see docs/architecture.md):

    {"version": 2, "target": "fp16", "keep_io_types": true, "model_fingerprint": "...",
     "vocabulary": {...legend of the codes...}, "rule_files": [...], "summary": {...},
     "warnings": [...], "clamp_initializers": {...}, "opset": {"from": 17, "to": 22} (with --opset),
     "nodes": [{"id": 0, "name": "...", "op_type": "MatMul", "domain": "", "graph": "main",
                "category": "low_precision", "precision": "fp16", "planned": "fp16",
                "roles_in": "pp", "roles_out": "p", "reasons": [...]}, ...]}

Of a node entry, replay reads `precision` (which a user may edit) and checks `id`, `name`,
`op_type`, `graph`, `roles_in` and `roles_out` against the model; the rest documents the plan.
`planned` is the precision planning gave when the file was written: a node whose `precision`
differs from it is an edited one, which replay marks (reason `plan-edit`) while every other node
keeps the reasons the file gives it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeAlias

from ..errors import AutocastError, printable_lines
from ..runtimes import RUNTIME_CHOICES as KERNELS
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
    # the precision planning gave, when this entry was read from a plan file (None: this plan's own
    # planning, or a file written before plans recorded it)
    planned: str | None = None

    @property
    def edited(self) -> bool:
        """Whether the plan file edits this node: its precision differs from the one planning gave."""
        return self.planned is not None and self.planned != self.precision

    @property
    def label(self) -> str:
        return self.name or f"<{self.op_type} #{self.id}>"

    def explain(self) -> str:
        """Which precision this node gets and why, as `autocast-onnx explain` prints it."""
        graph = "" if self.graph == "main" else f" in {self.graph}"
        lines = [
            f"{self.label} ({self.domain + ':' if self.domain else ''}{self.op_type}){graph}, node #{self.id}",
            f"  category: {self.category}",
            f"  precision: {self.precision}"
            + (f" (edited in the plan; planning gave {self.planned})" if self.edited else ""),
        ]
        if self.fp32_inputs or self.fp32_outputs:
            lines.append(f"  pinned fp32 ports: inputs {self.fp32_inputs}, outputs {self.fp32_outputs}")
        lines.append("  because:")
        for reason in self.reasons:
            value = "" if reason.value is None else f" (measured {reason.value:.4g})"
            lines.append(
                f"    - [{reason.code}] {reason.message}{value}" + (f"  ({reason.source})" if reason.source else "")
            )
        return printable_lines(lines)

    def __repr__(self) -> str:
        why = f": {self.reasons[-1].code}" if self.reasons else ""
        return f"<NodePlan #{self.id} {self.label} ({self.op_type}) {self.precision}{why}>"


# Warning codes that need no action, which the summaries count in one line (the plan file and -v
# list each): a constant a few of whose values flush, converted as the data rules allow (under
# max_flush_fraction, or a small constant not all of whose values flush; plan/paint.py)
NOTE_CODES = frozenset({"flush-note"})


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
        mask_sentinels=None,
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
        self._islands: list | None = None
        self._islands_of: Callable[[], list] | None = None
        self.rule_files = list(rule_files)
        # the sha256 of each rule file's bytes, in the order of rule_files, when the plan was made
        # (empty: not known, a plan file written before they were recorded); the converted model's
        # provenance record names them (rewrite/provenance.py)
        self.rule_sha256: list[str] = []
        self.warnings: list[PlanWarning] = list(warnings)
        self.clamp_initializers: dict[str, str] = dict(clamp_initializers or {})  # name -> why (user forced)
        # attention-mask constants whose values beyond the target's range take a sentinel (plan/masks.py):
        # name -> that value
        self.mask_sentinels: dict[str, float] = dict(mask_sentinels or {})
        self.source: str | None = None  # the file a replayed plan was read from
        self.replayed = False  # applied as given (convert --plan, explain --plan): see plan/replay.py
        self.training: dict | None = None  # the training graph and its loss scaling (None: inference)
        self.search: dict | None = None  # the --target search that chose forced nodes (its log)
        # the opset upgrade made before planning (--opset): {"from": 11, "to": 15}; None: none
        self.opset: dict | None = None
        self.runtime: str | None = None  # the runtime planned for (--runtime cuda, tensorrt, dml); None: any
        # the runtime whose kernels the plan counts on (paint pass 6, plan/kernel_io.py): --runtime's, "cuda"
        # without one (the design's), "any" for none (and for a plan file written before plans recorded it)
        self.kernels: str = "any"
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

    def set_islands(self, find: Callable[[], list]) -> None:
        """How to find the plan's fp32 islands (plan/islands.py), run on the first read of `islands`."""
        self._islands, self._islands_of = None, find

    @property
    def islands(self) -> list:
        """The fp32 islands (plan/islands.Island), each with what keeps it fp32; empty for a plan
        read from a file or made without the graph at hand."""
        if self._islands is None:
            self._islands = self._islands_of() if self._islands_of is not None else []
        return self._islands

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
            **({"rule_sha256": self.rule_sha256} if self.rule_sha256 else {}),
            "summary": self.counts(),
            "warnings": [asdict(w) for w in self.warnings],
            "clamp_initializers": self.clamp_initializers,
            **({"mask_sentinels": self.mask_sentinels} if self.mask_sentinels else {}),
            "kernels": self.kernels,
            **({"training": self.training} if self.training is not None else {}),
            **({"search": self.search} if self.search is not None else {}),
            **({"opset": self.opset} if self.opset is not None else {}),
            "nodes": [_node_dict(n) for n in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict, where: str = "<plan>") -> PrecisionPlan:
        """A plan from its JSON form. Raises AutocastError, naming `where` and the entry, for
        anything that is not a well-formed plan of this version."""
        return plan_from_dict(data, where)

    @classmethod
    def from_json(cls, text: str, where: str = "<plan>") -> PrecisionPlan:
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


def _node_dict(node: NodePlan) -> dict:
    """A node entry of the plan file: its fields, `planned` beside `precision` (the precision
    planning gave: this plan's own, or the one a replayed file recorded), empty pin lists left out."""
    out = {}
    for key, value in asdict(node).items():
        if key == "planned" or (key in ("fp32_inputs", "fp32_outputs") and not value):
            continue
        out[key] = value
        if key == "precision":
            out["planned"] = node.planned or node.precision
    return out


__all__ = [
    "NOTE_CODES",
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


_HINT = 'write a fresh plan with convert --plan-out and edit only the nodes\' "precision"'
_ROLE_CODES = "".join(r.value for r in PortRole)
_CATEGORIES = {c.rule_name for c in Category}
_TRAINING_KINDS = ("ort-training", "onnx-training", "loss")


# ---- the plan file's schema: every field's type, checked in one place ---------------------------


@dataclass(frozen=True)
class _Scalar:
    what: str  # "a string", as the message says it
    test: Callable[[object], bool]


@dataclass(frozen=True)
class _Nullable:
    inner: _Spec

    @property
    def what(self) -> str:
        return f"{self.inner.what} or null"


@dataclass(frozen=True)
class _List:
    item: _Spec
    what: str


@dataclass(frozen=True)
class _Map:
    """An object whose keys are names (initializers, precisions) and whose values are alike."""

    value: _Spec
    what: str


@dataclass(frozen=True)
class _Object:
    """An object with these keys and no others; `required` ones must be present."""

    fields: dict
    required: tuple[str, ...] = ()
    what: str = "an object"


_Spec: TypeAlias = _Scalar | _Nullable | _List | _Map | _Object

_STR = _Scalar("a string", lambda v: isinstance(v, str))
_INT = _Scalar("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
_PORT = _Scalar("a port number (an integer >= 0)", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_BOOL = _Scalar("true or false", lambda v: isinstance(v, bool))
_NUMBER = _Scalar("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
_NAMES = _List(_STR, "a list of strings")
_ANY_OBJECT = _Map(_Scalar("any JSON value", lambda v: True), "an object")

_REASON = _Object(
    {"code": _STR, "message": _STR, "source": _Nullable(_STR), "value": _Nullable(_NUMBER)}, ("code", "message")
)
_NODE = _Object(
    {
        "id": _INT,
        "name": _STR,
        "op_type": _STR,
        "domain": _STR,
        "graph": _STR,
        "category": _STR,
        "precision": _STR,
        "planned": _STR,
        "reasons": _List(_REASON, "a list of reasons (objects)"),
        "roles_in": _STR,
        "roles_out": _STR,
        "fp32_inputs": _List(_PORT, "a list of port numbers"),
        "fp32_outputs": _List(_PORT, "a list of port numbers"),
    },
    ("id", "name", "op_type", "domain", "graph", "category", "precision", "roles_in", "roles_out"),
)
_LOSS_SCALING = _Object(
    {"mode": _STR, "input": _Nullable(_STR), "output": _Nullable(_STR), "gradients": _INT}, ("mode",)
)
_TRAINING = _Object(
    {"kind": _STR, "graph": _STR, "losses": _NAMES, "parameters": _NAMES, "loss_scaling": _LOSS_SCALING},
    ("kind", "graph", "losses", "parameters", "loss_scaling"),
)
_PLAN = _Object(
    {
        "version": _INT,
        "target": _STR,
        "keep_io_types": _BOOL,
        "low_precision_io": _NAMES,
        "model_fingerprint": _STR,
        "vocabulary": _Map(_Map(_STR, "an object of strings"), "an object"),
        "rule_files": _NAMES,
        "rule_sha256": _NAMES,
        "summary": _Map(_INT, "an object of counts"),
        "warnings": _List(
            _Object({"code": _STR, "message": _STR, "node": _Nullable(_STR)}, ("code", "message")),
            "a list of warnings (objects)",
        ),
        "clamp_initializers": _Map(_STR, "an object (initializer name -> why)"),
        "kernels": _STR,
        "mask_sentinels": _Map(_NUMBER, "an object (constant name -> the value its beyond-range entries take)"),
        "training": _Nullable(_TRAINING),
        "search": _Nullable(_ANY_OBJECT),
        "opset": _Nullable(_Object({"from": _INT, "to": _INT}, ("from", "to"))),
        "nodes": _List(_NODE, "a list of node entries"),
    },
    ("version", "target", "keep_io_types", "model_fingerprint", "nodes"),
)


class _Malformed(Exception):
    """A plan value that does not fit the schema: where it is (a key path) and what is wrong."""

    def __init__(self, path: tuple, what: str):
        super().__init__(what)
        self.path, self.what = path, what


def _check_schema(spec: _Spec, value, path: tuple) -> None:
    """Raise _Malformed for the first value under `path` that does not fit `spec`. Recursion
    follows the schema, not the data, so no nesting in the file can run it deep."""
    if isinstance(spec, _Nullable):
        if value is not None:
            _check_schema(spec.inner, value, path)
        return
    if isinstance(spec, _Scalar):
        if not spec.test(value):
            raise _Malformed(path, f"expected {spec.what}, got {_shown(value)}")
        return
    if isinstance(spec, _List):
        if not isinstance(value, list):
            raise _Malformed(path, f"expected {spec.what}, got {_shown(value)}")
        for k, item in enumerate(value):
            _check_schema(spec.item, item, (*path, k))
        return
    if not isinstance(value, dict):
        raise _Malformed(path, f"expected {spec.what}, got {_shown(value)}")
    if isinstance(spec, _Map):
        for key, item in value.items():
            if not isinstance(key, str):  # only from Python: JSON keys are strings
                raise _Malformed(path, f"key {key!r} is not a string")
            _check_schema(spec.value, item, (*path, key))
        return
    for key in spec.required:
        if key not in value:
            raise _Malformed(path, f'"{key}" is missing')
    for key, item in value.items():
        field_spec = spec.fields.get(key)
        if field_spec is None:
            raise _Malformed(path, f"unknown key {key!r} (a plan has the keys --plan-out writes, no others)")
        _check_schema(field_spec, item, (*path, key))


def _shown(value) -> str:
    """A value as an error message repeats it: JSON's words for scalars, a clipped repr for text
    (quoted, so a newline in it cannot split the line), the kind of a container."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        try:
            text = repr(value)
        except ValueError:  # an int too long to print (Python's digit limit)
            return "a number too long to print"
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    return "a list" if isinstance(value, list) else "an object"


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _path_text(path: tuple) -> str:
    """A key path as messages show it: nodes[3].reasons[0].source, clamp_initializers['w\\n1']."""
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
            out += f".{key}" if out else key
        else:
            out += f"[{key!r}]"
    return out


def _located(data, path: tuple) -> str:
    """Where in the plan: the quoted key path, and the node's name for a path inside a node entry."""
    text = f'"{_path_text(path)}"' if path else "the plan"
    if len(path) >= 2 and path[0] == "nodes" and isinstance(path[1], int):
        entry = data["nodes"][path[1]]
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]:
            text += f" (node {entry['name']!r})"
    return text


def _op(op_type: str) -> str:
    """An op type as messages show it: bare when it is a plain name, quoted otherwise."""
    return op_type if re.fullmatch(r"[A-Za-z0-9_.:]+", op_type) else repr(op_type)


# ---- reading a plan ------------------------------------------------------------------------------


def plan_from_dict(data, where: str) -> PrecisionPlan:
    """Parse the JSON form of a plan, refusing anything malformed with its key path named: first
    the version, then every field's type (`_PLAN`), then what the types cannot say (codes,
    node order, loss scaling)."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise AutocastError('not a plan file (no "nodes")', where, "pass a file written by convert --plan-out")
    version = data.get("version")
    if version != PLAN_VERSION or isinstance(version, bool):
        raise AutocastError(
            f"plan version {_shown(version)} is not supported (this autocast-onnx reads version {PLAN_VERSION})",
            where,
            "re-create the plan with convert --plan-out",
        )
    try:
        _check_schema(_PLAN, data, ())
    except _Malformed as bad:
        where_in_plan = _located(data, bad.path)
        what = f"{where_in_plan}: {bad.what}" if bad.path else bad.what
        raise AutocastError(what, where, _HINT) from None
    try:
        target = Precision.target(data["target"])
    except ValueError:
        raise AutocastError(f'"target" must be fp16 or bf16, not {data["target"]!r}', where, _HINT) from None
    if not data["model_fingerprint"]:
        raise AutocastError('the plan has no "model_fingerprint"', where, _HINT)
    nodes = [_node_entry(k, entry, where) for k, entry in enumerate(data["nodes"])]
    training = data.get("training")
    if training is not None:
        _check_training(training, where)
    plan = PrecisionPlan(
        target=target,
        keep_io_types=data["keep_io_types"],
        nodes=nodes,
        rule_files=data.get("rule_files", []),
        warnings=[PlanWarning(**w) for w in data.get("warnings", [])],
        clamp_initializers=data.get("clamp_initializers", {}),
        fingerprint=data["model_fingerprint"],
        low_precision_io=data.get("low_precision_io", []),
        mask_sentinels=_checked_sentinels(data.get("mask_sentinels", {}), target, where),
    )
    plan.training = training
    plan.kernels = _checked_kernels(data.get("kernels", "any"), where)
    plan.opset = _checked_opset(data.get("opset"), where)
    plan.rule_sha256 = _checked_digests(data.get("rule_sha256", []), plan.rule_files, where)
    return plan


def _checked_kernels(kernels: str, where: str) -> str:
    """The plan's "kernels": one of KERNELS."""
    if kernels not in KERNELS:
        raise AutocastError(
            f'"kernels" is {kernels!r}, not one of {", ".join(KERNELS)}', where, "fix it, or make a fresh plan"
        )
    return kernels


def _checked_sentinels(sentinels: dict, target: Precision, where: str) -> dict:
    """The plan's "mask_sentinels": each a finite negative value the target type holds with room
    below it (a value a sum with the scores cannot take past the range, plan/masks.py)."""
    from ..hazards import thresholds

    edge_at = thresholds(target.elem_type)[0] if target.elem_type is not None else 0.0
    for name, value in sentinels.items():
        if not (math.isfinite(value) and -edge_at < value < 0):
            raise AutocastError(
                f"mask_sentinels[{name!r}] is {value!r}: a sentinel must be negative and inside the {target} range",
                where,
                "remove the entry, or make a fresh plan (convert --plan-out)",
            )
    return {name: float(value) for name, value in sentinels.items()}


def _checked_digests(digests: list, rule_files: list, where: str) -> list:
    """The plan's "rule_sha256": one sha256 (64 hex digits) per rule file, or none at all."""
    if digests and len(digests) != len(rule_files):
        raise AutocastError(
            f'"rule_sha256" has {len(digests)} entries for {len(rule_files)} "rule_files"',
            where,
            "give one sha256 per rule file, or drop the key",
        )
    for k, digest in enumerate(digests):
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise AutocastError(f'"rule_sha256[{k}]": expected 64 hex digits, got {digest[:80]!r}', where, _HINT)
    return list(digests)


def _checked_opset(opset: dict | None, where: str) -> dict | None:
    """The plan's record of the opset upgrade made before planning: an upgrade, from < to."""
    if opset is not None and not 1 <= opset["from"] < opset["to"]:
        raise AutocastError(
            f'"opset": an upgrade goes from a lower opset to a higher one, not {opset["from"]} -> {opset["to"]}',
            where,
            _HINT,
        )
    return {"from": opset["from"], "to": opset["to"]} if opset is not None else None


def _node_entry(k: int, entry: dict, where: str) -> NodePlan:
    """One node entry, its fields' types already checked: the codes and the order checked too."""
    named = f" (node {entry['name']!r})" if entry["name"] else ""

    def refuse(key: str, what: str, hint: str = _HINT):
        raise AutocastError(f'"nodes[{k}].{key}"{named}: {what}', where, hint)

    if entry["id"] != k:
        refuse("id", f"{entry['id']} in place {k}: nodes must stay in id order", "do not reorder, add or remove nodes")
    if entry["precision"] not in PRECISIONS:
        refuse(
            "precision",
            f"precision {entry['precision']!r} is not one of fp16, bf16, fp32, unchanged",
            'fix the node\'s "precision"',
        )
    if entry.get("planned", "fp32") not in PRECISIONS:
        refuse(
            "planned",
            f"precision {entry['planned']!r} is not one of fp16, bf16, fp32, unchanged",
            'leave "planned" as written: it records what planning gave; edit "precision"',
        )
    if entry["category"] not in _CATEGORIES:
        refuse("category", f"{entry['category']!r} is not one of {', '.join(sorted(_CATEGORIES))}")
    for key, pins in (("roles_in", "fp32_inputs"), ("roles_out", "fp32_outputs")):
        bad = set(entry[key]) - set(_ROLE_CODES)
        if bad:
            refuse(key, f"unknown role code(s) {''.join(sorted(bad))!r} (codes: {''.join(_ROLE_CODES)})")
        for n, port in enumerate(entry.get(pins, [])):
            if port >= len(entry[key]):
                refuse(f"{pins}[{n}]", f"port {port}, but {key} gives the node {len(entry[key])}")
    return NodePlan(
        id=entry["id"],
        name=entry["name"],
        op_type=entry["op_type"],
        domain=entry["domain"],
        graph=entry["graph"],
        category=entry["category"],
        precision=entry["precision"],
        reasons=[Reason(**r) for r in entry.get("reasons", [])],
        roles_in=entry["roles_in"],
        roles_out=entry["roles_out"],
        fp32_inputs=list(entry.get("fp32_inputs", [])),
        fp32_outputs=list(entry.get("fp32_outputs", [])),
        planned=entry.get("planned"),
    )


def _check_training(training: dict, where: str) -> None:
    """The training entry's values: its kind, a loss-scaling mode replay can apply, and the
    scaling's input, output and gradient count together (the report reads them together)."""
    if training["kind"] not in _TRAINING_KINDS:
        raise AutocastError(
            f'"training.kind": {training["kind"]!r} is not one of {", ".join(_TRAINING_KINDS)}', where, _HINT
        )
    scaling = training["loss_scaling"]
    if not _is_loss_scale(scaling["mode"]):
        raise AutocastError(
            f'"training.loss_scaling.mode": {scaling["mode"]!r} is not dynamic, none or a number > 0', where, _HINT
        )
    parts = [key for key in ("input", "output", "gradients") if key in scaling]
    if parts and len(parts) != 3:
        missing = next(key for key in ("input", "output", "gradients") if key not in scaling)
        raise AutocastError(
            f'"training.loss_scaling": "{missing}" is missing (input, output and gradients go together)',
            where,
            _HINT,
        )


def _is_loss_scale(mode: str) -> bool:
    if mode in ("dynamic", "none"):
        return True
    try:
        value = float(mode)
    except ValueError:
        return False
    return math.isfinite(value) and 0 < value <= 3.4028234663852886e38
