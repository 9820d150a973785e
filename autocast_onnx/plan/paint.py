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
from typing import Any

import onnx

from ..dtypes import FLOAT, FLOAT16, LIMITS, dtype_name
from ..errors import InternalCheckError
from ..graph import GraphIndex, signatures
from ..graph.shapes import MAC_OPS
from ..hazards import PASS_ON_OPS, RangeFacts, range_facts, range_sentence
from .classify import (
    BN_KEPT,
    Classification,
    _check_constants,
    constant_array,
    is_constant,
    opset_admitting,
    schema_role,
)
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
    runtime: str | None = None,
    shapes=None,
    fast: bool = True,
) -> PrecisionPlan:
    """The precision plan of `index` from its classification (see the module docstring).
    `low_precision_io`: names of model inputs and outputs that take the target type. `runtime`
    (None: the design's, ONNX Runtime's CUDA provider; "any": none to count on) is the runtime
    whose kernels pass 6 reads; `shapes` (tensor name -> (elem type, shape)) sizes its reasons;
    `fast` (the default; False with --precise) lets pass 6 lower the normalizations and other
    bounded fp32-computing ops together with the streams they sit on (plan/kernel_io.py)."""
    target = Precision.target(target)
    target_type = target.elem_type
    if target_type is None:
        raise InternalCheckError(f"paint: target {target} has no element type")
    low_io = frozenset(low_precision_io)
    order = order if order is not None else global_order(index)
    state = _painted(index, classification, target_type, keep_io_types, order, low_io, {})
    state = _kernel_rounds(state, index, keep_io_types, order, low_io, runtime, shapes, fast)
    precisions = _precisions(state)
    plan = PrecisionPlan(
        target=target,
        keep_io_types=keep_io_types,
        nodes=None,
        rule_files=list(rule_files),
        warnings=[PlanWarning(c, m, n_) for c, m, n_ in classification.warnings],
        clamp_initializers=dict(classification.clamp),
        mask_sentinels=dict(classification.sentinels),
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


def _painted(index, classification, target_type: int, keep_io_types: bool, order, low_io, lowered: dict) -> _State:
    """Passes 1-4 from the classification, with the nodes of `lowered` (node id -> Reason: pass
    6's) seeded LOW beside pass 1's seeds."""
    n = len(index.nodes)
    state = _State(index.nodes, classification, target_type, [_NONE] * n, [None] * n)
    _seed(state)
    for i, why in lowered.items():
        state.paint[i] = _LOW
        state.cause[i] = why
    _propagate_fp32_taint(state)
    _propagate_low(state)
    _settle_backward(state, index, keep_io_types, order, low_io)
    return state


MAX_KERNEL_ROUNDS = 16  # pass 6 rounds; each lowers at least one node, most plans need one or two


def _kernel_rounds(state: _State, index, keep_io_types: bool, order, low_io, runtime, shapes, fast=True) -> _State:
    """Pass 6 (plan/kernel_io.py): keep_fp32 nodes whose runtime kernel computes in fp32 anyway and
    that sit between low-precision neighbours run low, with no Cast; passes 1-4 run again after
    each round, so that a node the round lowered lets its neighbour qualify in the next. With
    `fast`, the fast plan's nodes are lowered first (_fast_phase)."""
    from .kernel_io import lowerable

    def keeps(value) -> bool:  # a main-graph output that keeps its type (subgraph outputs always do)
        return any(
            scope is not index.main or (keep_io_types and value.name not in low_io) for scope, _ in value.graph_outputs
        )

    lowered: dict = {}
    for _ in range(MAX_KERNEL_ROUNDS):
        found = lowerable(
            index, state.paint, state.cause, state.classification, state.target_type, keeps, runtime, shapes
        )
        new = {i: why for i, why in found.items() if i not in lowered}
        if not new:
            break
        lowered.update(new)
        state = _painted(index, state.classification, state.target_type, keep_io_types, order, low_io, lowered)
    log.debug("paint pass 6 (fp32 kernels at low precision): %d keep_fp32 nodes run low", len(lowered))
    if fast:
        trial = _fast_phase(state, index, keep_io_types, order, low_io, runtime or "cuda", shapes, keeps, lowered)
        if trial is not None:
            state = trial
    return state


MAX_FAST_ROUNDS = 32  # fast-plan rounds; each drops at least one node, most plans settle in two or three


def _fast_phase(
    state: _State, index, keep_io_types: bool, order, low_io, runtime: str, shapes, keeps, base: dict
) -> _State | None:
    """The fast plan (plan/kernel_io.py, FAST_OPS), after the conservative rounds (`base`: the nodes
    they lowered, which keep their reason): every candidate painted low at once, passes 1-4
    again, and the candidates whose inputs or readers ended fp32 dropped, until none is dropped:
    the largest set that holds together. Returns that painting (each node's reason in its cause),
    or None when nothing holds or the rounds run out (then the conservative plan stands)."""
    from .kernel_io import FAST_RUNTIMES, fast_candidates, still_low, upstream

    c, low_type = state.classification, state.target_type
    if runtime not in FAST_RUNTIMES or low_type != FLOAT16:
        return None
    chosen = fast_candidates(index, state.paint, c, low_type, keeps, runtime, shapes)
    cone = upstream(index, chosen, state.paint, c, low_type)
    chosen.update(cone)
    for _ in range(MAX_FAST_ROUNDS):
        if not chosen:
            break
        trial = _painted(index, c, low_type, keep_io_types, order, low_io, {**base, **chosen})
        holding = still_low(index, chosen, trial.paint, trial.cause, c, low_type, keeps, set(cone))
        if len(holding) == len(chosen):
            log.debug("paint pass 6, fast plan: %d keep_fp32 nodes run low with their neighbours", len(chosen))
            return trial
        chosen = {i: why for i, why in chosen.items() if i in holding}
    return None


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
                    "flush-note",  # under max_flush_fraction, converted: nothing to act on (model.NOTE_CODES)
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
        lines: list[str] = []  # hashed in chunks: one update per line costs more than the lines' text
        for node in scope.nodes:
            sources = []
            for value in node.inputs:  # the common case, a node's output, inline: this loop is the cost
                producer = None if value is None else value.producer
                if producer is not None:
                    sources.append(f"{producer.id}.{value.out_port}:{value.dtype}")
                else:
                    sources.append(_source_text(value, positions))
            outs = ",".join(["-" if v is None else str(v.dtype) for v in node.outputs])
            lines.append(f"{node.id}|{node.name}|{node.authored_domain}|{node.op}|{','.join(sources)}|{outs}\n")
            if len(lines) >= 4096:
                digest.update("".join(lines).encode())
                lines.clear()
        digest.update("".join(lines).encode())
    return digest.hexdigest()


def _source_text(value, positions: dict) -> str:
    """Where one input of a node comes from, as index_fingerprint hashes it."""
    if value is None:
        return "-"
    if value.producer is not None:
        return f"{value.producer.id}.{value.out_port}:{value.dtype}"
    if value.kind == "input" and id(value) in positions:
        return f"in{positions[id(value)]}:{value.dtype}"
    if value.initializer is not None:  # a sparse one by its dense shape, not its count of values
        sparse = value.scope.sparse.get(value.name) if value.scope.sparse else None
        dims = (sparse if sparse is not None else value.initializer).dims
        return f"init{list(dims)}:{value.dtype}"
    return f"outer:{value.dtype}"


# ---- constants out of range that reach a low-precision node -----------------------------------
REACH_DEPTH = 8  # ops that pass values on, followed back from a low-precision node's input


@dataclass(frozen=True)
class ForcedReach:
    """A constant without headroom in the target type (hazards.py: it overflows or lands on the
    largest finite value) that a low-precision node reads: directly (`via` empty), or through
    fp32 ops that pass its values on (`via`, nearest the node first). `boundary` is the fp32 tensor
    the rewrite casts into the node (None: an initializer read directly, converted in place)."""

    constant: Any  # the Value of the initializer or Constant output
    node: Any  # the low-precision node
    boundary: Any  # a Value, or None
    via: tuple
    facts: RangeFacts


def forced_low_reach(index: GraphIndex, plan: PrecisionPlan, direct: bool = True) -> list[ForcedReach]:
    """Every ForcedReach of `plan` on `index` (with `direct` False, not the initializers a low
    node reads itself: classification clamps those of a fresh plan, and the rewrite needs only the
    casts). The default rules never make one (a reader of such a constant, also through ops that
    pass it on, stays fp32: classify's data rules); a node forced low by a rule, --include-node or
    --include-op, or an edited plan, can. Without a clamp, a -3.4e38 mask fill that reaches a
    forced fp16 Softmax through an fp32 Add and the inserted Cast becomes -inf there, and a fully
    masked row NaN."""
    target = plan.target
    precisions, roles_in = plan.precisions, plan.roles_in
    found: list = []  # (constant, node, boundary, via)
    for node in index.nodes:
        if precisions[node.id] != target:
            continue
        ri = roles_in[node.id]
        for port, value in enumerate(node.inputs):
            if value is None or ri[port] != _FOLLOW or value.dtype != FLOAT:
                continue
            if value.initializer is not None:  # read directly: converted (clamped) in place
                if direct:
                    found.append((value, node, None, ()))
                continue
            for constant, via in _constants_behind(value, precisions, target):
                found.append((constant, node, value, via))
    facts_of = _range_hazards({id(c): c for c, *_ in found}, target)
    return [
        ForcedReach(constant, node, boundary, via, facts_of[id(constant)])
        for constant, node, boundary, via in found
        if id(constant) in facts_of
    ]


def _range_hazards(constants: dict, target: Precision) -> dict:
    """id(constant) -> RangeFacts for the constants without headroom in the target type. The
    many weights a low-precision plan reads directly are screened in one vectorised pass
    (classify's data rules), and only the suspicious ones judged one by one."""
    elem = target.elem_type
    if elem is None:
        return {}
    screen = {"small_constant_elements": 0, "max_flush_fraction": 1.0}  # only the range verdict is read
    verdicts = _check_constants(constants.values(), elem, screen)
    out = {}
    for key, verdict in verdicts.items():
        if verdict[0] != "data-range":
            continue
        facts = _range_hazard(constants[key], target)
        if facts is not None:
            out[key] = facts
    return out


def _constants_behind(value, precisions: list, target: Precision):
    """(constant, via) for each fp32 constant whose values reach `value`: `value` itself, or one
    read through fp32 ops of hazards.PASS_ON_OPS (at most REACH_DEPTH of them) that produce it."""
    stack: list = [(value, ())]
    seen = set()
    while stack:
        current, via = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if is_constant(current):
            yield current, via
            continue
        producer = current.producer
        if (
            producer is None
            or producer.domain != ""
            or producer.op not in PASS_ON_OPS
            or precisions[producer.id] == target  # its output is low already: its own inputs are judged
            or len(via) >= REACH_DEPTH
        ):
            continue
        for source in producer.inputs:
            if source is not None and source.dtype == FLOAT:
                stack.append((source, (*via, producer)))


def _range_hazard(constant, target: Precision) -> RangeFacts | None:
    """The range facts of a constant in the target type when it has no headroom there, else None."""
    data = constant_array(constant)
    if data is None or not data.size or target.elem_type is None:
        return None
    facts = range_facts(data, target.elem_type)
    return facts if facts.out_of_range else None


def clamp_forced_constants(index: GraphIndex, plan: PrecisionPlan, direct: bool = True) -> None:
    """Record in `plan.clamp_initializers` every constant of a ForcedReach, with a warning naming
    it and the node: the rewrite clamps its values to the target type's finite range where they
    enter low precision (a converted copy is clamped; a cast into the node gets a Clip before it,
    rewrite/apply.py). A constant the plan already clamps is left as it is (no second warning).
    `direct` False leaves out the initializers a low node reads itself (a fresh plan: classify's
    data rules clamp them for a forced node already)."""
    elem = plan.target.elem_type
    if elem is None:
        raise InternalCheckError(f"clamp_forced_constants: target {plan.target} has no element type")
    reaches = forced_low_reach(index, plan, direct)
    by_constant: dict[str, list[ForcedReach]] = {}
    for reach in reaches:
        by_constant.setdefault(reach.constant.name, []).append(reach)
    tname = dtype_name(elem)
    largest = LIMITS[elem][0]
    for name, group in by_constant.items():
        if name in plan.clamp_initializers:
            continue
        first = group[0]
        sentence = range_sentence(name, first.facts, tname)
        nodes = f"node {first.node.label} ({first.node.op})"
        others = len({id(r.node) for r in group}) - 1
        if others:
            nodes += f" and {others} more"
        if not first.via:
            what = (
                f"{nodes}, forced to {tname}, reads it: its values are clamped to ±{largest:g} where they become "
                f"{tname}, and sums with them in {tname} may still overflow"
            )
        else:
            ops = ", ".join(dict.fromkeys(n.op for n in reversed(first.via)))
            what = (
                f"it reaches {nodes}, forced to {tname}, through {ops} (fp32) and the cast into it: values beyond "
                f"±{largest:g} are clamped to it there (a Clip before the cast) instead of becoming ±inf, which "
                f"a fully masked softmax row would turn into NaN"
            )
        message = f"{sentence}; {what}"
        plan.clamp_initializers[name] = message
        plan.warnings.append(PlanWarning("data-range", message, first.node.label))


# ---- a conversion that leaves most of the work fp32 --------------------------------------------
LITTLE_SHARE = 0.5  # below this share of the MatMul/Gemm/Conv work in low precision, the plan warns
LITTLE = "little-conversion"  # its warning code


def warn_little_conversion(index: GraphIndex, plan: PrecisionPlan, work: list | None) -> None:
    """A plan warning when less than LITTLE_SHARE of the main graph's MatMul/Gemm/Conv work (its
    multiply-accumulates, `work`: (node id, MACs or None, ...) per such node; by node count when a
    shape is unknown) ends in the target type: the conversion then gains little, and the summary's
    "converted to bf16" alone would hide it. The warning gives the share, the reason that keeps
    most of that work fp32 (the most common deciding reason, by work) and, when it is the op's
    schema at the model's opset, the first opset whose schema has the type (a bf16 Conv needs 22)."""
    target = plan.target
    sizes = {item[0]: item[1] for item in work} if work is not None else {}  # (node id, MACs, ...)
    candidates = [index.nodes[i] for i in sizes] if work is not None else index.main.nodes
    precisions, planned = plan.precisions, (target, Precision.FP32)
    nodes = [n for n in candidates if n.op in MAC_OPS and precisions[n.id] in planned]
    if not nodes:
        return
    by_macs = all(isinstance(sizes.get(n.id), int) and sizes[n.id] >= 0 for n in nodes)
    weight = {n.id: (sizes[n.id] if by_macs else 1) for n in nodes}
    total = sum(weight.values())
    low = sum(weight[n.id] for n in nodes if plan.precisions[n.id] == target)
    if not total or low >= LITTLE_SHARE * total:
        return
    tname = dtype_name(target.elem_type)
    kept = [n for n in nodes if plan.precisions[n.id] != target]
    if by_macs:
        share = f"{100 * low / total:.1f}% of the MatMul/Gemm/Conv work ({low:,} of {total:,} multiply-accumulates)"
    else:
        share = f"{low} of {total} MatMul/Gemm/Conv nodes (counted by node: some of their shapes are unknown)"
    why = _kept_because(index, plan, kept, weight)
    if why is not None:
        plan.warnings.append(PlanWarning(LITTLE, f"only {share} runs in {tname}: {why}", None))


SCHEMA_LIMITED = "schema-limited"  # the warning code of ops a later opset would let convert


def warn_schema_limits(index: GraphIndex, rules, plan: PrecisionPlan) -> None:
    """One plan warning per op type (beyond MatMul/Gemm/Conv, which warn_little_conversion
    weighs) whose nodes the plan keeps fp32 only because the op's schema at the model's opset
    lacks the target type, where a later opset has it (with the rule files' pins: `rules`):
    e.g. BatchNormalization takes fp16 data with fp32 parameters only from opset 15, so a model
    at opset 11 keeps every one of them fp32. The warning says how many and which opset would let
    them convert."""
    by_op: dict[tuple[str, str], list] = {}
    codes = plan.last_reason_codes()  # without building the node entries
    for node in index.nodes:
        if codes[node.id] == "schema" and plan.precisions[node.id] == Precision.FP32 and node.op not in MAC_OPS:
            if node.op == "BatchNormalization" and any(r.code == BN_KEPT for r in plan.nodes[node.id].reasons):
                continue  # its parameters do not survive the low type: no opset would let it convert
            by_op.setdefault((node.domain, node.op), []).append(node)
    tname = dtype_name(plan.target.elem_type)
    for (domain, op), group in sorted(by_op.items()):
        allowing = opset_admitting(index, rules, group[0], plan.target)  # the rule classification applies
        if allowing is None:
            continue
        plan.warnings.append(
            PlanWarning(
                SCHEMA_LIMITED,
                f"{len(group)} {op} node(s) stay fp32 for {op}'s schema at opset {index.opset(domain)}; "
                f"opset {allowing} lets them run in {tname}: "
                + (
                    f"pass --opset {allowing} to upgrade the model first"
                    if domain == ""  # the index normalises the default domain
                    else f"convert the model to {domain} opset {allowing} first"
                ),
                group[0].label,
            )
        )


# deciding reasons that are the user's own choice: the plan does what was asked, nothing to warn of
_USER_CHOICE = frozenset({"cli-exclude", "node-rule"})


def _kept_because(index: GraphIndex, plan: PrecisionPlan, kept: list, weight: dict) -> str | None:
    """Why the fp32 MatMul/Gemm/Conv nodes `kept` are fp32: the deciding reason that holds most of
    their work, with what would change it; None when that reason is the user's own selection
    (--exclude-op, --exclude-node, a [[nodes]] rule)."""
    entries = plan.nodes
    by_code: dict[str, list] = {}
    for node in kept:
        reasons = entries[node.id].reasons
        by_code.setdefault(reasons[-1].code if reasons else "unknown", []).append(node)
    code, group = max(by_code.items(), key=lambda item: sum(weight[n.id] for n in item[1]))
    if code in _USER_CHOICE:
        return None
    first = group[0]
    reasons = entries[first.id].reasons
    why = reasons[-1].message if reasons else "no reason recorded"
    ops = ", ".join(sorted({n.op for n in group}))
    text = f"{len(group)} of the {len(kept)} fp32 {ops} nodes stay fp32 for the reason '{code}' ({first.label}: {why})"
    if code == "schema":
        opset = index.opset(first.domain) or 0
        allowing = first_opset_with(first.domain, first.op, plan.target, opset)
        if allowing is not None:
            upgrade = (
                f"pass --opset {allowing} to upgrade the model first"
                if first.domain == ""
                else f"convert the model to {first.domain} opset {allowing} first"
            )
            return (
                f"{text}; {first.op} has {dtype_name(plan.target.elem_type)} from opset {allowing}: {upgrade}, "
                "or choose another --precision"
            )
        return f"{text}; no opset of this onnx package gives {first.op} that type: choose another --precision"
    return f"{text}; see `autocast-onnx explain MODEL '{first.name}'`"


def first_opset_with(domain: str, op: str, target: Precision, after: int) -> int | None:
    """The first opset after `after` at which the schema of `op` admits the `target` type for its
    first input (the data a MatMul, Gemm or Conv computes on), or None."""
    elem = target.elem_type
    if elem is None:
        return None
    latest = onnx.defs.onnx_opset_version()
    for version in range(after + 1, latest + 1):
        sig = signatures.lookup(domain, op, version)
        if sig is not None and sig.since_version > after and schema_role(sig, sig.input_param(0), elem) == _FOLLOW:
            return version
    return None
