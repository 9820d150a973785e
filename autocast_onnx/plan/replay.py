"""Stage: plan (replay). Reads a plan written by `--plan-out`, possibly edited by hand: every
field's type against one schema (`_PLAN`, errors name the key path), then that it belongs to the
model it is applied to (the same structure by fingerprint, the same nodes by id, name, domain, op
type and graph), and that every port role fits its port (vocab.FITTING_ROLES) and every edited
precision its op, so that an edited plan never yields a model ONNX Runtime refuses. A plan is user
input: messages quote the text they repeat from it. Reads only."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from ..dtypes import FLOAT, MIXABLE
from ..errors import AutocastError, InternalCheckError
from ..graph import GraphIndex, signatures
from .classify import ANY_INPUTS, node_holds_container, schema_role
from .model import PLAN_VERSION, PRECISIONS, NodePlan, PlanWarning, PrecisionPlan, Reason
from .vocab import FITTING_ROLES, ROLE_WORDS, Category, PortRole, Precision

log = logging.getLogger(__name__)

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
        "summary": _Map(_INT, "an object of counts"),
        "warnings": _List(
            _Object({"code": _STR, "message": _STR, "node": _Nullable(_STR)}, ("code", "message")),
            "a list of warnings (objects)",
        ),
        "clamp_initializers": _Map(_STR, "an object (initializer name -> why)"),
        "training": _Nullable(_TRAINING),
        "search": _Nullable(_ANY_OBJECT),
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
    )
    plan.training = training
    return plan


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


def check_plan_fits(plan: PrecisionPlan, index: GraphIndex) -> None:
    """Refuse a plan that does not belong to the indexed model, or whose edited precisions or
    port roles the model's ops cannot take (a model ONNX Runtime would refuse). Raises
    AutocastError naming the plan file and the first node or entry that does not fit."""
    where = plan.source or "<plan>"
    _check_same_model(plan, index, where)
    _check_named_tensors(plan, index, where)
    for entry, node in zip(plan.nodes, index.nodes):
        _check_entry(plan, entry, node, index, where)
        # the precision's last reason is the file that set it (one such reason, however often replayed)
        entry.reasons = [r for r in entry.reasons if r.code != "plan-replay"]
        entry.reasons.append(Reason("plan-replay", f"precision {entry.precision} as written in the plan", where))
    log.debug("plan replay: %s fits the model (%d nodes)", where, len(index.nodes))


def _check_same_model(plan: PrecisionPlan, index: GraphIndex, where: str) -> None:
    """The plan was written for this model: node count, names, op types, graphs, fingerprint,
    and a training entry only for a training graph."""
    from .paint import index_fingerprint

    nodes = index.nodes
    if len(plan.precisions) != len(nodes):
        raise AutocastError(
            f"the plan has {len(plan.precisions)} nodes but the model has {len(nodes)}: it belongs "
            "to another model or an earlier export",
            where,
            _HINT,
        )
    for entry, node in zip(plan.nodes, nodes):
        if (entry.name, entry.domain, entry.op_type, entry.graph) != (node.name, node.domain, node.op, node.scope.path):
            raise AutocastError(
                f"node #{node.id} is {entry.label!r} ({_op(_qualified(entry.domain, entry.op_type))}) in the plan "
                f"but {node.label!r} ({_op(_qualified(node.domain, node.op))}) in the model: the plan belongs to "
                "another model or an earlier export",
                where,
                _HINT,
            )
    if plan.fingerprint != index_fingerprint(index):
        raise AutocastError(
            "the plan's nodes match the model by name, but their connections or tensor types "
            "differ (model fingerprint mismatch): the model was changed after the plan was written",
            where,
            _HINT,
        )
    if plan.training is not None and not _is_training_graph(index):
        raise AutocastError(
            '"training": the plan describes a training graph, but the model is not a training graph',
            where,
            'remove "training" from the plan, or write a fresh one with convert --plan-out',
        )


def _qualified(domain: str, op_type: str) -> str:
    return f"{domain}:{op_type}" if domain else op_type


def _is_training_graph(index: GraphIndex) -> bool:
    from ..graph.training import might_be_training, recognise

    model = index.model
    return might_be_training(index, model) and recognise(model) is not None


def _check_named_tensors(plan: PrecisionPlan, index: GraphIndex, where: str) -> None:
    """Every name the plan lists is a tensor of the model of the right kind: low_precision_io a
    float32 model input or output, clamp_initializers a float initializer or Constant output
    (an entry that names nothing would do nothing)."""
    ports = {v.name: v for v in index.main.inputs if v.initializer is None}
    ports.update((v.name, v) for v in index.main.outputs if v is not None)
    for name in plan.low_precision_io:
        value = ports.get(name)
        if value is None or value.dtype != FLOAT:
            raise AutocastError(
                f"low_precision_io names {name!r}, which is not a float32 input or output of the model",
                where,
                "remove it from the plan's low_precision_io list",
            )
    if not plan.clamp_initializers:
        return
    constants = {
        value.name
        for scope in index.scopes
        for value in scope.values.values()
        if value.dtype in MIXABLE
        and (value.initializer is not None or (value.producer is not None and value.producer.op == "Constant"))
    }
    for name in plan.clamp_initializers:
        if name not in constants:
            raise AutocastError(
                f"clamp_initializers names {name!r}, which is not a float initializer or Constant of the model",
                where,
                "remove it from the plan's clamp_initializers",
            )


def _check_entry(plan: PrecisionPlan, entry: NodePlan, node, index: GraphIndex, where: str) -> None:
    """One node's roles and precision against the model's tensors and the op's schema."""
    who = f"node {entry.label!r} ({_op(entry.op_type)})"
    sig = _signature(node, index)
    _check_roles(plan, entry, node, sig, who, where)
    precision = Precision(entry.precision)
    if precision.is_low and precision != plan.target and _kept_type(entry, node) != precision.elem_type:
        raise AutocastError(
            f"{who}: precision {precision} in a plan whose target is {plan.target}",
            where,
            f"use {plan.target}, fp32 or unchanged",
        )
    if precision != Precision.UNCHANGED:
        _check_precision(entry, node, sig, precision, who, where)
    if precision != Precision.FP32:
        _check_shared_types(entry, sig, precision, who, where)


def _kept_type(entry: NodePlan, node) -> int | None:
    """The type a node had, read at its first port that follows it: painting leaves a node that
    nothing moved in that type, so an fp16 node of an fp16 model stays fp16 in a bf16 plan."""
    for roles, values in ((entry.roles_out, node.outputs), (entry.roles_in, node.inputs)):
        for role, value in zip(roles, values):
            if role == PortRole.FOLLOW and value is not None:
                return value.dtype
    return None


def _signature(node, index: GraphIndex):
    domain = "" if node.domain == "ai.onnx" else node.domain
    return signatures.lookup(domain, node.op, index.opset(domain))


def _check_roles(plan: PrecisionPlan, entry: NodePlan, node, sig, who: str, where: str) -> None:
    """Each port's role is one classification could give it (vocab.FITTING_ROLES)."""
    target = plan.target.elem_type
    if target is None:
        raise InternalCheckError(f"plan target {plan.target} has no element type")
    # control flow, and a node that reads or writes a sequence or optional: its float ports keep their types
    control = entry.category == Category.CONTROL_FLOW.rule_name or node_holds_container(node, sig)
    for roles, values, side in ((entry.roles_in, node.inputs, "input"), (entry.roles_out, node.outputs, "output")):
        if len(roles) != len(values):
            raise AutocastError(
                f"{who}: the plan gives {len(roles)} {side} roles for {len(values)} {side}s", where, _HINT
            )
        for k, (role, value) in enumerate(zip(roles, values)):
            kind = _port_kind(node, sig, side, k, value, control, target)
            fitting = FITTING_ROLES[kind]
            if role in fitting:
                continue
            if kind in ("absent", "not-float"):
                raise AutocastError(
                    f"{who}: {side} {k} is not a float tensor, so its role cannot be {role!r}", where, _HINT
                )
            allowed = " or ".join(repr(r) for r in fitting)
            raise AutocastError(
                f"{who}: role {role!r} ({ROLE_WORDS[role]}) does not fit {side} {k}, a {_KIND_WORDS[kind]}: "
                "the converted model would bind its type against the schema and ONNX Runtime would refuse it",
                where,
                f"give {side} {k} the role {allowed}, as --plan-out writes for such a port",
            )


_KIND_WORDS = {
    "unknown": "tensor of unknown type",
    "own": "float port that keeps its type (control flow, a sequence or optional op, or a cast to fp16/bf16)",
    "cast-back": "Cast's float output to fp32",
    "any": "port whose type the op does not care about",
    "any-fp32": "port whose schema admits fp32 only",
    "follow": "float tensor",
    "follow-low-only": "float tensor whose schema admits no fp32",
    "fp32-only": "float tensor whose schema admits fp32 only",
    "no-type": "float tensor whose schema admits neither fp32 nor the target",
}


def _port_kind(node, sig, side: str, k: int, value, control: bool, target: int) -> str:
    """What a port is, as vocab.FITTING_ROLES keys it: from its tensor's type, the node's
    category and the op's schema (the rules classification gives roles by)."""
    if value is None:
        return "absent"
    if value.dtype is None:
        return "unknown"
    if value.dtype not in MIXABLE:
        return "not-float"
    if side == "output" and node.op == "Cast" and node.domain in ("", "ai.onnx"):
        return "cast-back" if value.dtype == FLOAT else "own"
    if control:
        return "own"
    param = None if sig is None else (sig.input_param(k) if side == "input" else sig.output_param(k))
    allowed = None if sig is None else sig.allowed(param)
    domain = "" if node.domain == "ai.onnx" else node.domain
    if side == "input" and _any_type_input(domain, node.op, k):
        return "any-fp32" if allowed is not None and target not in allowed and FLOAT in allowed else "any"
    role = schema_role(sig, param, target)
    if role == PortRole.FOLLOW:
        return "follow" if allowed is None or FLOAT in allowed else "follow-low-only"
    return "fp32-only" if role == PortRole.FP32 else "no-type"


def _any_type_input(domain: str, op: str, k: int) -> bool:
    if (domain, op) not in ANY_INPUTS:
        return False
    ports = ANY_INPUTS[(domain, op)]
    return ports is None or k in ports


def _check_precision(entry: NodePlan, node, sig, precision: Precision, who: str, where: str) -> None:
    """The node can compute in its (edited) precision: known types, no control flow, a port that
    follows it, and a schema that admits the type at every such port."""
    ports = entry.roles_in + entry.roles_out
    if PortRole.UNKNOWN in ports:
        raise AutocastError(
            f"{who} cannot compute in {precision}: some of its tensors have no known type, so it is left as it is",
            where,
            "set its precision to unchanged",
        )
    if entry.category == Category.CONTROL_FLOW.rule_name or node.subscopes:
        raise AutocastError(
            f"{who} cannot compute in {precision}: it is control flow; its subgraphs' nodes are planned one by one",
            where,
            "set its precision to unchanged and edit the body's nodes",
        )
    if PortRole.FOLLOW not in ports:
        if precision == Precision.FP32 and PortRole.FP32 in ports:
            return  # a schema that allows only fp32: what painting gives it
        raise AutocastError(
            f"{who} cannot compute in {precision}: none of its tensors follows the node's "
            "precision (not a float op, or its schema fixes the types)",
            where,
            "set its precision to unchanged",
        )
    if precision.is_low:
        low_type = precision.elem_type
        if low_type is None:
            raise InternalCheckError(f"precision {precision} has no element type")
        blocked = _ports_without_type(sig, entry, low_type)
        if blocked:
            raise AutocastError(
                f"{who} cannot compute in {precision}: its schema allows no {precision} at {', '.join(blocked)}",
                where,
                "set its precision to fp32",
            )


def _ports_without_type(sig, entry: NodePlan, elem_type: int) -> list[str]:
    """FOLLOW ports whose schema does not admit `elem_type` (the rule classification uses)."""
    if sig is None:
        return []
    out = []
    for side, roles, param_of in (
        ("input", entry.roles_in, sig.input_param),
        ("output", entry.roles_out, sig.output_param),
    ):
        for k, role in enumerate(roles):
            if role != PortRole.FOLLOW:
                continue
            if schema_role(sig, param_of(k), elem_type) != PortRole.FOLLOW:
                out.append(f"{side} {k}")
    return out


def _check_shared_types(entry: NodePlan, sig, precision: Precision, who: str, where: str) -> None:
    """No type parameter of the schema is bound both by a port pinned fp32 and by one that follows
    a node computing in another type (vocab.FITTING_ROLES: the group rule)."""
    if sig is None:
        return
    following: dict[str, str] = {}  # type parameter -> the first port that follows the node
    pinned: dict[str, str] = {}  # type parameter -> the first port pinned fp32
    for side, roles, param_of in (
        ("input", entry.roles_in, sig.input_param),
        ("output", entry.roles_out, sig.output_param),
    ):
        for k, role in enumerate(roles):
            param = param_of(k)
            if param is None or param not in sig.params:
                continue  # a concrete type (tensor(float)): bound to nothing else
            if role == PortRole.FOLLOW:
                following.setdefault(param, f"{side} {k}")
            elif role == PortRole.FP32:
                pinned.setdefault(param, f"{side} {k}")
    for param, port in pinned.items():
        other = following.get(param)
        if other is not None:
            raise AutocastError(
                f"{who} in {precision}: {port} has role 'f' (fp32) but {other}, of the same type parameter "
                f"{param}, follows the node: ONNX Runtime refuses {param} bound to two types",
                where,
                f"give every port of {param} the same role, or set the node's precision to fp32",
            )
