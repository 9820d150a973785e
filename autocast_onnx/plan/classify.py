"""Stage: classify. Reads the graph index and the rule set and says, for every node, its op
category, which of its ports follow its precision, which are pinned fp32, and the data rules
that fire on its constant inputs. Reads only; produces arrays for the painter."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import numpy_helper

from ..catalog import RuleSet
from ..errors import AutocastError
from ..dtypes import BFLOAT16, FLOAT, FLOAT16, LIMITS, MIXABLE, bf16_bits_to_float, dtype_name, range_report
from ..io import is_external, tensor_array, tensor_bytes, tensor_nbytes
from ..graph import GraphIndex, Value
from ..graph import signatures
from .model import Reason

CAT_CODE = {"low_precision": "L", "follow": "F", "keep_fp32": "K", "clear": "C", "non_float": "N"}
CAT_NAME = {v: k for k, v in CAT_CODE.items()} | {"X": "control_flow"}

# Inputs whose type never matters to the op (only shape or value passes through a cast).
ANY_INPUTS = {
    ("", "Shape"): None, ("", "Size"): None, ("", "Cast"): {0}, ("", "CastLike"): {0},
    ("", "EyeLike"): {0}, ("", "RandomNormalLike"): {0}, ("", "RandomUniformLike"): {0},
}
# Ops whose float output type is set by an attribute rather than by an input.
DTYPE_ATTR_OPS = {"Cast", "EyeLike", "RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform",
                  "Bernoulli", "ConstantOfShape", "Constant"}


@dataclass
class Classification:
    cat: list                   # per node id: L F K C N X
    roles_in: list              # per node id: string of role chars, one per input
    roles_out: list
    seed: list                  # per node id: None, "deny", "allow" (forced) from rules/data
    reasons: list               # per node id: list[Reason]
    pins_in: list
    pins_out: list
    warnings: list = field(default_factory=list)
    clamp: dict = field(default_factory=dict)      # initializer name -> why
    flush_notes: dict = field(default_factory=dict)  # value id -> (message)
    frozen: list = None


def classify(index: GraphIndex, rules: RuleSet, target: int, *, exclude_ops=(), exclude_nodes=(),
             include_nodes=(), ranges=None, force_fp32=None) -> Classification:
    """Categories, port roles and rule/data seeds of every node. `ranges` (tensor name ->
    TensorRange from calibration) adds measured-range seeds; `force_fp32` (node id -> Reason)
    keeps chosen nodes fp32 (the accuracy search uses it)."""
    n = len(index.nodes)
    cls = Classification(cat=[None] * n, roles_in=[None] * n, roles_out=[None] * n, seed=[None] * n,
                         reasons=[None] * n, pins_in=[()] * n, pins_out=[()] * n, frozen=[False] * n)
    templates: dict = {}
    node_rules = rules.node_rules
    has_name_rules = bool(node_rules or exclude_nodes or include_nodes)
    excl_ops = set(exclude_ops)
    thresholds = rules.thresholds
    category_of: dict = {}    # (domain, op) -> (category code, shared Reason)
    pending_data = []         # (node, port, value) whose constant input must pass the data rules
    control_reason = Reason("control-flow", "control flow: its subgraphs are planned node by node; "
                            "its own inputs and outputs keep their types")
    for node in index.nodes:
        nid = node.id
        domain = "" if node.domain == "ai.onnx" else node.domain
        op = node.op
        if node.subscopes:
            cat, first = "X", control_reason
        else:
            known = category_of.get((domain, op))
            if known is None:
                known = category_of[(domain, op)] = _category(rules, domain, op, node, cls.warnings)
            cat, first = known
        reasons = [first]
        cls.cat[nid] = cat

        # Port roles.
        key = (domain, op, len(node.inputs), len(node.outputs))
        tmpl = templates.get(key)
        if tmpl is None:
            tmpl = templates[key] = _template(index, rules, domain, op, len(node.inputs), len(node.outputs), target)
        t_in, t_out, pins_in, pins_out = tmpl
        roles_in = []
        unknown = False
        for i, value in enumerate(node.inputs):
            if value is None:
                roles_in.append("x")
                continue
            dt = value.dtype
            if dt in MIXABLE:
                roles_in.append("o" if cat == "X" else t_in[i])
            elif dt is None and t_in[i] == "p" and cat not in "NX":
                roles_in.append("u")
                unknown = True
            else:
                roles_in.append("x")
        roles_out = []
        for i, value in enumerate(node.outputs):
            if value is None:
                roles_out.append("x")
                continue
            dt = value.dtype
            if op == "Cast" and domain == "":
                # Only an fp32 cast is the author's "back to float" and may be retargeted; an explicit
                # cast to fp16/bf16 is a deliberate rounding and keeps its type.
                roles_out.append("p" if dt == FLOAT else ("o" if dt in MIXABLE else "x"))
            elif dt in MIXABLE:
                roles_out.append("o" if cat == "X" else t_out[i])
            elif dt is None and t_out[i] == "p" and cat not in "NX":
                roles_out.append("u")
                unknown = True
            else:
                roles_out.append("x")
        cls.roles_in[nid] = "".join(roles_in)
        cls.roles_out[nid] = "".join(roles_out)
        cls.pins_in[nid] = pins_in
        cls.pins_out[nid] = pins_out
        if unknown:
            cls.frozen[nid] = True
            reasons.append(Reason("unknown-type", "a float-capable input or output has no known type; "
                                  "the node keeps its types and nothing is cast around it"))
            cls.warnings.append(("unknown-type", f"node {node.label} ({op}) has tensors of unknown type; "
                                 "it is left as it is", node.label))
        if cat in "NX" or unknown:
            cls.reasons[nid] = reasons
            continue
        ports = cls.roles_in[nid] + cls.roles_out[nid]
        if "p" not in ports:
            if "f" in ports and "p" not in t_in + t_out and cat != "K":
                cls.seed[nid] = "schema"
                reasons.append(Reason("schema", f"the schema of {op} at opset {index.opset(domain)} has no "
                                      f"{dtype_name(target)} for this node's tensors"))
            cls.reasons[nid] = reasons
            continue

        # Node-name and command-line rules (later overrides earlier; exclude beats include).
        forced = None
        if has_name_rules:
            name = node.name
            for rule in node_rules:
                if rule.matches(name, op):
                    forced = ("deny" if rule.precision == "fp32" else "allow",
                              Reason("node-rule", f"node rule forces {rule.precision}"
                                     + (f": {rule.why}" if rule.why else ""), str(rule.source)))
            for pattern in include_nodes:
                if pattern.search(name):
                    forced = ("allow", Reason("cli-include", f"--include-node {pattern.pattern!r} forces low precision"))
            for pattern in exclude_nodes:
                if pattern.search(name):
                    forced = ("deny", Reason("cli-exclude", f"--exclude-node {pattern.pattern!r} keeps it fp32"))
        if op in excl_ops or f"{domain}:{op}" in excl_ops:
            forced = ("deny", Reason("cli-exclude", f"--exclude-op {op} keeps it fp32"))
        if force_fp32 and nid in force_fp32:
            forced = ("deny", force_fp32[nid])
        if forced is not None:
            cls.seed[nid] = forced[0]
            reasons.append(forced[1])

        if ranges and cat in "LFC" and node.scope is index.main:
            measured = _calibration_verdict(node, cls.roles_in[nid], cls.roles_out[nid], ranges, target, thresholds)
            if measured is not None:
                if cls.seed[nid] == "allow":
                    cls.warnings.append(("calibration", f"node {node.label}: {measured.message}; forced to "
                                         f"{dtype_name(target)} anyway", node.label))
                    reasons.append(measured)
                elif cls.seed[nid] != "deny":
                    cls.seed[nid] = "deny"
                    reasons.append(measured)

        # Constant inputs that would be converted go through the data rules (batched below).
        if cat in "LFC" and cls.seed[nid] != "deny":
            ri = cls.roles_in[nid]
            for i, value in enumerate(node.inputs):
                if value is not None and ri[i] == "p" and value.dtype == FLOAT and (
                        value.initializer is not None or (value.producer is not None and value.producer.op == "Constant")):
                    pending_data.append((node, value))
        cls.reasons[nid] = reasons

    verdicts = _check_constants({id(v): v for _, v in pending_data}.values(), target, thresholds)
    for node, value in pending_data:
        verdict = verdicts.get(id(value))
        if verdict is None:
            continue
        nid = node.id
        kind, message, measured = verdict
        if kind == "note":
            cls.flush_notes[id(value)] = (value, message)
            continue
        if cls.seed[nid] == "allow":
            cls.reasons[nid].append(Reason(kind, f"{message}; converted anyway because a rule forces low "
                                           "precision", value=measured))
            if value.kind == "initializer":
                cls.clamp[value.name] = message
            cls.warnings.append((kind, f"node {node.label}: {message}, forced to "
                                 f"{dtype_name(target)} (values are clamped to the finite range)", node.label))
        elif cls.seed[nid] != "deny":
            cls.seed[nid] = "deny"
            cls.reasons[nid].append(Reason(kind, message, value=measured))
    _propagate_range_through_clear_ops(cls, pending_data, verdicts, index, target, thresholds)
    return cls


def _propagate_range_through_clear_ops(cls, pending_data, verdicts, index=None, target=None,
                                       thresholds=None) -> None:
    """A clear op (Transpose, Reshape, Identity, ...) passes an out-of-range constant on
    unchanged, and so does a Loop or Scan that takes it as a loop-carried or scanned input: whatever
    reads the copy in low precision would overflow too. Such readers of any category stay fp32,
    with the constant named in the reason."""
    work = []
    for node, value in pending_data:
        verdict = verdicts.get(id(value))
        if verdict is not None and verdict[0] == "data-range":
            work.append((value, value, verdict, None))
    if index is not None:
        # constants that go straight into a control-flow node never reach the data rules above
        direct = {}
        for node in index.nodes:
            if node.subscopes and node.op in ("Loop", "Scan"):
                for value in node.inputs:
                    if value is not None and value.dtype == FLOAT and (
                            value.initializer is not None or
                            (value.producer is not None and value.producer.op == "Constant")):
                        direct[id(value)] = value
        for vid, verdict in _check_constants(direct.values(), target, thresholds).items():
            if verdict[0] == "data-range":
                work.append((direct[vid], direct[vid], verdict, None))
    seen = set()
    while work:
        value, source, verdict, via = work.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        for consumer, port in value.consumers:
            j = consumer.id
            if cls.cat[j] == "X":
                for sub in consumer.subscopes:
                    if consumer.op in ("Loop", "Scan") and port < len(sub.inputs) and (consumer.op == "Scan" or port >= 2):
                        work.append((sub.inputs[port], source, verdict, consumer))
                continue
            if cls.roles_in[j][port] not in "pa" or cls.cat[j] == "N":
                continue
            if cls.cat[j] == "C":
                ro = cls.roles_out[j]
                for k, out in enumerate(consumer.outputs):
                    if out is not None and ro[k] == "p":
                        work.append((out, source, verdict, consumer))
            if via is None or cls.seed[j] in ("deny", "allow"):
                continue   # direct readers were judged by the data rules already
            cls.seed[j] = "deny"
            cls.reasons[j].append(Reason("data-range", f"reads '{source.name}' through {via.op} "
                                         f"({via.label}): {verdict[1]}", value=verdict[2]))


def _calibration_verdict(node, roles_in, roles_out, ranges, target, thresholds):
    """A Reason when a tensor the node would hold in the target type left its safe range on the
    calibration data, else None."""
    max_value, tiny = LIMITS[target]
    limit = max_value / thresholds["calibration_headroom"]
    tname = dtype_name(target)
    ports = [(v, r) for v, r in zip(node.inputs, roles_in)] + [(v, r) for v, r in zip(node.outputs, roles_out)]
    worst = None
    for value, role in ports:
        if value is None or role != "p":
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
        message = (f"calibration: max |{name}| = {v:.4g} exceeds {limit:.4g} (the {tname} maximum / "
                   f"calibration_headroom {thresholds['calibration_headroom']:g})")
    else:
        message = f"calibration: max |{name}| = {v:.3g}: every value flushes to zero in {tname}"
    return Reason("calibration", message, "rules/default.toml [thresholds] calibration_headroom", value=v)


def _category(rules, domain, op, node, warnings):
    op_rule = rules.ops.get((domain, op))
    if op_rule is not None:
        return CAT_CODE[op_rule.category], Reason(
            "op-category", f"{op} is in category {op_rule.category}: {op_rule.why}", str(op_rule.source))
    qualified = f"{domain}:{op}" if domain else op
    warnings.append(("unknown-op", f"op {qualified} is not in any rule file; its nodes are "
                     f"{rules.unknown_op.category}", node.label))
    return CAT_CODE[rules.unknown_op.category], Reason(
        "unknown-op", f"no rule names {qualified}; unknown ops are {rules.unknown_op.category}",
        str(rules.unknown_op.source))


def _template(index, rules, domain, op, n_in, n_out, target):
    sig = signatures.lookup(domain, op, index.opset(domain))
    if sig is None and domain == "":
        raise AutocastError(f"op '{op}' does not exist in the default ONNX domain at opset {index.opset('')}",
                            index.where, "the model is corrupted or needs a newer onnx package")
    pin = rules.pins.get((domain, op))
    pins_in = pin.inputs if pin else ()
    pins_out = pin.outputs if pin else ()
    any_in = ANY_INPUTS.get((domain, op), False)

    def role(param, pinned):
        if pinned:
            return "f"
        if sig is None or param is None:
            return "p"
        allowed = sig.allowed(param)
        if allowed is None or target in allowed:
            return "p"
        if FLOAT in allowed:
            return "f"
        return "x"

    t_in = []
    for i in range(n_in):
        if any_in is None or (any_in and i in any_in):
            # The type does not matter to the op, but its schema must still admit it.
            allowed = sig.allowed(sig.input_param(i)) if sig is not None else None
            t_in.append("f" if allowed is not None and target not in allowed and FLOAT in allowed else "a")
        else:
            t_in.append(role(sig.input_param(i) if sig else None, i in pins_in))
    t_out = [role(sig.output_param(i) if sig else None, i in pins_out) for i in range(n_out)]
    return "".join(t_in), "".join(t_out), tuple(p for p in pins_in if p < n_in), tuple(p for p in pins_out if p < n_out)


def constant_array(value: Value):
    """The fp32 data of an initializer or Constant-node output, or None if not constant."""
    if value.initializer is not None:     # an initializer, or the default of an input
        array = tensor_array(value.initializer, value.scope.base_dir)
        if value.initializer.data_type == BFLOAT16:
            return bf16_bits_to_float(array)
        return array
    producer = value.producer
    if producer is not None and producer.op == "Constant" and producer.domain in ("", "ai.onnx"):
        for attr in producer.proto.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
            if attr.name == "value_float":
                return np.array(attr.f, dtype=np.float32)
            if attr.name == "value_floats":
                return np.array(list(attr.floats), dtype=np.float32)
    return None


def _check_constants(values, target: int, thresholds) -> dict:
    """Data-rule verdicts for fp32 constants, keyed by id(value); values that pass are absent.
    Initializers stored as raw bytes are checked in one vectorised pass over all of them."""
    out = {}
    sizes_in, owners = [], []
    for value in values:
        tensor = value.initializer
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
    max_value, tiny = LIMITS[target]
    overflow_at = 65520.0 if target == FLOAT16 else max_value
    for group in chunked(sizes_in):
        # one chunk of tensors in memory at a time (external data is read here, not before)
        raws = {k: tensor_bytes(owners[k].initializer, owners[k].scope.base_dir) for k in group}
        flat = np.frombuffer(b"".join(raws[k] for k in group), dtype="<f4")
        sizes = np.fromiter((len(raws[k]) // 4 for k in group), dtype=np.int64, count=len(group))
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        keep = sizes > 0
        mag = np.abs(flat)
        with np.errstate(invalid="ignore"):
            finite_mag = np.where(np.isfinite(mag), mag, 0.0)
            largest = np.maximum.reduceat(finite_mag, starts[keep]) if flat.size else np.zeros(0)
            smallest = np.minimum.reduceat(np.where(mag > 0, mag, np.inf), starts[keep]) if flat.size else np.zeros(0)
        suspicious = (largest >= overflow_at) | (smallest < tiny / 2)
        kept = [k for k, ok in zip(group, keep) if ok]
        for j in np.nonzero(suspicious)[0]:
            k = kept[j]
            value = owners[k]
            verdict = _verdict(value, np.frombuffer(raws[k], dtype="<f4"), target, thresholds)
            if verdict:
                out[id(value)] = verdict
    return out


CHUNK_BYTES = 64 * 2**20


def chunked(sizes, limit: int = CHUNK_BYTES):
    """Group consecutive indices of `sizes` (byte counts, or byte strings) into runs of at most
    `limit` bytes (one item may be larger), so vectorised passes over many tensors need bounded
    extra memory."""
    group, total = [], 0
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
    overflow, largest, flush, nonzero = range_report(data, target)
    tname = dtype_name(target)
    if overflow:
        return ("data-range", f"constant '{value.name}' holds {overflow} value(s) beyond the {tname} range "
                f"(largest |x| = {largest:.4g})", largest)
    if flush:
        small = thresholds["small_constant_elements"]
        tiny = float(np.abs(data[(data != 0)]).min())
        fraction = flush / max(nonzero, 1)
        if data.size <= small:
            if flush == nonzero:
                return ("data-flush", f"small constant '{value.name}' would become zero in {tname} "
                        f"(smallest nonzero |x| = {tiny:.3g}), like an epsilon", tiny)
            return ("note", f"{flush} of {nonzero} nonzero values of small constant '{value.name}' flush to "
                    f"zero in {tname} (smallest |x| = {tiny:.3g})", tiny)
        if fraction > thresholds["max_flush_fraction"]:
            return ("data-flush", f"{fraction:.2%} of the nonzero values of '{value.name}' flush to zero in "
                    f"{tname}", fraction)
        return ("note", f"{flush} of {nonzero} nonzero values of '{value.name}' flush to zero in {tname} "
                f"({fraction:.3%}, under max_flush_fraction)", fraction)
    return False
