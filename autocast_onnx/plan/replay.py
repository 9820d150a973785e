"""Stage: plan (replay). Reads a plan written by `--plan-out`, possibly edited by hand: every
field's type against one schema (model.py `_PLAN`, errors name the key path), then that it belongs to the
model it is applied to (the same structure by fingerprint, the same nodes by id, name, domain, op
type and graph), and that every port role fits its port (vocab.FITTING_ROLES) and every edited
precision its op, so that an edited plan never yields a model ONNX Runtime refuses. A plan is user
input: messages quote the text they repeat from it. Reads only."""

from __future__ import annotations

import logging

from ..dtypes import FLOAT, MIXABLE
from ..errors import AutocastError, InternalCheckError
from ..graph import GraphIndex, signatures
from .classify import ANY_INPUTS, node_holds_container, schema_role
from .model import _HINT, NodePlan, PrecisionPlan, Reason, _op
from .model import plan_from_dict as plan_from_dict  # read a plan file: beside PrecisionPlan.to_dict
from .vocab import FITTING_ROLES, ROLE_WORDS, Category, PortRole, Precision

log = logging.getLogger(__name__)


def check_plan_fits(plan: PrecisionPlan, index: GraphIndex) -> None:
    """Refuse a plan that does not belong to the indexed model, or whose edited precisions or
    port roles the model's ops cannot take (a model ONNX Runtime would refuse). Raises
    AutocastError naming the plan file and the first node or entry that does not fit."""
    where = plan.source or "<plan>"
    _check_same_model(plan, index, where)
    _check_named_tensors(plan, index, where)
    edited = 0
    # a file written before plans recorded `planned` cannot tell an edit: its every node keeps the
    # last reason plan-replay, as then
    legacy = all(entry.planned is None for entry in plan.nodes)
    for entry, node in zip(plan.nodes, index.nodes):
        _check_entry(plan, entry, node, index, where)
        # a node keeps the reasons the file gives it; an edited one gets a last reason naming the
        # file (one such reason, however often the plan is written out and replayed again)
        entry.reasons = [r for r in entry.reasons if r.code not in REPLAY_CODES]
        if legacy:
            entry.reasons.append(Reason("plan-replay", f"precision {entry.precision} as written in the plan", where))
        elif entry.edited:
            edited += 1
            entry.reasons.append(
                Reason("plan-edit", f"edited in the plan to {entry.precision} (planning gave {entry.planned})", where)
            )
    plan.replayed = True
    log.debug("plan replay: %s fits the model (%d nodes, %d edited)", where, len(index.nodes), edited)


# The reasons replay gives: plan-edit, and plan-replay (every node of a file without `planned`)
REPLAY_CODES = ("plan-edit", "plan-replay")


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
        domain = node.authored_domain  # as the plan recorded it
        if (entry.name, entry.domain, entry.op_type, entry.graph) != (node.name, domain, node.op, node.scope.path):
            raise AutocastError(
                f"node #{node.id} is {entry.label!r} ({_op(_qualified(entry.domain, entry.op_type))}) in the plan "
                f"but {node.label!r} ({_op(_qualified(domain, node.op))}) in the model: the plan belongs to "
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
    if not plan.clamp_initializers and not plan.mask_sentinels:
        return
    constants = {
        value.name
        for scope in index.scopes
        for value in scope.values.values()
        if value.dtype in MIXABLE
        and (value.initializer is not None or (value.producer is not None and value.producer.op == "Constant"))
    }
    for key, names in (("clamp_initializers", plan.clamp_initializers), ("mask_sentinels", plan.mask_sentinels)):
        for name in names:
            if name not in constants:
                raise AutocastError(
                    f"{key} names {name!r}, which is not a float initializer or Constant of the model",
                    where,
                    f"remove it from the plan's {key}",
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
    return signatures.lookup(node.domain, node.op, index.opset(node.domain))


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
    if side == "output" and node.op == "Cast" and node.domain == "":
        return "cast-back" if value.dtype == FLOAT else "own"
    if control:
        return "own"
    param = None if sig is None else (sig.input_param(k) if side == "input" else sig.output_param(k))
    allowed = None if sig is None else sig.allowed(param)
    if side == "input" and _any_type_input(node.domain, node.op, k):
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
