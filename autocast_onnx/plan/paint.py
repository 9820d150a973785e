"""Stage: paint. Turns a classification into a `PrecisionPlan` with linear passes over the
float edges of the graph (an edge joins an output that follows its node's precision to an
input that does), in the tradition of TensorFlow's auto-mixed-precision painting. One function
per pass, run in this order by `paint`:

  1. `_seed`: low_precision nodes (and nodes forced low) are LOW; keep_fp32 nodes, nodes kept
     fp32 by a rule, a data rule or a schema limit, and nodes of unknown type are FP32;
  2. `_propagate_fp32_taint`: FP32 flows forward from every FP32 node through follow and clear
     nodes;
  3. `_propagate_low`: LOW flows forward from every LOW node through the follow and clear nodes
     the taint did not reach (so follow/clear nodes between or after low nodes run low);
  4. `_settle_backward`, one walk from the outputs back: a clear node all of whose consumers are
     LOW becomes LOW (the cast moves upstream), and casts, constants and other type-setting nodes
     take the type all their consumers need, so an author's Cast(to=FLOAT) guarding a softmax
     stays as it is;
  5. `_precisions`: what is left undecided keeps the type it had.

Only reads the index; the plan it returns is applied by `rewrite`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..dtypes import FLOAT, dtype_name
from ..errors import InternalCheckError
from ..graph import GraphIndex
from .classify import Classification
from .model import NodePlan, PlanWarning, PrecisionPlan, Reason
from .vocab import CATEGORY_NAME, PRECISION_OF_TYPE, Category, Paint, PortRole, Precision, Seed, required_type

log = logging.getLogger(__name__)

# The hot loops compare plain str codes (CPython specializes str == str, not its subclasses).
_LOW, _FP32, _OPEN, _NONE = Paint.LOW.value, Paint.FP32.value, Paint.UNDECIDED.value, Paint.NONE.value
_FOLLOW = PortRole.FOLLOW.value
_FLOAT_READ = PortRole.FOLLOW + PortRole.ANY  # input roles an edge runs into
_FLOAT_WRITE = PortRole.FOLLOW + PortRole.FP32  # output roles a taint leaves through
# Nodes whose output type is an attribute, so they can produce whatever their consumers need.
_TYPE_SETTING = {"Cast", "Constant", "ConstantOfShape", "EyeLike"}


def global_order(index: GraphIndex) -> list:
    """All nodes, each subgraph's nodes placed just before the node that owns the subgraph."""
    out = []

    def walk(scope):
        for node in scope.order:
            for sub in node.subscopes:
                walk(sub)
            out.append(node)

    walk(index.main)
    return out


@dataclass
class _State:
    """The painter's working arrays, indexed by node id."""

    nodes: list
    classification: Classification
    target_type: int
    paint: list  # Paint per node
    cause: list  # per node: None, a Reason, or ("fp32-taint" | "follows-low", source node)


def paint(
    index: GraphIndex,
    classification: Classification,
    target: Precision,
    keep_io_types: bool,
    rule_files=(),
    order=None,
    low_precision_io=(),
) -> PrecisionPlan:
    """The precision plan of `index` from its classification (see the module docstring).
    `low_precision_io`: names of model inputs and outputs that take the target type."""
    target = Precision.target(target)
    n = len(index.nodes)
    target_type = target.elem_type
    if target_type is None:
        raise InternalCheckError(f"paint: target {target} has no element type")
    state = _State(index.nodes, classification, target_type, [_NONE] * n, [None] * n)
    _seed(state)
    _propagate_fp32_taint(state)
    _propagate_low(state)
    low_io = frozenset(low_precision_io)
    _settle_backward(state, index, keep_io_types, order if order is not None else global_order(index), low_io)
    precisions = _precisions(state)
    plan = PrecisionPlan(
        target=target,
        keep_io_types=keep_io_types,
        nodes=None,
        rule_files=list(rule_files),
        warnings=[PlanWarning(c, m, n_) for c, m, n_ in classification.warnings],
        clamp_initializers=dict(classification.clamp),
        low_precision_io=list(low_precision_io),
    )
    plan.set_lazy_nodes(
        lambda: _node_plans(state, precisions),
        precisions,
        [CATEGORY_NAME[c] for c in classification.categories],
        classification.roles_in,
        classification.roles_out,
        lambda: index_fingerprint(index),
        codes_of=lambda: _last_codes(state),
    )
    _flush_warnings(state, plan)
    return plan


def _seed(state: _State) -> None:
    """Pass 1: the paint rules and classification fix before anything flows.

    MatMul (low_precision) -> LOW     Softmax (keep_fp32) -> FP32     Add (follow) -> UNDECIDED
    a node kept fp32 by a rule, data rule, schema or unknown type -> FP32; forced low -> LOW"""
    c = state.classification
    paint = state.paint
    categories, seeds, frozen, roles_in, roles_out = c.categories, c.seeds, c.frozen, c.roles_in, c.roles_out
    unplanned = Category.NON_FLOAT + Category.CONTROL_FLOW
    follow, fp32 = PortRole.FOLLOW.value, PortRole.FP32.value
    low, keep, allow = Category.LOW_PRECISION.value, Category.KEEP_FP32.value, Seed.ALLOW
    for i in range(len(paint)):
        cat = categories[i]
        if cat in unplanned:
            continue
        if frozen[i]:
            paint[i] = _FP32
            continue
        ri, ro = roles_in[i], roles_out[i]
        if follow not in ri and fp32 not in ri and follow not in ro and fp32 not in ro:
            continue  # no float port follows the node, none is pinned: nothing to paint
        seed = seeds[i]
        if seed is not None:
            paint[i] = _LOW if seed == allow else _FP32  # deny or schema
        elif cat == low:
            paint[i] = _LOW
        elif cat == keep:
            paint[i] = _FP32
        else:
            paint[i] = _OPEN
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "paint pass 1 (seeds): %d low, %d fp32, %d undecided",
            paint.count(_LOW),
            paint.count(_FP32),
            paint.count(_OPEN),
        )


def _propagate_fp32_taint(state: _State) -> None:
    """Pass 2: fp32 flows forward through follow and clear nodes. A node that is fp32 only
    because its schema lacks the target type starts no taint (its values need no fp32
    precision), but passes on a taint that reaches it.

        Softmax(FP32) -> Mul(UNDECIDED) -> Reshape(UNDECIDED) -> MatMul(LOW)
        becomes          Mul(FP32)      -> Reshape(FP32)      -> MatMul(LOW)"""
    c = state.classification
    paint, cause, roles_in, roles_out, seeds = state.paint, state.cause, c.roles_in, c.roles_out, c.seeds
    stack = [node for node in state.nodes if paint[node.id] == _FP32 and seeds[node.id] != Seed.SCHEMA]
    tainted = {node.id for node in stack}
    reached = 0
    while stack:
        node = stack.pop()
        for role, value in zip(roles_out[node.id], node.outputs):
            if role not in _FLOAT_WRITE:
                continue
            for consumer, port in value.consumers:
                j = consumer.id
                if paint[j] == _NONE or roles_in[j][port] not in _FLOAT_READ:
                    continue
                if paint[j] == _OPEN:
                    paint[j] = _FP32
                    cause[j] = ("fp32-taint", node)
                    tainted.add(j)
                    stack.append(consumer)
                    reached += 1
                elif paint[j] == _FP32 and j not in tainted:
                    tainted.add(j)
                    stack.append(consumer)
    log.debug("paint pass 2 (fp32 taint): %d undecided nodes made fp32", reached)


def _propagate_low(state: _State) -> None:
    """Pass 3: low precision flows forward through the follow and clear nodes the taint left
    undecided.

        MatMul(LOW) -> Add(UNDECIDED) -> Relu(UNDECIDED)    becomes    Add(LOW) -> Relu(LOW)"""
    c = state.classification
    paint, cause, roles_in, roles_out = state.paint, state.cause, c.roles_in, c.roles_out
    stack = [node for node in state.nodes if paint[node.id] == _LOW]
    reached = 0
    while stack:
        node = stack.pop()
        for role, value in zip(roles_out[node.id], node.outputs):
            if role != _FOLLOW:
                continue
            for consumer, port in value.consumers:
                j = consumer.id
                if paint[j] == _OPEN and roles_in[j][port] in _FLOAT_READ:
                    paint[j] = _LOW
                    cause[j] = ("follows-low", node)
                    stack.append(consumer)
                    reached += 1
    log.debug("paint pass 3 (low precision forward): %d undecided nodes made low", reached)


def _node_type(state: _State, node_id: int) -> int | None:
    """The type a painted node computes in so far, or None while it keeps its own types."""
    p = state.paint[node_id]
    if p == _LOW:
        return state.target_type
    if p == _FP32 and not state.classification.frozen[node_id]:
        return FLOAT
    return None


def _settle_backward(state: _State, index: GraphIndex, keep_io_types: bool, order: list, low_io=frozenset()) -> None:
    """Pass 4: one walk from the graph's outputs back to its inputs, so every node sees its
    consumers' final paint. Two rules, for each node in that order:

      - a clear node whose consumers all run low goes low (the cast moves upstream):
            Reshape(UNDECIDED) -> MatMul(LOW), MatMul(LOW)   becomes   Reshape(LOW)
      - a type-setting node (Cast, Constant, ConstantOfShape, EyeLike) takes the one type all its
        consumers need:
            Cast(to=FLOAT)(x16) -> Softmax(FP32)     stays fp32 (the author's guard is kept)
            Constant -> Add(LOW)                     becomes low"""
    c = state.classification
    paint, cause, categories, roles_in, roles_out = state.paint, state.cause, c.categories, c.roles_in, c.roles_out
    moved = 0
    for node in reversed(order):
        i = node.id
        if paint[i] == _OPEN and categories[i] == Category.CLEAR and _consumers_all_low(state, node):
            paint[i] = _LOW
            cause[i] = Reason("consumers-low", "clear op whose consumers all run in low precision")
            moved += 1
        if (
            node.op in _TYPE_SETTING
            and node.domain == ""
            and paint[i] != _NONE
            and c.seeds[i] is None
            and categories[i] == Category.CLEAR
        ):
            needs = set()
            for k, value in enumerate(node.outputs):
                if roles_out[i][k] != _FOLLOW:
                    continue
                for consumer, port in value.consumers:
                    needs.add(required_type(roles_in[consumer.id][port], _node_type(state, consumer.id), value.dtype))
                for scope, _ in value.graph_outputs:
                    # subgraph outputs always keep their types; the main graph's unless told otherwise
                    if scope is index.main and value.name in low_io:
                        needs.add(state.target_type)
                    else:
                        needs.add(value.dtype if keep_io_types or scope is not index.main else None)
            needs.discard(None)
            before = paint[i]
            if len(needs) == 1:
                need = needs.pop()
                paint[i] = _LOW if need == state.target_type else (_FP32 if need == FLOAT else _OPEN)
                if paint[i] != before:
                    cause[i] = Reason("consumers-need", f"all its consumers need {dtype_name(need)}")
            elif needs and node.op != "Cast" and paint[i] == _LOW:
                paint[i] = _OPEN
                cause[i] = Reason(
                    "consumers-mixed", "consumers need different types: keeps its own and each consumer gets a cast"
                )
            moved += paint[i] != before
    log.debug("paint pass 4 (backward settle): %d clear and type-setting nodes moved", moved)


def _consumers_all_low(state: _State, node) -> bool:
    c = state.classification
    ro = c.roles_out[node.id]
    seen = False
    for k, value in enumerate(node.outputs):
        if ro[k] != _FOLLOW:
            continue
        if value.graph_outputs:
            return False
        for consumer, port in value.consumers:
            if state.paint[consumer.id] != _LOW or c.roles_in[consumer.id][port] not in _FLOAT_READ:
                return False
            seen = True
    return seen


def _precisions(state: _State) -> list:
    """Pass 5: each node's Precision. Undecided nodes keep the type they had."""
    c = state.classification
    target = PRECISION_OF_TYPE[state.target_type]
    out = [Precision.UNCHANGED] * len(state.nodes)
    for node in state.nodes:
        i = node.id
        p = state.paint[i]
        if p == _LOW:
            out[i] = target
        elif p == _FP32 and not c.frozen[i]:
            out[i] = Precision.FP32
        elif p == _OPEN:
            out[i] = PRECISION_OF_TYPE.get(_original_type(node, c.roles_in[i], c.roles_out[i]), Precision.UNCHANGED)
    return out


def _last_codes(state: _State) -> list[str | None]:
    """The code of each node's deciding (last) reason, as _node_plans would end its list, without
    building the entries and their messages (the summary counts fp32 nodes by it)."""
    c = state.classification
    out: list[str | None] = []
    for node in state.nodes:
        i = node.id
        p = state.paint[i]
        if p == _OPEN:
            out.append("unchanged")
            continue
        if _no_float(c, i, p):
            out.append("no-float")
            continue
        why = state.cause[i]
        if why.__class__ is tuple:
            out.append(why[0])
        elif why is not None:
            out.append(why.code)
        else:
            reasons = c.reasons[i]
            out.append(reasons[-1].code if reasons else None)
    return out


def _no_float(c: Classification, i: int, p: str) -> bool:
    """Whether node `i` (painted `p`, not undecided) is planned for want of a float tensor that
    follows it: nothing painted it, nothing froze it, and no reason of its own says why (a
    non-float op, control flow, a node whose tensors keep a sequence's or optional's type)."""
    if p in (_LOW, _FP32) or c.frozen[i] or c.categories[i] in (Category.NON_FLOAT, Category.CONTROL_FLOW):
        return False
    reasons = c.reasons[i]
    return not (reasons and reasons[-1].code == "container")


def _node_plans(state: _State, precisions: list) -> list[NodePlan]:
    """The per-node plan entries with their reasons, built when someone reads them."""
    c = state.classification
    plans = []
    for node in state.nodes:
        i = node.id
        p = state.paint[i]
        reasons = list(c.reasons[i] or ())
        why = state.cause[i]
        if why.__class__ is tuple:
            code, src = why
            if code == "fp32-taint":
                why = Reason(
                    code, f"fed by fp32 node {src.label} ({src.op}); fp32 flows forward through follow and clear ops"
                )
            else:
                why = Reason(code, f"fed by low-precision node {src.label} ({src.op}) and by no fp32 node")
        if why is not None:
            reasons.append(why)
        cat = c.categories[i]
        if p == _OPEN:
            original = _original_type(node, c.roles_in[i], c.roles_out[i])
            reasons.append(
                Reason(
                    "unchanged",
                    f"not fed by a low-precision node and nothing forces it: keeps its type ({dtype_name(original)})",
                )
            )
        elif _no_float(c, i, p):
            reasons.append(Reason("no-float", "no float tensor follows this op's precision"))
        plans.append(
            NodePlan(
                id=i,
                name=node.name,
                op_type=node.op,
                domain=node.authored_domain,
                graph=node.scope.path,
                category=CATEGORY_NAME[cat],
                precision=str(precisions[i]),
                reasons=reasons,
                roles_in=c.roles_in[i],
                roles_out=c.roles_out[i],
                fp32_inputs=list(c.pins_in[i]),
                fp32_outputs=list(c.pins_out[i]),
            )
        )
    return plans


def _flush_warnings(state: _State, plan: PrecisionPlan) -> None:
    """A warning for each constant whose values partly flush and that some low node converts."""
    c = state.classification
    for value, message in c.flush_notes.values():
        users = [n for n, port in value.consumers if state.paint[n.id] == _LOW and c.roles_in[n.id][port] == _FOLLOW]
        if users:
            plan.warnings.append(
                PlanWarning(
                    "data-flush",
                    f"{message}; converted for {users[0].label}"
                    + (f" and {len(users) - 1} more" if len(users) > 1 else ""),
                    users[0].label,
                )
            )


def _original_type(node, roles_in, roles_out):
    for k, value in enumerate(node.outputs):
        if roles_out[k] == _FOLLOW:
            return value.dtype
    for k, value in enumerate(node.inputs):
        if roles_in[k] == _FOLLOW:
            return value.dtype
    return None


def index_fingerprint(index: GraphIndex) -> str:
    """A digest of the model's structure that a plan belongs to: every node's graph, name, op
    type and domain, where each input comes from (a node and port, a graph input by position, or
    an initializer by type and shape, a sparse one by its dense shape) and each tensor's element
    type. Tensor names are left out, so re-exporting the same architecture gives the same
    fingerprint; weights are left out, so retraining does too."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for scope in index.scopes:
        positions = {id(v): k for k, v in enumerate(scope.inputs)}
        digest.update(
            f"G|{scope.path}|{len(scope.nodes)}|{[v.dtype for v in scope.inputs]}|"
            f"{[v.dtype for v in scope.outputs]}\n".encode()
        )
        for node in scope.nodes:
            sources = []
            for value in node.inputs:
                if value is None:
                    sources.append("-")
                elif value.producer is not None:
                    sources.append(f"{value.producer.id}.{value.out_port}:{value.dtype}")
                elif value.kind == "input" and id(value) in positions:
                    sources.append(f"in{positions[id(value)]}:{value.dtype}")
                elif value.initializer is not None:  # a sparse one by its dense shape, not its count of values
                    sparse = value.scope.sparse.get(value.name) if value.scope.sparse else None
                    dims = (sparse if sparse is not None else value.initializer).dims
                    sources.append(f"init{list(dims)}:{value.dtype}")
                else:
                    sources.append(f"outer:{value.dtype}")
            outs = ",".join("-" if v is None else str(v.dtype) for v in node.outputs)
            digest.update(
                f"{node.id}|{node.name}|{node.authored_domain}|{node.op}|{','.join(sources)}|{outs}\n".encode()
            )
    return digest.hexdigest()
