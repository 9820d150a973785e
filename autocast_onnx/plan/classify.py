"""Stage: classify. Reads the graph index and the rule set and says, for every node, its op
category, which of its ports follow its precision, which are pinned fp32, and the data rules
that fire on its constant inputs. Reads only; produces arrays for the painter."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import onnx

from ..catalog import RuleSet
from ..catalog.kernels import missing_kernel, runtime_label
from ..dtypes import BFLOAT16, FLOAT, FLOAT16, LIMITS, MIXABLE, bf16_bits_to_float, dtype_name, to_half
from ..errors import AutocastError, InternalCheckError
from ..graph import NONTENSOR, GraphIndex, Value, signatures
from ..graph.index import container_param
from ..graph.regions import regions
from ..hazards import PASS_ON_OPS, fp16_lost, range_facts, range_sentence
from ..hazards import thresholds as hazard_thresholds
from ..io import is_external, tensor_array, tensor_bytes, tensor_nbytes
from . import batchnorm
from .masks import sentinels
from .model import PlanWarning, Reason
from .qdq import mark_qdq_units
from .vocab import Category, PortRole, Precision, Seed

log = logging.getLogger(__name__)

# Inputs whose type never matters to the op (only shape or value passes through a cast).
ANY_INPUTS: dict[tuple[str, str], set[int] | None] = {
    ("", "Shape"): None,
    ("", "Size"): None,
    ("", "Cast"): {0},
    ("", "CastLike"): {0},
    ("", "EyeLike"): {0},
    ("", "RandomNormalLike"): {0},
    ("", "RandomUniformLike"): {0},
}
# Ops whose float output type is set by an attribute rather than by an input.
DTYPE_ATTR_OPS = {
    "Cast",
    "EyeLike",
    "RandomNormalLike",
    "RandomUniformLike",
    "RandomNormal",
    "RandomUniform",
    "Bernoulli",
    "ConstantOfShape",
    "Constant",
}

_CONTROL, _KEEP = Category.CONTROL_FLOW.value, Category.KEEP_FP32.value
_FOLLOW, _FP32, _NONE, _UNKNOWN, _ANY, _OWN = (
    PortRole.FOLLOW.value,
    PortRole.FP32.value,
    PortRole.NONE.value,
    PortRole.UNKNOWN.value,
    PortRole.ANY.value,
    PortRole.OWN.value,
)
# categories whose nodes read constants in the plan's precision (the data rules look at those)
_ARITHMETIC = Category.LOW_PRECISION + Category.FOLLOW + Category.CLEAR
_UNPLANNED = Category.NON_FLOAT + Category.CONTROL_FLOW


@dataclass
class Classification:
    """What classification says of every node, in arrays indexed by node id. Painting reads it;
    the plan carries the port roles on to the rewrite."""

    categories: list  # Category code per node (plain str: the hot loops compare codes)
    roles_in: list  # per node: a string of PortRole codes, one per input
    roles_out: list  # per node: a string of PortRole codes, one per output
    seeds: list  # per node: a Seed, or None when nothing fixed its paint
    reasons: list  # per node: list[Reason]
    pins_in: list  # per node: input ports pinned fp32 by a rule file
    pins_out: list
    frozen: list  # per node: True when a float port has an unknown type
    warnings: list = field(default_factory=list)  # (code, message, node label)
    clamp: dict = field(default_factory=dict)  # initializer name -> why (forced low)
    sentinels: dict = field(default_factory=dict)  # mask constant name -> the value its beyond-range entries take
    flush_notes: dict = field(default_factory=dict)  # id(value) -> (value, message)

    @classmethod
    def empty(cls, n: int) -> Classification:
        return cls(
            categories=[None] * n,
            roles_in=[None] * n,
            roles_out=[None] * n,
            seeds=[None] * n,
            reasons=[None] * n,
            pins_in=[()] * n,
            pins_out=[()] * n,
            frozen=[False] * n,
        )


def classify(
    index: GraphIndex,
    rules: RuleSet,
    target: Precision,
    *,
    exclude_ops=(),
    exclude_nodes=(),
    include_nodes=(),
    include_ops=(),
    ranges=None,
    force_fp32=None,
    output_head: bool = True,
    macs: dict[str, int | None] | None = None,
    converted: dict | None = None,
    runtime: str | None = None,
) -> Classification:
    """Categories, port roles and rule/data seeds of every node, in six passes:

      1. categories from the rule files (control-flow nodes are CONTROL_FLOW);
      2. port roles from the op schema and the rule files' pins; unknown types freeze a node,
         a schema without the target type seeds SCHEMA;
      3. node-name rules and command-line selections seed DENY or ALLOW;
      4. calibration ranges (`ranges`, tensor name -> TensorRange) seed DENY;
      5. data rules: out-of-range and flushing constants seed DENY, also through the ops that pass them on;
      6. Q/DQ units (plan/qdq.py): a DequantizeLinear, the op it feeds and the QuantizeLinear of that op's
         output get one precision, so no cast ever splits a quantized unit.

    `force_fp32` (node id -> Reason) keeps chosen nodes fp32 (the accuracy search uses it).
    With `[settings] output_head = "fp32"` in the rules (and `output_head` true: not for training
    graphs), the output heads that hold a small share of the `macs` (first output of each
    MatMul/Gemm/Conv/ConvTranspose -> multiply-accumulates, from graph.shapes.macs_of) are
    seeded DENY before pass 3, which may override them.

    `converted` (fp16 targets: id(TensorProto) -> fp16 bytes) is a plain cache of converted fp32
    initializers: the data rules screen fp32 initializers by converting them, and leave the fp16
    bytes there for the rewrite to store instead of converting again. An entry present before
    classification is a weight converted already and found to lose nothing (the caller's weight
    screen fills it so): its data rules are passed. Only for models held in memory: it keeps the
    converted weights until the rewrite takes them.

    `runtime` ("cuda", "tensorrt"; None or "any": no runtime) keeps fp32, after pass 3, the nodes whose op
    that runtime's kernel table says has no kernel at the target type for the model's opset."""
    target = Precision.target(target)
    result = Classification.empty(len(index.nodes))
    _assign_categories(index, rules, result)
    planned = _assign_port_roles(index, rules, target, result)
    if output_head and rules.output_head.category == "fp32":
        _apply_output_head(index, planned, rules.output_head, macs, result)
    selections = _Selections(
        rules.node_rules, include_nodes, frozenset(include_ops), exclude_nodes, frozenset(exclude_ops)
    )
    _apply_selections(planned, selections, force_fp32, result)
    if runtime not in (None, "any"):
        _apply_runtime_kernels(index, planned, runtime, target, result)
    if ranges:
        _apply_calibration(index, planned, ranges, target, rules.thresholds, result)
    pending = _apply_data_rules(planned, target, rules.thresholds, result, converted)
    _propagate_range(result, pending, index, target, rules.thresholds)
    mark_qdq_units(index, planned, result)
    return result


def _assign_categories(index: GraphIndex, rules: RuleSet, result: Classification) -> None:
    """Pass 1: each node's category from the rule files, looked up once per op type.

    MatMul -> LOW_PRECISION, Softmax -> KEEP_FP32, If -> CONTROL_FLOW, MyCustomOp -> unknown_op"""
    control_reason = Reason(
        "control-flow",
        "control flow: its subgraphs are planned node by node; its own inputs and outputs keep their types",
    )
    category_of: dict = {}  # (domain, op) -> (Category, shared Reason)
    categories, reasons = result.categories, result.reasons
    for node in index.nodes:
        if node.subscopes:
            categories[node.id] = _CONTROL
            reasons[node.id] = [control_reason]
            continue
        domain = node.domain
        known = category_of.get((domain, node.op))
        if known is None:
            category, reason = _category(rules, domain, node.op, node, result.warnings)
            known = category_of[(domain, node.op)] = (category.value, reason)
        categories[node.id] = known[0]
        reasons[node.id] = [known[1]]
    log.debug("classify pass 1 (categories): %d nodes, %d op types", len(index.nodes), len(category_of))


def _assign_port_roles(index: GraphIndex, rules: RuleSet, target: Precision, result: Classification) -> list:
    """Pass 2: the PortRole of every input and output. Returns the nodes that painting decides
    (a float port follows the node's precision; not frozen).

        Resize(x, roi, scales) at fp16 -> roles "pff" (rule-file pins) out "p"
        Cast(to=FLOAT)(h16)          -> roles "a" out "p"   (the author's cast back may be retargeted)
        If(cond)                     -> roles "x" out "o"   (control flow keeps its types)"""
    target_type = target.elem_type
    if target_type is None:
        raise InternalCheckError(f"classify: target {target} has no element type")
    templates: dict = {}
    # (op, category, input types, output types) -> the roles: graphs repeat a few signatures
    by_signature: dict = {}
    planned = []
    categories, seeds, reasons = result.categories, result.seeds, result.reasons
    roles_in, roles_out, pins_in_of, pins_out_of = result.roles_in, result.roles_out, result.pins_in, result.pins_out
    for node in index.nodes:
        nid = node.id
        cat = categories[nid]
        domain = node.domain
        op = node.op
        ins, outs = node.inputs, node.outputs
        signature = (
            domain,
            op,
            cat,
            tuple([_ABSENT if v is None else v.dtype for v in ins]),
            tuple([_ABSENT if v is None else v.dtype for v in outs]),
        )
        known = by_signature.get(signature)
        if known is None:
            key = (domain, op, len(ins), len(outs))
            tmpl = templates.get(key)
            if tmpl is None:
                tmpl = templates[key] = _template(index, rules, domain, op, len(ins), len(outs), target_type)
            container = holds_container(signatures.lookup(domain, op, index.opset(domain)), signature[3], signature[4])
            roles = _roles_of(tmpl, cat, op == "Cast" and domain == "", signature, container)
            known = by_signature[signature] = (*roles, container and cat != _CONTROL, tmpl)
        ri, ro, unknown, container, (t_in, t_out, pins_in, pins_out) = known
        if pins_in and op == "BatchNormalization" and domain == "" and cat not in _UNPLANNED and not unknown:
            ri, ro, pins_in = _batchnorm_roles(node, ri, ro, pins_in, target_type, reasons[nid])
        roles_in[nid] = ri
        roles_out[nid] = ro
        unplanned = cat in _UNPLANNED
        pins_in_of[nid] = pins_in
        pins_out_of[nid] = pins_out
        if unknown:
            result.frozen[nid] = True
            reasons[nid].append(
                Reason(
                    "unknown-type",
                    "a float-capable input or output has no known type; "
                    "the node keeps its types and nothing is cast around it",
                )
            )
            result.warnings.append(
                (
                    "unknown-type",
                    f"node {node.label} ({op}) has tensors of unknown type; it is left as it is",
                    node.label,
                )
            )
            continue
        if container and (_OWN in ri or _OWN in ro):
            reasons[nid].append(_CONTAINER_REASON)
        if unplanned:
            continue
        if _FOLLOW not in ri and _FOLLOW not in ro:
            if (_FP32 in ri or _FP32 in ro) and _FOLLOW not in t_in + t_out and cat != _KEEP:
                seeds[nid] = Seed.SCHEMA
                if pins_in or pins_out:
                    why = (
                        f"the rules pin some of {op}'s ports fp32, and at opset {index.opset(domain)} its schema "
                        f"gives them one type with the node's other tensors: low-precision data would need "
                        f"low-precision parameters, so the node stays fp32"
                    )
                else:
                    why = f"the schema of {op} at opset {index.opset(domain)} has no {target} for this node's tensors"
                reasons[nid].append(Reason("schema", why))
            continue
        planned.append(node)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("classify pass 2 (port roles): %d nodes planned, %d frozen", len(planned), sum(result.frozen))
    return planned


def _batchnorm_roles(node, ri: str, ro: str, pins_in: tuple, target_type: int, reasons: list):
    """An inference BatchNormalization whose scale, bias, mean and variance are constants that
    survive the low type (plan/batchnorm.py): every port follows the node, so its parameters are
    stored in the data's type, as ONNX Runtime's CUDA kernel takes them (it converts them to
    float); the node's reasons say why either way. Returns (roles_in, roles_out, pins_in).

        BatchNormalization(x, scale, bias, mean, var), var ~ 1 -> "ppppp", "p", no pins
        the same with var 1e-7 (flushes in fp16)             -> "fffff", "f": fp32 whole"""
    ins, outs = node.inputs, node.outputs
    if len(ins) != 5 or len(outs) != 1 or any(v is None or v.dtype not in (FLOAT, target_type) for v in [*ins, *outs]):
        return ri, ro, pins_in  # training mode (running statistics out), or another type
    # (parameters already in the target type: a converted model converted again, judged as stored)
    arrays = [constant_array(v) for v in ins[1:]]
    if any(a is None for a in arrays):
        return ri, ro, pins_in
    epsilon = next((a.f for a in node.proto.attribute if a.name == "epsilon"), 1e-5)
    survive, change, said = batchnorm.judge(arrays, epsilon, target_type)
    low = dtype_name(target_type)
    if not survive:
        reasons.append(
            Reason(
                BN_KEPT,
                f"its scale, bias, mean and variance stay fp32: {said} in {low}; ONNX Runtime's CUDA kernel "
                "takes them in the data's type, so the node runs fp32 whole, its data too",
                value=change,
            )
        )
        return ri.replace(_FOLLOW, _FP32), ro.replace(_FOLLOW, _FP32), pins_in
    reasons.append(
        Reason(
            BN_LOW,
            f"its scale, bias, mean and variance are stored in {low} with the data, the one type ONNX Runtime's CUDA "
            f"kernel takes (it converts them to float): {said}",
            value=change,
        )
    )
    return _FOLLOW * len(ri), _FOLLOW * len(ro), ()


BN_LOW, BN_KEPT = "bn-parameters-low", "bn-parameters-fp32"  # reason codes (plan/batchnorm.py)
_ABSENT = -2  # an optional port left empty (a tensor of unknown type has dtype None)
_CONTAINER_REASON = Reason(
    "container",
    "its float tensors go into or come out of a sequence or optional, whose element type the conversion never "
    "changes: they keep their types, with a cast where a neighbour computes in another type",
)


def holds_container(sig, in_types, out_types) -> bool:
    """Whether a node reads or writes a sequence, map, optional or sparse tensor: a port's value
    is not a tensor (NONTENSOR), or its op's schema says so. Its float tensors keep their types
    (PortRole.OWN), as a control-flow node's do: their element type is the container's, which
    nothing converts. The one rule classification and plan replay share."""
    if NONTENSOR in in_types or NONTENSOR in out_types:
        return True
    if sig is None:
        return False
    for types, param_of in ((in_types, sig.input_param), (out_types, sig.output_param)):
        for k, dt in enumerate(types):
            if dt != _ABSENT and container_param(sig, param_of(k)):
                return True
    return False


def node_holds_container(node, sig) -> bool:
    """holds_container for an indexed node (plan replay checks a plan's roles with it)."""
    return holds_container(
        sig,
        tuple(_ABSENT if v is None else v.dtype for v in node.inputs),
        tuple(_ABSENT if v is None else v.dtype for v in node.outputs),
    )


def _roles_of(template, cat: str, is_cast: bool, signature: tuple, container: bool) -> tuple[str, str, bool]:
    """The PortRole codes of a node's inputs and outputs from its op's template, its category and
    its tensors' types (signature[3], signature[4]), and whether a float port has an unknown type.
    The float ports of a control-flow node, and of a node that reads or writes a container
    (`container`, from holds_container), keep their types."""
    t_in, t_out = template[0], template[1]
    control = cat == _CONTROL or container
    unplanned = cat in _UNPLANNED
    roles_in = "".join(_role(dt, t_in[i], control, unplanned) for i, dt in enumerate(signature[3]))
    roles_out = "".join(
        # Only an fp32 cast is the author's "back to float" and may be retargeted; an explicit
        # cast to fp16/bf16 is a deliberate rounding and keeps its type.
        (_FOLLOW if dt == FLOAT else (_OWN if dt in MIXABLE else _NONE))
        if is_cast and dt != _ABSENT
        else _role(dt, t_out[i], control, unplanned)
        for i, dt in enumerate(signature[4])
    )
    return roles_in, roles_out, _UNKNOWN in roles_in or _UNKNOWN in roles_out


def _role(dt, schema_role: str, control: bool, unplanned: bool) -> str:
    """One port's PortRole code from its tensor's type and the role its op's schema gives it."""
    if dt == _ABSENT:
        return _NONE
    if dt in MIXABLE:
        return _OWN if control else schema_role
    if dt is None and schema_role == _FOLLOW and not unplanned:
        return _UNKNOWN
    return _NONE


UNMATCHED = "unmatched-selector"  # warning code: a node rule, pattern or --exclude-op that matched nothing
FALLBACK_REGION = "fallback-region"  # warning code: neighbouring nodes that all lack the --runtime's kernel
HEAD_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
HEAD_LIMIT = 32  # a head longer than this is no head (e.g. a model without a final layer)
HEAD_MAX_SHARE = 0.05  # a head doing more of the model's MatMul/Gemm/Conv work than this stays low


def _apply_output_head(index: GraphIndex, planned, setting, macs, result: Classification) -> None:
    """Pass 2b: for each float output of the main graph, the nodes from it back to the last
    MatMul/Gemm/Conv/ConvTranspose on every path (included) are seeded DENY when their
    multiply-accumulates are at most HEAD_MAX_SHARE of the model's: the output's final rounding
    before a sigmoid, softmax or argmax is where fp16 costs most, and such a head is cheap in fp32.
    A head that does much of the work (a language model's vocabulary projection, the only MatMul
    of a small model) stays low precision, and so does one whose work is unknown. An output that
    passes a float model input on before any MatMul/Gemm/Conv is state, not a head: a decoder's
    present.* cache (Concat(past_key_values.*, k)) keeps the other rules.

        logits = Gemm(h, W) -> prob = Sigmoid(logits) (output) -> Gemm and Sigmoid stay fp32"""
    planned_ids = {node.id for node in planned}
    seeds, reasons = result.seeds, result.reasons
    # the work that can run in low precision: compute nodes the rules and schemas leave free
    # (bf16 Conv has no schema type: a bf16 model's only low-precision work may be its head)
    total = sum(
        macs.get(n.outputs[0].name) or 0
        for n in planned
        if n.op in HEAD_OPS and n.outputs and n.outputs[0] is not None and seeds[n.id] not in (Seed.DENY, Seed.SCHEMA)
    ) if macs else 0  # fmt: skip
    explicit = setting.source.file != "rules/default.toml"  # a user's rule file asked for it: say why not
    report = log.warning if explicit else log.info
    count = 0
    for value in index.main.outputs:
        if value.dtype not in MIXABLE or value.producer is None:
            continue
        head: list = []
        stack, seen = [value.producer], set()
        state = None
        while stack and len(head) <= HEAD_LIMIT and state is None:
            node = stack.pop()
            if node is None or node.id in seen or node.subscopes:
                continue
            seen.add(node.id)
            head.append(node)
            if node.op not in HEAD_OPS:
                for v in node.inputs:
                    if v is None:
                        continue
                    if v.producer is not None:
                        stack.append(v.producer)
                    elif v.kind == "input" and v.dtype in MIXABLE and v.scope is index.main:
                        state = v
        if state is not None:
            log.info("output '%s' passes model input '%s' on: state (a cache), not an output head",
                     value.name, state.name)  # fmt: skip
            continue
        if len(head) > HEAD_LIMIT:
            report("output head of '%s' left to the other rules: over %d nodes back to a MatMul/Gemm/Conv",
                   value.name, HEAD_LIMIT)  # fmt: skip
            continue
        work = [macs.get(n.outputs[0].name) if macs and n.outputs and n.outputs[0] is not None else None
                for n in head if n.op in HEAD_OPS]  # fmt: skip
        if any(m is None for m in work) or not total:
            report("output head of '%s' left to the other rules: the work of its MatMul/Gemm/Conv is "
                   "unknown (shapes not inferred)", value.name)  # fmt: skip
            continue
        share = sum(work) / total  # type: ignore[arg-type]
        if share > HEAD_MAX_SHARE:
            report("output head of '%s' left low precision: it does %.1f%% of the MatMul/Gemm/Conv work "
                   "(the rule keeps heads of at most %.0f%% fp32)",
                   value.name, 100 * share, 100 * HEAD_MAX_SHARE)  # fmt: skip
            continue
        reason = Reason(
            "output-head",
            f"part of the output head of '{value.name}' (the nodes from it back to the last "
            f"MatMul/Gemm/Conv, {100 * share:.1f}% of the MatMul/Gemm/Conv work): kept fp32 by the "
            "output_head setting",
            str(setting.source),
        )
        for node in head:
            if node.id in planned_ids and seeds[node.id] != Seed.DENY:
                seeds[node.id] = Seed.DENY
                reasons[node.id].append(reason)
                count += 1
    log.debug("classify pass 2b (output head): %d nodes seeded fp32", count)


@dataclass(frozen=True)
class _Selections:
    """What forces nodes by name or op type, in the order pass 3 applies them (a later one
    overrides an earlier one): `[[nodes]]` rules, --include-node, --include-op, --exclude-node,
    --exclude-op."""

    node_rules: tuple | list = ()
    include_nodes: tuple | list = ()  # compiled patterns
    include_ops: frozenset = frozenset()  # op types, or domain:OpType
    exclude_nodes: tuple | list = ()  # compiled patterns
    exclude_ops: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.node_rules or self.include_nodes or self.include_ops or self.exclude_nodes or self.exclude_ops)


def _op_key(node, ops: frozenset) -> str | None:
    """The spelling under which `ops` names the node's op type (OpType or domain:OpType), or None."""
    if node.op in ops:
        return node.op
    qualified = f"{node.domain}:{node.op}"
    return qualified if qualified in ops else None


def _forced(node, selections: _Selections, used: set):
    """The (Seed, Reason) the last selector matching `node` gives it (see _Selections), or None;
    each matching selector is added to `used`."""
    name, op = node.name, node.op
    forced = None
    for k, rule in enumerate(selections.node_rules):
        if rule.matches(name, op):
            used.add(("rule", k))
            seed = Seed.DENY if rule.precision == "fp32" else Seed.ALLOW
            why = f"node rule forces {rule.precision}" + (f": {rule.why}" if rule.why else "")
            forced = (seed, Reason("node-rule", why, str(rule.source)))
    for k, pattern in enumerate(selections.include_nodes):
        if pattern.search(name):
            used.add(("--include-node", k))
            forced = (Seed.ALLOW, Reason("cli-include", f"--include-node {pattern.pattern!r} forces low precision"))
    key = _op_key(node, selections.include_ops) if selections.include_ops else None
    if key is not None:
        used.add(("--include-op", key))
        forced = (Seed.ALLOW, Reason("cli-include", f"--include-op {key} forces low precision"))
    for k, pattern in enumerate(selections.exclude_nodes):
        if pattern.search(name):
            used.add(("--exclude-node", k))
            forced = (Seed.DENY, Reason("cli-exclude", f"--exclude-node {pattern.pattern!r} keeps it fp32"))
    key = _op_key(node, selections.exclude_ops) if selections.exclude_ops else None
    if key is not None:
        used.add(("--exclude-op", key))
        forced = (Seed.DENY, Reason("cli-exclude", f"--exclude-op {op} keeps it fp32"))
    return forced


def _apply_selections(planned, selections: _Selections, force_fp32, result: Classification) -> None:
    """Pass 3: `[[nodes]]` rules, then --include-node, --include-op, --exclude-node, --exclude-op
    and the accuracy search's forced nodes; a later one overrides an earlier one, so exclusion
    beats inclusion.

        node "attn/softmax_in" matching [[nodes]] match="attn/" precision="fp32" -> Seed.DENY
        Softmax under --include-op Softmax                                      -> Seed.ALLOW"""
    selecting = bool(selections)
    if not (selecting or force_fp32):
        return
    seeds, reasons = result.seeds, result.reasons
    count = 0
    used: set = set()  # the rules, patterns and op types that matched a node
    for node in planned:
        forced = _forced(node, selections, used) if selecting else None
        if force_fp32 and node.id in force_fp32:
            forced = (Seed.DENY, force_fp32[node.id])
        if forced is not None:
            seeds[node.id] = forced[0]
            reasons[node.id].append(forced[1])
            count += 1
    _warn_unmatched(selections, used, result)
    log.debug("classify pass 3 (selections): %d nodes seeded by rules and flags", count)


def _apply_runtime_kernels(index: GraphIndex, planned, runtime: str, target: Precision, result) -> None:
    """The runtime's kernels (--runtime): a planned node whose op `runtime` registers no kernel for at the target
    type and the model's opset, or whose planned port types split a group of type parameters the runtime's
    kernel binds to one type, seeds DENY (reason "no-kernel"); the table not knowing (None) changes nothing, and
    a node a selection forced low keeps its seed, with the reason noted.

        GridSample at opset 16, fp16, runtime cuda (registered for float only) -> Seed.DENY "no-kernel"
        MatMul at opset 12, bf16, runtime cuda (bf16 from opset 13)          -> Seed.DENY "no-kernel"
        BatchNormalization at 17, fp16 data, scale/bias/mean/var pinned fp32  -> Seed.DENY "no-kernel" """
    seeds, reasons = result.seeds, result.reasons
    elem_type = target.elem_type
    if elem_type is None:
        raise InternalCheckError(f"classify: target {target} has no element type")
    table = f"data/kernels_{runtime}.json"  # the reason's source, which names the runtime for the summary
    answers: dict = {}  # (domain, op, roles) -> the message, or None where the runtime has the kernel or cannot tell
    denied: list = []  # the nodes seeded DENY here, in the index's order
    for node in planned:
        if seeds[node.id] == Seed.DENY:
            continue
        key = (node.domain, node.op, result.roles_in[node.id], result.roles_out[node.id])
        if key not in answers:
            answers[key] = _missing_kernel(index, node, runtime, elem_type, key[2:])
        message = answers[key]
        if message is None:
            continue
        if seeds[node.id] == Seed.ALLOW:
            reasons[node.id].append(
                Reason("no-kernel", f"{message}; converted anyway because a rule forces it low", table)
            )
        else:
            seeds[node.id] = Seed.DENY
            reasons[node.id].append(Reason("no-kernel", message, table))
            denied.append(node)
    _warn_regions(denied, runtime, result)


def _warn_regions(denied: list, runtime: str, result) -> None:
    """One plan warning for the regions of neighbouring nodes (two or more, joined by tensors) that all lack the
    runtime's kernel: ONNX Runtime would run each region on the CPU provider as one block, with copies only at its
    edges, and the user may rather move the region (or the model's opset) than read node after node."""
    members = {node.id: node for node in denied}

    def readers(nid: int):
        for value in members[nid].outputs:
            for consumer, _ in value.consumers if value is not None else ():
                yield consumer.id

    found = [[members[i] for i in region] for region in regions(members, readers)]
    big = sorted((r for r in found if len(r) > 1), key=len, reverse=True)
    if not big:
        return
    shown = "; ".join(
        f"{len(r)} nodes from '{r[0].name or r[0].op}' ({', '.join(sorted({n.op for n in r}))})" for r in big[:3]
    )
    more = f"; and {len(big) - 3} more" if len(big) > 3 else ""
    result.warnings.append(
        (
            FALLBACK_REGION,
            f"{len(big)} region(s) of neighbouring nodes have no {runtime} kernel and stay fp32 together: "
            f"{shown}{more}",
            None,
        )
    )


RUNTIME_FALLBACK = "runtime-fallback"  # warning code: nodes planned low that ONNX Runtime's CUDA provider lacks


def warn_cuda_fallbacks(index: GraphIndex, plan) -> None:
    """A plan made for no runtime (--runtime any, the default) warns once when nodes it plans low have no kernel in
    ONNX Runtime's CUDA provider: deployed there, each runs on the CPU provider with copies around it (fp16
    BatchNormalization with fp32 parameters sent every one of resnet_tiny's nine to the CPU on an H200, 0.10x the
    fp32 model's speed). The plan itself stays as the schemas allow; --runtime cuda keeps such nodes fp32."""
    target = plan.target
    elem_type = target.elem_type
    if elem_type is None:
        return
    answers: dict = {}
    ops: dict[str, int] = {}
    for node in index.nodes:
        if plan.precisions[node.id] != target:
            continue
        key = (node.domain, node.op, plan.roles_in[node.id], plan.roles_out[node.id])
        if key not in answers:
            answers[key] = _missing_kernel(index, node, "cuda", elem_type, key[2:])
        if answers[key] is not None:
            ops[node.op] = ops.get(node.op, 0) + 1
    if ops:
        listed = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
        plan.warnings.append(
            PlanWarning(
                RUNTIME_FALLBACK,
                f"{sum(ops.values())} node(s) planned {target} have no kernel in {runtime_label('cuda')} ({listed}): "
                "on ONNX Runtime's CUDA provider each would run on the CPU with copies around it; pass --runtime cuda "
                "to keep them fp32 (or plan for tensorrt or dml)",
            )
        )


def _missing_kernel(index: GraphIndex, node, runtime: str, elem_type: int, roles) -> str | None:
    """Why `runtime` cannot run `node` planned in `elem_type` (its ports' roles `roles`: inputs, outputs), or None:
    the follow ports take the low type, the fp32 ones (pins) float."""
    opset = index.opset(node.domain)
    if not opset:
        return None
    sig = signatures.lookup(node.domain, node.op, opset)
    planned = {_FOLLOW: elem_type, _FP32: FLOAT}
    param_types = sig.param_types(*([planned.get(r) for r in ports] for ports in roles)) if sig else {}
    return missing_kernel(runtime, node.domain, node.op, opset, [elem_type], param_types)


def _warn_unmatched(selections: _Selections, used: set, result: Classification) -> None:
    """Nothing silent: a selector that matched no node whose precision it could set did nothing."""
    tail = "whose precision it could set (only float-computing nodes are planned)"
    for k, rule in enumerate(selections.node_rules):
        if ("rule", k) not in used:
            what = f"match {rule.pattern.pattern!r}" if rule.pattern is not None else f"name {rule.name!r}"
            ops = f" (op_types {', '.join(sorted(rule.op_types))})" if rule.op_types else ""
            result.warnings.append((UNMATCHED, f"[[nodes]] {what}{ops} at {rule.source} matches no node {tail}", None))
    for flag, patterns in (("--include-node", selections.include_nodes), ("--exclude-node", selections.exclude_nodes)):
        for k, pattern in enumerate(patterns):
            if (flag, k) not in used:
                result.warnings.append((UNMATCHED, f"{flag} {pattern.pattern!r} matches no node {tail}", None))
    for flag, op_types in (("--include-op", selections.include_ops), ("--exclude-op", selections.exclude_ops)):
        for op in sorted(op_types):
            if (flag, op) not in used:
                result.warnings.append((UNMATCHED, f"{flag} {op} matches no node {tail}", None))


def _apply_calibration(index, planned, ranges, target: Precision, thresholds, result: Classification) -> None:
    """Pass 4: a node of the main graph holding a tensor that left the target type's safe range on
    the calibration data is seeded DENY (a node forced low keeps it and gets a warning).

        fc2 (MatMul) with max |fc2_out| = 1.9e5 on the data -> Seed.DENY, reason "calibration" """
    seeds, reasons = result.seeds, result.reasons
    count = 0
    for node in planned:
        nid = node.id
        if result.categories[nid] not in _ARITHMETIC or node.scope is not index.main:
            continue
        measured = _calibration_verdict(
            node, result.roles_in[nid], result.roles_out[nid], ranges, target.elem_type, thresholds
        )
        if measured is None:
            continue
        if seeds[nid] == Seed.ALLOW:
            result.warnings.append(
                ("calibration", f"node {node.label}: {measured.message}; forced to {target} anyway", node.label)
            )
            reasons[nid].append(measured)
        elif seeds[nid] != Seed.DENY:
            seeds[nid] = Seed.DENY
            reasons[nid].append(measured)
            count += 1
    log.debug("classify pass 4 (calibration): %d nodes kept fp32 by measured ranges", count)


def _apply_data_rules(planned, target: Precision, thresholds, result: Classification, converted=None) -> list:
    """Pass 5: constants a node would convert (fp32 initializers and Constant outputs at a FOLLOW
    port) go through the data rules in one vectorised batch. Returns the (node, value) pairs
    checked, for the propagation through the ops that pass them on.

        Add(scores, mask) with mask = -3.4e38             -> Seed.DENY, reason "data-range"
        Add(var, eps) with eps = 1e-12 at fp16             -> Seed.DENY, reason "data-flush"
        the same under a rule forcing fp16                 -> converted, clamped, with a warning"""
    seeds, reasons = result.seeds, result.reasons
    pending = []
    for node in planned:
        nid = node.id
        if result.categories[nid] not in _ARITHMETIC or seeds[nid] == Seed.DENY:
            continue
        ri = result.roles_in[nid]
        for i, value in enumerate(node.inputs):
            if (
                value is not None
                and ri[i] == _FOLLOW
                and value.dtype == FLOAT
                and (value.initializer is not None or (value.producer is not None and value.producer.op == "Constant"))
            ):  # is_constant(value), inlined: this runs for every input of every planned node
                pending.append((node, value))
    target_type = target.elem_type
    if target_type is None:
        raise InternalCheckError(f"classify: target {target} has no element type")
    verdicts = _check_constants({id(v): v for _, v in pending}.values(), target_type, thresholds, converted)
    masks = _mask_sentinels(pending, verdicts, target_type, result)
    count = 0
    for node, value in pending:
        verdict = verdicts.get(id(value))
        if verdict is None:
            continue
        nid = node.id
        kind, message, measured = verdict
        if value.name in masks:  # retargeted, not kept fp32 (plan/masks.py); nothing to pass on either
            reasons[nid].append(Reason("mask-sentinel", masks[value.name], value=measured))
            continue
        if kind == "note":
            result.flush_notes[id(value)] = (value, message)
            continue
        if seeds[nid] == Seed.ALLOW:
            reasons[nid].append(
                Reason(kind, f"{message}; converted anyway because a rule forces low precision", value=measured)
            )
            result.clamp[value.name] = message  # an initializer, or a Constant output (both converted clamped)
            result.warnings.append(
                (
                    kind,
                    f"node {node.label}: {message}, forced to {target} (values are clamped to the finite range)",
                    node.label,
                )
            )
        elif seeds[nid] != Seed.DENY:
            seeds[nid] = Seed.DENY
            reasons[nid].append(Reason(kind, message, value=measured))
            count += 1
    log.debug("classify pass 5 (data rules): %d constants checked, %d nodes kept fp32", len(pending), count)
    return [(node, value, None if value.name in masks else verdicts.get(id(value))) for node, value in pending]


def _mask_sentinels(pending, verdicts: dict, target_type: int, result: Classification) -> dict[str, str]:
    """The attention-mask sentinels among the out-of-range constants (plan/masks.py): recorded in
    `result.sentinels` (name -> the value they take); returns name -> the reason's sentence."""
    candidates = [v for _, v in pending if (verdicts.get(id(v)) or ("",))[0] == "data-range"]
    if not candidates:
        return {}
    found = sentinels(candidates, constant_array, target_type)
    said = {}
    for name, (value, softmaxes) in found.items():
        result.sentinels[name] = value
        said[name] = (
            f"reads the attention-mask sentinel '{name}', whose values beyond the {dtype_name(target_type)} range "
            f"reach only {len(softmaxes)} Softmax input(s): they become {value:g} there (plan/masks.py), which "
            "masks as they did without overflowing when added to the scores, so this node need not stay fp32"
        )
    return said


def is_constant(value: Value) -> bool:
    """An initializer (or an input's default) or the output of a Constant node."""
    return value.initializer is not None or (value.producer is not None and value.producer.op == "Constant")


def _propagate_range(result: Classification, checked, index: GraphIndex, target: Precision, thresholds) -> None:
    """Pass 5, continued. A clear op (Transpose, Reshape, Identity, ...) or an op of
    hazards.PASS_ON_OPS (Where, Expand, Add, ...: the set the linter's AC203 follows) passes an
    out-of-range constant on, and so does a Loop or Scan that takes it as a loop-carried or
    scanned input: whatever reads the result in low precision would overflow too. Such readers of
    any category but keep_fp32 stay fp32, with the constant and the op named in the reason.

        mask(-3.4e38) -> Transpose -> Add(scores, .)   the Add -> Seed.DENY "reads 'mask' through Transpose"
        Where(c, 0, -3.4e38) -> Expand -> MultiHeadAttention   -> Seed.DENY "reads '...' through Expand" """
    work = []
    for _, value, verdict in checked:
        if verdict is not None and verdict[0] == "data-range":
            work.append((value, value, verdict, None))
    # constants that go straight into a control-flow node never reach the data rules above
    direct: dict[int, Value] = {}
    for node in index.nodes:
        if node.subscopes and node.op in ("Loop", "Scan"):
            for value in node.inputs:
                if value is not None and value.dtype == FLOAT and is_constant(value):
                    direct[id(value)] = value
    if direct:
        target_type = target.elem_type
        if target_type is None:
            raise InternalCheckError(f"classify: target {target} has no element type")
        for vid, verdict in _check_constants(direct.values(), target_type, thresholds).items():
            if verdict[0] == "data-range":
                work.append((direct[vid], direct[vid], verdict, None))
    categories, seeds = result.categories, result.seeds
    seen = set()
    while work:
        value, source, verdict, via = work.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        for consumer, port in value.consumers:
            j = consumer.id
            if categories[j] == Category.CONTROL_FLOW:
                for sub in consumer.subscopes:
                    if (
                        consumer.op in ("Loop", "Scan")
                        and port < len(sub.inputs)
                        and (consumer.op == "Scan" or port >= 2)
                    ):
                        work.append((sub.inputs[port], source, verdict, consumer))
                continue
            if result.roles_in[j][port] not in (_FOLLOW + _ANY) or categories[j] == Category.NON_FLOAT:
                continue
            if categories[j] == Category.CLEAR or (consumer.op in PASS_ON_OPS and consumer.domain == ""):
                ro = result.roles_out[j]
                for k, out in enumerate(consumer.outputs):
                    if out is not None and ro[k] == _FOLLOW:
                        work.append((out, source, verdict, consumer))
            if via is None or seeds[j] in (Seed.DENY, Seed.ALLOW) or categories[j] == Category.KEEP_FP32:
                continue  # direct readers were judged by the data rules already; fp32 ops stay fp32
            seeds[j] = Seed.DENY
            result.reasons[j].append(
                Reason(
                    "data-range",
                    f"reads '{source.name}' through {via.op} ({via.label}): {verdict[1]}",
                    value=verdict[2],
                )
            )


def _calibration_verdict(node, roles_in, roles_out, ranges, target, thresholds):
    """A Reason when a tensor the node would hold in the target type left its safe range on the
    calibration data, else None."""
    max_value, tiny = LIMITS[target]
    limit = max_value / thresholds["calibration_headroom"]
    tname = dtype_name(target)
    ports = [(v, r) for v, r in zip(node.inputs, roles_in)] + [(v, r) for v, r in zip(node.outputs, roles_out)]
    worst = None
    for value, role in ports:
        if value is None or role != _FOLLOW:
            continue
        measured = ranges.get(value.name)
        if measured is None:
            continue
        if measured.max_abs > limit and (worst is None or measured.max_abs > worst[1]):
            worst = (value.name, measured.max_abs, "over")
        elif 0 < measured.max_abs < tiny / 2 and worst is None:
            worst = (value.name, measured.max_abs, "flush")
    if worst is None:
        return None
    name, v, kind = worst
    if kind == "over":
        message = (
            f"calibration: max |{name}| = {v:.4g} exceeds {limit:.4g} (the {tname} maximum / "
            f"calibration_headroom {thresholds['calibration_headroom']:g})"
        )
    else:
        message = f"calibration: max |{name}| = {v:.3g}: every value flushes to zero in {tname}"
    return Reason("calibration", message, "rules/default.toml [thresholds] calibration_headroom", value=v)


CATEGORY_SENTENCE = {
    "low_precision": "runs in low precision",
    "follow": "follows its inputs (low precision when fed by low-precision nodes and reached by no fp32)",
    "keep_fp32": "always stays fp32",
    "clear": "moves data without arithmetic and takes its neighbours' precision",
    "non_float": "computes on no float tensor and is left as it is",
    "control_flow": "runs its bodies, whose nodes are planned one by one",
}


def _category(rules, domain, op, node, warnings) -> tuple[Category, Reason]:
    op_rule = rules.op_rule(domain, op)
    if op_rule is not None:
        sentence = CATEGORY_SENTENCE.get(op_rule.category, f"is in category {op_rule.category}")
        return Category.from_rule_name(op_rule.category), Reason(
            "op-category", f"{op} {sentence} (category {op_rule.category}). Why: {op_rule.why}", str(op_rule.source)
        )
    qualified = f"{domain}:{op}" if domain else op
    warnings.append(
        ("unknown-op", f"op {qualified} is not in any rule file; its nodes are {rules.unknown_op.category}", node.label)
    )
    return Category.from_rule_name(rules.unknown_op.category), Reason(
        "unknown-op",
        f"no rule names {qualified}; unknown ops are {rules.unknown_op.category}",
        str(rules.unknown_op.source),
    )


def schema_role(sig, param, target: int) -> str:
    """The role the op's schema gives a port for the target element type: FOLLOW when the schema
    admits it (or says nothing), FP32 when it admits only fp32 of the two, NONE otherwise. The
    one schema rule classification and plan replay share."""
    if sig is None or param is None:
        return _FOLLOW
    allowed = sig.allowed(param)
    if allowed is None or target in allowed:
        return _FOLLOW
    if FLOAT in allowed:
        return _FP32
    return _NONE


def opset_admitting(index, rules, node, target: Precision) -> int | None:
    """The first opset after the model's at which `node`'s op would not be kept fp32 for its
    schema: the schema there, with the rule files' pins, lets some port follow the node into the
    `target` type (the test that seeds Seed.SCHEMA, at another version). None when no opset of
    this onnx package does."""
    after = index.opset(node.domain) or 0
    n_in, n_out = len(node.inputs), len(node.outputs)
    elem = Precision.target(target).elem_type
    if elem is None:
        return None
    for version in range(after + 1, onnx.defs.onnx_opset_version() + 1):
        sig = signatures.lookup(node.domain, node.op, version)
        if sig is None or sig.since_version <= after:
            continue
        t_in, t_out, _, _ = _template(index, rules, node.domain, node.op, n_in, n_out, elem, sig=sig)
        if _FOLLOW in t_in + t_out:
            return version
    return None


def _template(index, rules, domain, op, n_in, n_out, target: int, sig=None):
    """The roles an op's ports take from its schema (`sig`: the one at the model's opset unless
    given) and the rule files' pins, before the tensors' actual types are known: (roles_in,
    roles_out, pinned inputs, pinned outputs)."""
    if sig is None:
        sig = signatures.lookup(domain, op, index.opset(domain))
    if sig is None and domain == "":
        raise AutocastError(
            f"op '{op}' does not exist in the default ONNX domain at opset {index.opset('')}",
            index.where,
            "the model is corrupted or needs a newer onnx package",
        )
    pin = rules.pin(domain, op)
    pins_in = pin.inputs if pin else ()
    pins_out = pin.outputs if pin else ()
    any_in: set[int] | Literal[False] | None = ANY_INPUTS.get((domain, op), False)

    def role(param, pinned) -> str:
        return _FP32 if pinned else schema_role(sig, param, target)

    t_in = []
    for i in range(n_in):
        if any_in is None or (any_in and i in any_in):
            # The type does not matter to the op, but its schema must still admit it.
            allowed = sig.allowed(sig.input_param(i)) if sig is not None else None
            t_in.append(_FP32 if allowed is not None and target not in allowed and FLOAT in allowed else _ANY)
        else:
            t_in.append(role(sig.input_param(i) if sig else None, i in pins_in))
    t_out = [role(sig.output_param(i) if sig else None, i in pins_out) for i in range(n_out)]
    if sig is not None and (pins_in or pins_out):
        # A pinned port that shares its type parameter with a port that would follow the node
        # (BatchNormalization's parameters and data before opset 15) cannot stay fp32 while the
        # data goes low: the whole group, and so the node, stays fp32.
        pinned = {sig.input_param(i) for i in pins_in if i < n_in} | {
            sig.output_param(i) for i in pins_out if i < n_out
        }
        pinned.discard(None)
        for i in range(n_in):
            if t_in[i] == _FOLLOW and sig.input_param(i) in pinned:
                t_in[i] = _FP32
        for i in range(n_out):
            if t_out[i] == _FOLLOW and sig.output_param(i) in pinned:
                t_out[i] = _FP32
    return "".join(t_in), "".join(t_out), tuple(p for p in pins_in if p < n_in), tuple(p for p in pins_out if p < n_out)


def constant_array(value: Value):
    """The fp32 data of an initializer or Constant-node output, or None if not constant."""
    if value.initializer is not None:  # an initializer, or the default of an input
        array = tensor_array(value.initializer, value.scope.base_dir)
        if value.initializer.data_type == BFLOAT16:
            return bf16_bits_to_float(array)
        return array
    producer = value.producer
    if producer is not None and producer.op == "Constant" and producer.domain == "":
        for attr in producer.proto.attribute:
            if attr.name == "value":  # external data: read from the model's folder only (io.tensor_bytes)
                what = f"tensor {attr.t.name!r} (node {producer.name!r}, attribute 'value')"
                array = tensor_array(attr.t, value.scope.base_dir, what=what)
                return bf16_bits_to_float(array) if attr.t.data_type == BFLOAT16 else array
            if attr.name == "value_float":
                return np.array(attr.f, dtype=np.float32)
            if attr.name == "value_floats":
                return np.array(list(attr.floats), dtype=np.float32)
    return None


def _check_constants(values, target: int, thresholds, converted: dict | None = None) -> dict:
    """Data-rule verdicts for fp32 constants, keyed by id(value); values that pass are absent.
    Initializers stored as raw bytes are screened in one vectorised pass over all of them, and
    only the suspicious ones get the exact verdict. With `converted` (fp16 target: the cache of
    classify) the screen is the conversion itself: a tensor is suspicious when some value became
    inf or NaN (overflow, or was not finite), landed on 65504 (no headroom: hazards.py) or became
    zero from nonzero (flush), and its fp16 bytes are kept in `converted` under id(TensorProto)
    for the rewrite. A tensor already in `converted` was converted and found to lose nothing: it
    is not read at all."""
    out = {}
    sizes_in, owners = [], []
    payloads = converted if target == FLOAT16 else None
    for value in values:
        tensor = value.initializer
        if payloads is not None and tensor is not None and id(tensor) in payloads:
            continue
        if tensor is not None and (tensor.HasField("raw_data") or is_external(tensor)):
            size = tensor_nbytes(tensor)
            if size:
                sizes_in.append(size)
                owners.append(value)
            continue
        data = constant_array(value)
        if data is not None and data.size:
            verdict = _verdict(value, data, target, thresholds)
            if verdict:
                out[id(value)] = verdict
    tiny = LIMITS[target][1]
    edge_at = hazard_thresholds(target)[0]
    for group in chunked(sizes_in):
        # one chunk of tensors in memory at a time (external data is read here, not before)
        raws = {k: tensor_bytes(owners[k].initializer, owners[k].scope.base_dir) for k in group}
        if len(group) == 1:  # one large tensor: its verdict is one pass, the screening would be another
            k = group[0]
            verdict = _verdict(owners[k], np.frombuffer(raws[k], dtype="<f4"), target, thresholds)
            if verdict:
                out[id(owners[k])] = verdict
            continue
        flat = np.frombuffer(b"".join(raws[k] for k in group), dtype="<f4")
        sizes = np.fromiter((len(raws[k]) // 4 for k in group), dtype=np.int64, count=len(group))
        if payloads is not None and target == FLOAT16:
            del raws
            for k in _screen_by_conversion(flat, sizes, group, owners, payloads):
                value = owners[k]
                tensor = value.initializer
                verdict = _verdict(value, np.frombuffer(tensor_bytes(tensor, value.scope.base_dir), dtype="<f4"),
                                   target, thresholds)  # fmt: skip
                if verdict:
                    out[id(value)] = verdict
            continue
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        keep = sizes > 0
        mag = np.abs(flat)
        with np.errstate(invalid="ignore"):
            finite_mag = np.where(np.isfinite(mag), mag, 0.0)
            largest = np.maximum.reduceat(finite_mag, starts[keep]) if flat.size else np.zeros(0)
            smallest = np.minimum.reduceat(np.where(mag > 0, mag, np.inf), starts[keep]) if flat.size else np.zeros(0)
        suspicious = (largest > edge_at) | (smallest < tiny / 2)
        kept = [k for k, ok in zip(group, keep) if ok]
        for j in np.nonzero(suspicious)[0]:
            k = kept[j]
            value = owners[k]
            verdict = _verdict(value, np.frombuffer(raws[k], dtype="<f4"), target, thresholds)
            if verdict:
                out[id(value)] = verdict
    return out


def _screen_by_conversion(flat: np.ndarray, sizes: np.ndarray, group: list, owners: list, payloads: dict) -> list:
    """Convert one chunk of fp32 tensors (concatenated in `flat`, `sizes` elements each) to fp16,
    store each tensor's fp16 bytes in `payloads`, and return the positions (in `group`) of the
    tensors whose conversion lost range: a value now inf or NaN, or on the largest finite value
    (no headroom left: hazards.py), or now zero where it was not."""
    half = to_half(flat)
    view = half.view(np.uint8).data
    ends = np.cumsum(sizes)
    offset = 0
    for k, n in zip(group, sizes.tolist()):
        payloads[id(owners[k].initializer)] = view[2 * offset : 2 * (offset + n)]
        offset += n
    lost = fp16_lost(flat, half)
    return [group[j] for j in np.unique(np.searchsorted(ends, lost, side="right")).tolist()]


CHUNK_BYTES = 64 * 2**20


def chunked(sizes, limit: int = CHUNK_BYTES):
    """Group consecutive indices of `sizes` (byte counts, or byte strings) into runs of at most
    `limit` bytes (one item may be larger), so vectorised passes over many tensors need bounded
    extra memory."""
    group: list[int] = []
    total = 0
    for k, item in enumerate(sizes):
        n = item if isinstance(item, int) else len(item)
        if group and total + n > limit:
            yield group
            group, total = [], 0
        group.append(k)
        total += n
    if group:
        yield group


def _verdict(value: Value, data: np.ndarray, target: int, thresholds):
    facts = range_facts(data, target)
    largest, flush, nonzero = facts.largest, facts.flush, facts.nonzero
    tname = dtype_name(target)
    if facts.out_of_range:
        return ("data-range", range_sentence(value.name, facts, tname), largest)
    if flush:
        small = thresholds["small_constant_elements"]
        fraction = flush / max(nonzero, 1)
        if data.size <= small:
            tiny = float(np.abs(data[(data != 0)]).min())
            if flush == nonzero:
                return (
                    "data-flush",
                    f"small constant '{value.name}' would become zero in {tname} "
                    f"(smallest nonzero |x| = {tiny:.3g}), like an epsilon",
                    tiny,
                )
            return (
                "note",
                f"{flush} of {nonzero} nonzero values of small constant '{value.name}' flush to "
                f"zero in {tname} (smallest |x| = {tiny:.3g})",
                tiny,
            )
        if fraction > thresholds["max_flush_fraction"]:
            return (
                "data-flush",
                f"{fraction:.2%} of the nonzero values of '{value.name}' flush to zero in {tname}",
                fraction,
            )
        return (
            "note",
            f"{flush} of {nonzero} nonzero values of '{value.name}' flush to zero in {tname} "
            f"({fraction:.3%}, under max_flush_fraction)",
            fraction,
        )
    return False
