"""Stage: plan (replay). Reads a plan written by `--plan-out`, possibly edited by hand, and
checks that it belongs to the model it is applied to: the same structure (fingerprint), the same
nodes by id, name, op type and graph, and the port roles the model's tensors allow. A node whose
precision was edited to one its op cannot take is refused with the node named. Reads only."""

from __future__ import annotations

import logging

from ..dtypes import FLOAT, MIXABLE
from ..errors import AutocastError, InternalCheckError
from ..graph import GraphIndex, signatures
from .classify import schema_role
from .model import PLAN_VERSION, NodePlan, PlanWarning, PrecisionPlan, Reason
from .vocab import Category, PortRole, Precision

log = logging.getLogger(__name__)

_HINT = 'write a fresh plan with convert --plan-out and edit only the nodes\' "precision"'
_NODE_KEYS = {
    "id": int,
    "name": str,
    "op_type": str,
    "domain": str,
    "graph": str,
    "category": str,
    "precision": str,
    "roles_in": str,
    "roles_out": str,
}
_ROLE_CODES = {r.value for r in PortRole}


def plan_from_dict(data, where: str) -> PrecisionPlan:
    """Parse the JSON form of a plan, refusing anything malformed with the entry named."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise AutocastError('not a plan file (no "nodes")', where, "pass a file written by convert --plan-out")
    version = data.get("version")
    if version != PLAN_VERSION:
        raise AutocastError(
            f"plan version {version!r} is not supported (this autocast-onnx reads version {PLAN_VERSION})",
            where,
            "re-create the plan with convert --plan-out",
        )
    try:
        target = Precision.target(data.get("target", ""))
    except ValueError:
        raise AutocastError(f'"target" must be fp16 or bf16, not {data.get("target")!r}', where, _HINT) from None
    if not isinstance(data.get("keep_io_types"), bool):
        raise AutocastError('"keep_io_types" must be true or false', where, _HINT)
    fingerprint = data.get("model_fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise AutocastError('the plan has no "model_fingerprint"', where, _HINT)
    if not isinstance(data["nodes"], list):
        raise AutocastError('"nodes" must be a list', where, _HINT)
    nodes = []
    for k, entry in enumerate(data["nodes"]):
        label = f"nodes[{k}]"
        if not isinstance(entry, dict):
            raise AutocastError(f"{label} is not an object", where, _HINT)
        for key, kind in _NODE_KEYS.items():
            if not isinstance(entry.get(key), kind) or (kind is int and isinstance(entry.get(key), bool)):
                raise AutocastError(
                    f'{label} ({entry.get("name", "?")!r}): "{key}" is missing or not a {kind.__name__}', where, _HINT
                )
        if entry["id"] != k:
            raise AutocastError(
                f"{label} ({entry['name']!r}) has id {entry['id']}; nodes must stay in id order",
                where,
                "do not reorder, add or remove nodes in a plan",
            )
        if entry["precision"] not in {p.value for p in Precision}:
            raise AutocastError(
                f"node {entry['name'] or '#' + str(k)!r}: precision {entry['precision']!r} is not "
                "one of fp16, bf16, fp32, unchanged",
                where,
                'fix the node\'s "precision"',
            )
        for key in ("roles_in", "roles_out"):
            bad = set(entry[key]) - _ROLE_CODES
            if bad:
                raise AutocastError(
                    f"node {entry['name'] or '#' + str(k)!r}: {key} has unknown code(s) {''.join(sorted(bad))!r}",
                    where,
                    _HINT,
                )
        try:
            reasons = [Reason(**r) for r in entry.get("reasons", [])]
            nodes.append(
                NodePlan(
                    id=entry["id"],
                    name=entry["name"],
                    op_type=entry["op_type"],
                    domain=entry["domain"],
                    graph=entry["graph"],
                    category=entry["category"],
                    precision=entry["precision"],
                    reasons=reasons,
                    roles_in=entry["roles_in"],
                    roles_out=entry["roles_out"],
                    fp32_inputs=list(entry.get("fp32_inputs", [])),
                    fp32_outputs=list(entry.get("fp32_outputs", [])),
                )
            )
        except TypeError as exc:
            raise AutocastError(f"{label} ({entry['name']!r}): {exc}", where, _HINT) from None
    try:
        warnings = [PlanWarning(**w) for w in data.get("warnings", [])]
        clamp = {str(k): str(v) for k, v in dict(data.get("clamp_initializers", {})).items()}
    except (TypeError, ValueError) as exc:
        raise AutocastError(f'malformed "warnings" or "clamp_initializers": {exc}', where, _HINT) from None
    low_io = data.get("low_precision_io", [])
    if not (isinstance(low_io, list) and all(isinstance(n, str) for n in low_io)):
        raise AutocastError('"low_precision_io" must be a list of input and output names', where, _HINT)
    training = data.get("training")
    if training is not None and not (isinstance(training, dict) and isinstance(training.get("loss_scaling"), dict)):
        raise AutocastError('"training" must be an object with a "loss_scaling" object', where, _HINT)
    plan = PrecisionPlan(
        target=target,
        keep_io_types=data["keep_io_types"],
        nodes=nodes,
        rule_files=[str(f) for f in data.get("rule_files", [])],
        warnings=warnings,
        clamp_initializers=clamp,
        fingerprint=fingerprint,
        low_precision_io=low_io,
    )
    plan.training = training
    return plan


def check_plan_fits(plan: PrecisionPlan, index: GraphIndex) -> None:
    """Refuse a plan that does not belong to the indexed model, or whose edited precisions the
    model's ops cannot take. Raises AutocastError naming the plan file and the first node that
    does not fit."""
    from .paint import index_fingerprint

    where = plan.source or "<plan>"
    nodes = index.nodes
    if len(plan.precisions) != len(nodes):
        raise AutocastError(
            f"the plan has {len(plan.precisions)} nodes but the model has {len(nodes)}: it belongs "
            "to another model or an earlier export",
            where,
            _HINT,
        )
    for entry, node in zip(plan.nodes, nodes):
        if (entry.name, entry.op_type, entry.graph) != (node.name, node.op, node.scope.path):
            raise AutocastError(
                f"node #{node.id} is {entry.label!r} ({entry.op_type}) in the plan but "
                f"{node.label!r} ({node.op}) in the model: the plan belongs to another model or an "
                "earlier export",
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
    for entry, node in zip(plan.nodes, nodes):
        _check_entry(plan, entry, node, index, where)
        # the precision's last reason is the file that set it (one such reason, however often replayed)
        entry.reasons = [r for r in entry.reasons if r.code != "plan-replay"]
        entry.reasons.append(Reason("plan-replay", f"precision {entry.precision} as written in the plan", where))
    log.debug("plan replay: %s fits the model (%d nodes)", where, len(nodes))


def _check_entry(plan: PrecisionPlan, entry: NodePlan, node, index: GraphIndex, where: str) -> None:
    who = f"node {entry.label!r} ({entry.op_type})"
    for roles, values, side in ((entry.roles_in, node.inputs, "input"), (entry.roles_out, node.outputs, "output")):
        if len(roles) != len(values):
            raise AutocastError(
                f"{who}: the plan gives {len(roles)} {side} roles for {len(values)} {side}s", where, _HINT
            )
        for k, (role, value) in enumerate(zip(roles, values)):
            floating = value is not None and value.dtype in MIXABLE
            if role in (PortRole.FOLLOW, PortRole.FP32, PortRole.ANY, PortRole.OWN) and not floating:
                raise AutocastError(
                    f"{who}: {side} {k} is not a float tensor, so its role cannot be {role!r}", where, _HINT
                )
    precision = Precision(entry.precision)
    if precision.is_low and precision != plan.target:
        raise AutocastError(
            f"{who}: precision {precision} in a plan whose target is {plan.target}",
            where,
            f"use {plan.target}, fp32 or unchanged",
        )
    if precision == Precision.UNCHANGED:
        return
    category = (
        Category.from_rule_name(entry.category)
        if entry.category in ("low_precision", "follow", "keep_fp32", "clear", "non_float", "control_flow")
        else None
    )
    ports = entry.roles_in + entry.roles_out
    if PortRole.UNKNOWN in ports:
        raise AutocastError(
            f"{who} cannot compute in {precision}: some of its tensors have no known type, so it is left as it is",
            where,
            "set its precision to unchanged",
        )
    if category == Category.CONTROL_FLOW or node.subscopes:
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
        target_type = plan.target.elem_type
        if target_type is None:
            raise InternalCheckError(f"plan target {plan.target} has no element type")
        blocked = _ports_without_type(node, entry, index, target_type)
        if blocked:
            raise AutocastError(
                f"{who} cannot compute in {precision}: its schema allows no {precision} at {', '.join(blocked)}",
                where,
                "set its precision to fp32",
            )


def _ports_without_type(node, entry: NodePlan, index: GraphIndex, elem_type: int) -> list[str]:
    """FOLLOW ports whose schema does not admit `elem_type` (the rule classification uses)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    sig = signatures.lookup(domain, node.op, index.opset(domain))
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
