"""Stage: lint checks. The implementations behind the `kind` of each check in rules/lint.toml.
Each takes the lint context and its Check (code, severity, parameters) and yields Diagnostics.
They only read the model.

A model with fp16/bf16 tensors is linted as it is ("actual"). A pure fp32 model is linted
"prospectively": every float node is taken as if a naive converter had made it low precision,
and each finding says whether autocast-onnx's default rules would keep that node fp32
(`protected`; such findings are reported as info)."""

from __future__ import annotations

import numpy as np
import onnx

from ..diagnostics import Diagnostic
from ..dtypes import BFLOAT16, FLOAT, FLOAT16, LIMITS, MIXABLE, dtype_name
from ..errors import AutocastError
from ..graph import build_index, signatures
from ..hazards import PASS_ON_OPS, is_mask, range_facts, range_sentence, thresholds
from ..plan.classify import constant_array
from ..plan.qdq import is_dq, is_q

LOW = (FLOAT16, BFLOAT16)


def report(
    check,
    message: str,
    *,
    node=None,
    model: str | None = None,
    value=None,
    protected: bool | None = None,
    tensor: str | None = None,
    severity: str | None = None,
) -> Diagnostic:
    """The one place a lint finding is built: `check`'s code, name, severity (unless `severity`
    overrides it) and fix, with where it was found (`node`, None for a model-wide finding) and
    what the message cites. Checks call LintContext.diag, which adds the protection verdict."""
    return Diagnostic(
        code=check.code,
        name=check.name,
        severity=check.severity if severity is None else severity,
        message=message,
        fix=check.fix,
        node=node.label if node is not None else None,
        op_type=node.op if node is not None else None,
        graph=node.scope.path if node is not None else "main",
        node_index=node.pos if node is not None else None,
        model=model,
        value=value,
        protected=protected,
        tensor=tensor,
    )


class LintContext:
    def __init__(
        self,
        model: onnx.ModelProto,
        path: str | None,
        precision: str | None = None,
        rules=(),
        base_dir=None,
        plan_options=None,
    ):
        self.model = model
        self.plan_options = plan_options  # the PlanOptions that decide what the conversion protects
        self.path = path
        self.index = build_index(model, path or "<model>", base_dir)
        found = {v.dtype for s in self.index.scopes for v in s.values.values() if v.dtype in LOW}
        self.mode = "actual" if found else "prospective"
        if precision:
            self.low = FLOAT16 if precision == "fp16" else BFLOAT16
        else:
            self.low = BFLOAT16 if found == {BFLOAT16} else FLOAT16
        self.rules = list(rules)
        if self.rules:
            from ..catalog import load_rules

            load_rules(self.rules)  # a broken rule file is the user's error, reported now
        self._plan: list[str] | None = None  # Precision per node id (a str enum), once computed
        self._sentinels: dict = {}  # the plan's mask sentinels, with it
        self._training: tuple | None = None  # (TrainingGraph or None,), once recognised
        self._patterns: list[dict] | None = None

    def kernels_runtime(self) -> str:
        """The runtime whose kernels lint counts on: --runtime's; else for an fp32 model (prospective
        mode) the default conversion's, ONNX Runtime's CUDA provider; else the one the model's
        provenance record says it was planned for; else none ("any")."""
        runtime = getattr(self.plan_options, "runtime", None)
        if runtime is not None:
            return runtime
        if self.mode != "actual":  # an fp32 model, linted as the default conversion would plan it
            return "cuda"
        from ..rewrite.provenance import read

        recorded = (read(self.model) or {}).get("runtime")
        from ..runtimes import ANY, RUNTIMES

        return recorded if recorded in RUNTIMES else ANY

    def training(self):
        """The model's training-graph recognition (graph/training.py), once per context."""
        if self._training is None:
            from ..graph.training import recognise

            self._training = (recognise(self.model),)
        return self._training[0]

    # ---- node facts ----------------------------------------------------------------------
    @staticmethod
    def compute_type(node):
        for value in list(node.outputs) + list(node.inputs):
            if value is not None and value.dtype in MIXABLE:
                return value.dtype
        return None

    def is_low(self, node) -> bool:
        t = self.compute_type(node)
        if self.mode == "actual":
            return t in LOW
        return t is not None

    def protected(self, node) -> bool | None:
        if self.mode == "actual":
            return None
        if self._plan is None:
            from dataclasses import replace

            from ..pipeline import plan_model
            from ..plan.options import PlanOptions
            from ..plan.vocab import Precision

            precision = Precision.FP16 if self.low == FLOAT16 else Precision.BF16
            try:
                # the conversion's own plan options, with the precision and rule files this lint
                # judges by; the model's inputs and outputs and --strict are left out of it
                options = replace(
                    self.plan_options or PlanOptions(),
                    precision=precision,
                    rules=tuple(self.rules),
                    low_precision_io=None,
                    strict=False,
                )
                planned = plan_model(self.model, options=options).plan
                self._plan, self._sentinels = planned.precisions, dict(planned.mask_sentinels)
            except AutocastError:  # e.g. an opset too old for bf16: nothing would be converted
                self._plan = []
        if node.id >= len(self._plan):
            return None
        return self._plan[node.id] in ("fp32", "unchanged") or bool(self.sentinel_of(node))

    def sentinel_of(self, node) -> dict:
        """{constant name: sentinel} of the mask sentinels the default conversion stores for the
        constants `node` reads (prospective mode; plan/masks.py): such a constant is safe in fp16."""
        sentinels = self._sentinels
        return {v.name: sentinels[v.name] for v in node.inputs if v is not None and v.name in sentinels}

    def diag(self, check, node, message, value=None, tensor=None, judged: bool = True) -> Diagnostic:
        """A finding at `node` (None: the model). `judged`: say whether the default rules would
        protect the node (prospective mode); False for findings about what the model declares."""
        protected = self.protected(node) if node is not None and judged else None
        severity = check.severity
        if protected:
            severity = "info"
            stored = self.sentinel_of(node) if self._plan and self._plan[node.id] not in ("fp32", "unchanged") else {}
            if stored:
                said = ", ".join(f"'{name}' as {value:g}" for name, value in stored.items())
                message += f"; the default conversion stores the mask constant {said} (its sentinel), which fp16 holds"
            else:
                message += "; the default conversion rules keep this fp32"
        elif self.mode == "prospective" and protected is False:
            message += "; the default conversion rules would NOT protect this"
        return report(
            check,
            message,
            node=node,
            model=self.path,
            value=value,
            protected=protected,
            tensor=tensor,
            severity=severity,
        )

    @property
    def tname(self) -> str:
        return dtype_name(self.low)

    def where(self) -> str:
        return "computed in" if self.mode == "actual" else "would be computed in"

    # ---- patterns ------------------------------------------------------------------------
    def layernorm_patterns(self) -> list[dict]:
        """Decomposed LayerNorms: ReduceMean -> Sub -> Pow/Mul -> ReduceMean -> Add(eps) -> Sqrt -> Div."""
        if self._patterns is not None:
            return self._patterns
        found = []
        for node in self.index.nodes:
            if node.op != "ReduceMean" or not node.outputs or node.outputs[0] is None:
                continue
            mean = node.outputs[0]
            for sub, port in mean.consumers:
                if sub.op != "Sub" or port != 1 or sub.outputs[0] is None:
                    continue
                centered = sub.outputs[0]
                for sq, _ in centered.consumers:
                    if sq.op not in ("Pow", "Mul") or sq.outputs[0] is None:
                        continue
                    var_nodes = [c for c, _ in sq.outputs[0].consumers if c.op == "ReduceMean"]
                    for var in var_nodes:
                        adds = [c for c, _ in var.outputs[0].consumers if c.op == "Add"]
                        for add in adds:
                            sqrts = [c for c, _ in add.outputs[0].consumers if c.op == "Sqrt"]
                            for sqrt in sqrts:
                                divs = [c for c, _ in sqrt.outputs[0].consumers if c.op == "Div"]
                                if divs:
                                    eps = next(
                                        (v for v in add.inputs if v is not None and v is not var.outputs[0]), None
                                    )
                                    found.append(
                                        {"nodes": [node, sub, sq, var, add, sqrt, divs[0]], "add": add, "eps": eps}
                                    )
        self._patterns = found
        return found


def _key(node) -> str:
    return node.op if node.domain == "" else f"{node.domain}:{node.op}"


def _fp32_parameters(ctx, node, ports) -> bool:
    """The node's parameter inputs `ports` are all fp32 (in an fp32 model: the conversion rules
    pin them fp32), and it does not train (training_mode)."""
    if any(a.name == "training_mode" and a.i for a in node.proto.attribute):
        return False
    if ctx.mode != "actual":
        from ..catalog import load_rules

        pin = load_rules(list(ctx.rules)).pin(node.domain, node.op)
        return pin is not None and set(ports) <= set(pin.inputs)
    values = [node.inputs[i] for i in ports if i < len(node.inputs) and node.inputs[i] is not None]
    return bool(values) and all(v.dtype == FLOAT for v in values)


# what the parameter inputs of an op with `fp32_parameters_ok` hold, for the message
_PARAMETERS = {"BatchNormalization": "scale, bias, mean and variance"}


def _low_parameters(ctx, node, ports) -> list:
    """The parameter inputs `ports` of `node` stored in low precision (actual mode only)."""
    if ctx.mode != "actual":
        return []
    values = [node.inputs[i] for i in ports if i < len(node.inputs) and node.inputs[i] is not None]
    return [v for v in values if v.dtype in LOW]


def _surviving_parameters(ctx, node, ports) -> bool:
    """Whether a BatchNormalization's parameters stored in low precision are constants whose
    rounding there could have changed its per-channel scale/sqrt(var+eps) and offset by no more
    than the converter allows (plan/batchnorm.py: stored_change)."""
    from ..plan import batchnorm

    if node.op != "BatchNormalization" or any(a.name == "training_mode" and a.i for a in node.proto.attribute):
        return False
    values = [node.inputs[i] for i in ports if i < len(node.inputs) and node.inputs[i] is not None]
    if len(values) != 4 or any(v.dtype not in LOW for v in values):
        return False
    arrays = [constant_array(_through_casts(v)) for v in values]
    if any(a is None for a in arrays):
        return False
    epsilon = next((a.f for a in node.proto.attribute if a.name == "epsilon"), 1e-5)
    low = int(values[0].dtype)
    return batchnorm.stored_change(arrays, epsilon, low) <= 2 * batchnorm.TOLERANCE * batchnorm.UNIT_ROUNDOFF[low]


def _family_message(ctx, node, lenient: dict) -> str:
    """What is wrong with a node of the family computed in low precision. For an op whose data may
    be low when its parameters are fp32 (BatchNormalization in inference: what the converter
    does from opset 15), the fault is the parameters (the statistics) stored low: say so."""
    message = f"{node.op} {ctx.where()} {ctx.tname}"
    ports = lenient.get(_key(node))
    training = any(a.name == "training_mode" and a.i for a in node.proto.attribute)
    low = _low_parameters(ctx, node, ports) if ports and not training else []
    if not low:
        return message
    what = _PARAMETERS.get(node.op, "parameters")
    names = ", ".join(f"'{v.name}'" for v in low)
    fp16 = any(v.dtype == FLOAT16 for v in low)
    types = "fp16" if fp16 else "bf16"
    loss = f"they keep {11 if fp16 else 8} significant bits" + (", and a variance below 3e-8 is 0" if fp16 else "")
    return (
        f"{message} with its {what} ({names}) stored in {types}: the statistics are what is wrong ({loss}); "
        f"the data may be {ctx.tname} when these stay fp32, as autocast-onnx convert keeps them"
    )


def _kernel_computes_fp32(ctx: LintContext, node) -> bool:
    """Whether the runtime linted for computes `node` at the low type in fp32 and rounds its
    outputs once (catalog/compute.py): then the op itself loses nothing in low precision (its
    inputs were rounded where they were made), which is why the converter runs such nodes low
    between low-precision neighbours (kernel-fp32). The runtime is --runtime's; without it, the
    one a model converted by autocast-onnx records it was planned for (its provenance record's
    `runtime`), so that lint agrees with the conversion; for any other model none is counted on
    (a kernel that computes the op in fp16 makes it the hazard the check names)."""
    from ..catalog.compute import computes_in_fp32

    fact = computes_in_fp32(ctx.kernels_runtime(), node.domain, node.op, ctx.low)
    return fact is not None and fact.fp32_once


def op_family(ctx: LintContext, check):
    ops = set(check.params.get("ops", ()))
    lenient = check.params.get("fp32_parameters_ok", {})
    fp32_kernels_ok = bool(check.params.get("fp32_kernel_ok", False))
    flagged = set()
    for node in ctx.index.nodes:
        if _key(node) in lenient and _fp32_parameters(ctx, node, lenient[_key(node)]):
            continue
        if _key(node) in lenient and _surviving_parameters(ctx, node, lenient[_key(node)]):
            continue  # stored low, as the converter stores the parameters that survive (plan/batchnorm.py)
        # (an op whose parameters may be stored low, BatchNormalization, is judged by them instead)
        if fp32_kernels_ok and _key(node) in ops and _key(node) not in lenient and _kernel_computes_fp32(ctx, node):
            continue
        if _key(node) in ops and ctx.is_low(node):
            flagged.add(node.id)
            yield ctx.diag(check, node, _family_message(ctx, node, lenient))
    if "decomposed-layernorm" in check.params.get("patterns", ()):
        for pattern in ctx.layernorm_patterns():
            for node in pattern["nodes"]:
                if node.id not in flagged and ctx.is_low(node):
                    flagged.add(node.id)
                    yield ctx.diag(
                        check,
                        node,
                        f"{node.op} is part of a decomposed LayerNorm (ReduceMean/Sub/Pow/"
                        f"ReduceMean/Add/Sqrt/Div) {ctx.where()} {ctx.tname}",
                    )


def _constants(ctx):
    for scope in ctx.index.scopes:
        for value in scope.values.values():
            if value.dtype not in MIXABLE:
                continue
            if value.kind == "initializer" or (value.producer is not None and value.producer.op == "Constant"):
                yield value


def _low_consumers(ctx, value, through=False, depth=3):
    """Nodes that consume `value` in low precision (optionally through data-movement ops)."""
    out, stack, seen = [], [(value, 0)], set()
    while stack:
        v, d = stack.pop()
        for node, _ in v.consumers:
            if node.id in seen:
                continue
            seen.add(node.id)
            if node.op == "Cast" and ctx.mode == "actual":
                to = node.outputs[0].dtype if node.outputs and node.outputs[0] is not None else None
                if to in LOW:
                    out.append(node)  # the conversion to the low type happens here
                    continue
            if ctx.is_low(node) and not (node.op == "Cast" and ctx.mode == "actual"):
                out.append(node)
            if through and d < depth and node.op in PASS_ON_OPS:  # what the converter follows too
                for o in node.outputs:
                    if o is not None:
                        stack.append((o, d + 1))
    return out


def constant_range(ctx, check):
    """fp32 constants that overflow in the low-precision type (hazards.py, as the converter's data
    rules judge them) and reach low-precision arithmetic. Infinities convert exactly, so a
    constant already stored in low precision is not judged here: an inf in it may be an intended
    -inf mask or an overflow, and only the fp32 original tells (lint it)."""
    for value in _constants(ctx):
        if value.dtype in LOW:
            continue
        data = constant_array(value)
        if data is None or data.size == 0:
            continue
        facts = range_facts(data, ctx.low)
        if not facts.overflow:
            continue
        users = _low_consumers(ctx, value)
        if users:
            yield ctx.diag(
                check,
                users[0],
                f"{range_sentence(value.name, facts, ctx.tname)} and feeds {users[0].op} ({ctx.where()} {ctx.tname})",
                value=facts.largest,
                tensor=value.name,
            )


def weights_flush(ctx, check):
    minimum = float(check.params.get("min_fraction", 0.0))
    tiny = LIMITS[ctx.low][1]
    for value in _constants(ctx):
        if value.dtype != FLOAT:
            continue
        data = constant_array(value)
        if data is None or data.size < 2:
            continue
        mag = np.abs(np.asarray(data, dtype=np.float32))
        nonzero = int(np.count_nonzero(mag))
        flush = int(np.count_nonzero((mag > 0) & (mag < tiny / 2)))
        if not nonzero or not flush or flush / nonzero <= minimum:
            continue
        users = _low_consumers(ctx, value)
        if users:
            fraction = flush / nonzero
            yield ctx.diag(
                check,
                users[0],
                f"{flush} of {nonzero} nonzero values ({fraction:.3%}) of '{value.name}' flush to zero in {ctx.tname}",
                value=fraction,
                tensor=value.name,
            )


def _edge_fate(low: int) -> str:
    """What a mask on the lowest finite value of `low` does, in the words lint and the tests share:
    a fully masked row stays finite (every position is that value: the softmax is uniform, as in
    fp32), unless a score at or below minus the half unit at the edge (-16 in fp16), or a second
    mask, is added to it: that sum is -inf, and a row of them is NaN."""
    headroom = thresholds(low)[1] - LIMITS[low][0]
    return (
        f"is the lowest finite value there, with no headroom: a score of -{headroom:.4g} or below, or a second "
        f"mask, added to it gives -inf, and a row where every position does gives NaN (a fully masked row of "
        f"higher scores stays finite)"
    )


_INF_FATE = "is -inf there: a fully masked row is -inf everywhere and its softmax NaN (-inf - -inf)"


def masking_constant(ctx, check):
    """Masking constants with no headroom in the low-precision type (hazards.py, the converter's
    judgement): an fp32 value that becomes -inf or the lowest finite value there, or a constant
    stored in low precision at its lowest finite value, that reaches low-precision arithmetic.
    An fp32 -inf mask is -inf in fp16 too and is not reported."""
    for value in _constants(ctx):
        data = constant_array(value)
        if data is None or data.size == 0:
            continue
        if value.dtype in LOW:  # already stored low: only a value on the edge can be judged
            lowest = range_facts(data, value.dtype).lowest
            if lowest > -LIMITS[value.dtype][0]:
                continue
            fate = _edge_fate(value.dtype)
        else:
            facts = range_facts(data, ctx.low)
            if not is_mask(facts, ctx.low):
                continue
            lowest = facts.lowest
            fate = _INF_FATE if -lowest >= thresholds(ctx.low)[1] else _edge_fate(ctx.low)
        users = _low_consumers(ctx, value, through=True)
        if users:
            yield ctx.diag(
                check,
                users[0],
                f"masking constant '{value.name}' ({lowest:.4g}) reaches {users[0].op} "
                f"({ctx.where()} {ctx.tname}) and {fate}",
                value=lowest,
                tensor=value.name,
            )


EPSILON_OPS = {
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}


def epsilon_flush(ctx, check):
    tiny = LIMITS[ctx.low][1] / 2
    for node in ctx.index.nodes:
        if node.op in EPSILON_OPS and ctx.is_low(node):
            if _kernel_computes_fp32(ctx, node):
                continue  # the attribute is a float, and the kernel adds it in float
            eps = next((a.f for a in node.proto.attribute if a.name == "epsilon"), None)
            if eps is not None and 0 < eps < tiny:
                yield ctx.diag(check, node, f"{node.op} epsilon {eps:g} is 0 in {ctx.tname}", value=eps)
    for pattern in ctx.layernorm_patterns():
        add, eps = pattern["add"], pattern["eps"]
        if eps is None or not ctx.is_low(add):
            continue
        source = _through_casts(eps)
        data = constant_array(source)
        if data is None or not np.asarray(data).size:
            continue
        largest = float(np.abs(np.asarray(data, dtype=np.float32)).max())
        if 0 < largest < tiny:
            yield ctx.diag(
                check,
                add,
                f"epsilon {largest:g} of a decomposed LayerNorm is 0 in {ctx.tname}",
                value=largest,
                tensor=source.name,
            )
        elif largest == 0 and (source.dtype in LOW or source is not eps):
            yield ctx.diag(
                check,
                add,
                f"the epsilon '{source.name}' of a decomposed LayerNorm is 0 "
                f"({dtype_name(source.dtype)}): it flushed when the model was converted",
                value=0.0,
                tensor=source.name,
            )


def _through_casts(value):
    """The value a chain of Cast nodes starts from."""
    while (
        value.producer is not None
        and value.producer.op == "Cast"
        and value.producer.inputs
        and value.producer.inputs[0] is not None
    ):
        value = value.producer.inputs[0]
    return value


def lossy_round_trip(ctx, check):
    for node in ctx.index.nodes:
        if node.op != "Cast" or not node.inputs or node.inputs[0] is None or node.outputs[0] is None:
            continue
        if node.inputs[0].dtype != FLOAT or node.outputs[0].dtype not in LOW:
            continue
        users = node.outputs[0].consumers
        if (
            users
            and not node.outputs[0].graph_outputs
            and all(u.op == "Cast" and u.outputs[0] is not None and u.outputs[0].dtype == FLOAT for u, _ in users)
        ):
            yield ctx.diag(
                check,
                node,
                f"'{node.inputs[0].name}' is cast to {dtype_name(node.outputs[0].dtype)} and "
                f"straight back to fp32 by {users[0][0].label}",
                tensor=node.inputs[0].name,
                judged=False,
            )


def low_output(ctx, check):
    for value in ctx.index.main.outputs:
        if value.dtype in LOW:
            message = f"model output '{value.name}' is {dtype_name(value.dtype)}"
            yield ctx.diag(check, value.producer, message, tensor=value.name, judged=False)


def unknown_type(ctx, check):
    for node in ctx.index.nodes:
        for value in node.outputs:
            if value is not None and value.dtype is None and value.consumers:
                message = f"the type of '{value.name}' (output of {node.op}) is unknown"
                yield ctx.diag(check, node, message, tensor=value.name, judged=False)


def _weight_dims(node):
    """(K, N or output channels, extra) for MatMul/Gemm/Conv when the weight is an initializer."""
    if node.op not in ("MatMul", "Gemm", "Conv") or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    weight = node.inputs[1]
    if weight.initializer is None:
        return None
    dims = list(weight.initializer.dims)
    if node.op == "MatMul" and len(dims) >= 2:
        return {"K": dims[-2], "N": dims[-1]}, dims[-2]
    if node.op == "Gemm" and len(dims) == 2:
        trans = next((a.i for a in node.proto.attribute if a.name == "transB"), 0)
        n, k = (dims[0], dims[1]) if trans else (dims[1], dims[0])
        return {"K": k, "N": n}, k
    if node.op == "Conv" and len(dims) >= 3:
        group = next((a.i for a in node.proto.attribute if a.name == "group"), 1)
        depth = int(np.prod(dims[1:]))
        return {"C_out": dims[0], "C_in": dims[1] * group}, depth
    return None


def alignment(ctx, check):
    multiple = int(check.params.get("multiple", 8))
    for node in ctx.index.nodes:
        if not ctx.is_low(node):
            continue
        found = _weight_dims(node)
        if not found:
            continue
        dims, _ = found
        bad = {k: v for k, v in dims.items() if v % multiple}
        if bad:
            text = ", ".join(f"{k}={v}" for k, v in bad.items())
            yield ctx.diag(check, node, f"{node.op} {text} not a multiple of {multiple}")


def reduction_depth(ctx, check):
    limit = int(check.params.get("max_depth", 8192))
    for node in ctx.index.nodes:
        if not ctx.is_low(node):
            continue
        found = _weight_dims(node)
        if found and found[1] > limit:
            yield ctx.diag(
                check, node, f"{node.op} sums {found[1]} products per output (limit {limit})", value=float(found[1])
            )


# ---- training graphs (AC5xx) ------------------------------------------------------------------

OPTIMIZERS = {
    "com.microsoft:AdamOptimizer",
    "com.microsoft:AdamWOptimizer",
    "com.microsoft:SGDOptimizer",
    "com.microsoft:SGDOptimizerV2",
    "com.microsoft:LambOptimizer",
    "ai.onnx.preview.training:Adam",
    "ai.onnx.preview.training:Adagrad",
    "ai.onnx.preview.training:Momentum",
}
# what may stand between a gradient's reduction and its accumulator: data movement, casts, and the
# unscaling by 1/scale
_CLEAR_PATH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Cast", "Mul", "Div"}


def _training(ctx):
    return ctx.training()


def gradient_accumulation(ctx, check):
    """Accumulators fed a low-precision gradient or buffer, and low-precision reductions whose
    result reaches an accumulator (through data movement only)."""
    if ctx.mode != "actual":
        return
    training = _training(ctx)
    if training is None or not training.accumulations:
        return
    main = ctx.index.main
    for acc in training.accumulations:
        node = main.nodes[acc.node]
        for port, what in ((0, "buffer"), (1, "gradient")):
            value = node.inputs[port] if port < len(node.inputs) else None
            if value is not None and value.dtype in LOW:
                yield ctx.diag(
                    check,
                    node,
                    f"{node.op} accumulates the {dtype_name(value.dtype)} {what} '{value.name}'",
                    tensor=value.name,
                    judged=False,
                )
        # walk back from the gradient through data movement to a reduction
        value = node.inputs[1] if len(node.inputs) > 1 else None
        while value is not None and value.producer is not None:
            producer = value.producer
            if producer.op.startswith("Reduce") or producer.op == "Sum":
                if ctx.is_low(producer):
                    yield ctx.diag(
                        check,
                        producer,
                        f"{producer.op} reduces the gradient of "
                        f"'{acc.parameter or acc.gradient}' {ctx.where()} {ctx.tname}",
                    )
                break
            if producer.op not in _CLEAR_PATH or not producer.inputs:
                break
            value = producer.inputs[0]


def loss_scaling(ctx, check):
    """An onnxruntime-training graph with low-precision nodes whose backward seed is still 1."""
    if ctx.mode != "actual":
        return
    training = _training(ctx)
    if training is None or training.kind != "ort-training" or training.loss_scale is not None:
        return
    if training.seed is None:
        return
    low = sum(1 for node in ctx.index.nodes if ctx.is_low(node))
    if low:
        yield ctx.diag(
            check,
            None,
            f"the backward pass starts from '{training.seed}' = 1 with no loss scaling, and {low} nodes compute in "
            f"{ctx.tname}: gradients below {ctx.tname}'s smallest subnormal become zero",
            tensor=training.seed,
        )


def master_weights(ctx, check):
    """Trained parameters and their gradient buffers declared low precision; optimizer ops fed
    low-precision tensors or sequences of them."""
    training = _training(ctx)
    graph = ctx.model.graph
    declared = {}
    for vi in graph.input:
        t = vi.type
        if t.HasField("sequence_type"):
            t = t.sequence_type.elem_type
        if t.HasField("tensor_type"):
            declared[vi.name] = t.tensor_type.elem_type
    if training is not None:
        for acc in training.accumulations:
            for name, what in ((acc.parameter, "parameter"), (acc.buffer, "gradient buffer")):
                if name is not None and declared.get(name) in LOW:
                    yield ctx.diag(
                        check, None, f"{what} '{name}' is a {dtype_name(declared[name])} graph input", tensor=name
                    )
    for node in ctx.index.nodes:
        if _key(node) not in OPTIMIZERS:
            continue
        for value in node.inputs:
            if value is None:
                continue
            dtype = declared.get(value.name, value.dtype)  # a sequence input: its element type
            if dtype in LOW:
                yield ctx.diag(
                    check,
                    node,
                    f"{node.op} reads '{value.name}' as {dtype_name(dtype)}: optimizer state and weights must be fp32",
                    tensor=value.name,
                    judged=False,
                )


def qdq_split(ctx, check):
    """Nodes of `check.params["between"]` (Cast, CastLike) that sit inside a Q/DQ unit: fed by a
    DequantizeLinear, or feeding a QuantizeLinear. Runtimes fuse DequantizeLinear -> op ->
    QuantizeLinear into one int8 kernel only when the Q/DQ nodes touch the op (plan/qdq.py)."""
    between = set(check.params.get("between", ("Cast", "CastLike")))
    for node in ctx.index.nodes:
        if node.op not in between or node.domain != "" or not node.inputs or node.inputs[0] is None:
            continue
        source = node.inputs[0].producer
        if source is not None and is_dq(source):
            users = sorted({f"{c.label} ({c.op})" for out in node.outputs if out is not None for c, _ in out.consumers})
            fed = ", ".join(users) if users else "nothing"
            yield ctx.diag(
                check,
                node,
                f"{node.op} {node.label} sits between DequantizeLinear {source.label} and {fed}: "
                "the op no longer reads the dequantized value directly, so no int8 fusion can take the unit",
                tensor=node.inputs[0].name,
                judged=False,
            )
        for out in node.outputs:
            for consumer, port in out.consumers if out is not None else ():
                if is_q(consumer) and port == 0:
                    what = f"{source.label} ({source.op})" if source is not None else f"input '{node.inputs[0].name}'"
                    yield ctx.diag(
                        check,
                        node,
                        f"{node.op} {node.label} sits between {what} and QuantizeLinear {consumer.label}: the "
                        "QuantizeLinear no longer quantizes the op's output directly, so no int8 fusion can take "
                        "the unit",
                        tensor=out.name,
                        judged=False,
                    )


def fusion_split(ctx, check):
    """Casts between two nodes of a pattern that ONNX Runtime's CUDA provider fuses (plan/fusions.py),
    one finding per split instance, on the Cast. Only for ONNX Runtime's CUDA provider (no
    --runtime, or cuda): other runtimes fuse other patterns."""
    if getattr(ctx.plan_options, "runtime", None) not in (None, "cuda"):
        return
    from ..plan.fusions import find

    for inst in find(ctx.index):
        if not inst.split:
            continue
        cast = inst.casts[0]
        yield ctx.diag(
            check,
            cast,
            f"{cast.op} {cast.label} splits {inst.text()}, which ONNX Runtime's CUDA provider fuses into "
            f"{inst.pattern.name} ({inst.pattern.cite}): the pattern runs as separate kernels",
            tensor=cast.inputs[0].name if cast.inputs and cast.inputs[0] is not None else None,
            judged=False,
        )


def runtime_kernel(ctx, check):
    """Nodes whose fp16/bf16 type (inputs or outputs, as the model declares or the index infers) the runtime
    named with --runtime has no kernel for at the model's opset (catalog/kernels.py answers False), or whose
    port types split a group of type parameters the runtime's kernel binds to one type (BatchNormalization with
    fp16 data and fp32 scale on CUDA). Nothing without a runtime or with "any", and nothing where the table
    cannot tell (None): a finding only where the runtime's own registrations show the kernel missing."""
    runtime = getattr(ctx.plan_options, "runtime", None)
    if runtime in (None, "any"):
        return
    from ..catalog.kernels import missing_kernel

    for node in ctx.index.nodes:
        opset = ctx.index.opset(node.domain)
        if not opset:
            continue
        types = sorted({v.dtype for v in list(node.inputs) + list(node.outputs) if v is not None and v.dtype in LOW})
        sig = signatures.lookup(node.domain, node.op, opset) if types else None
        port_types = ([None if v is None else v.dtype for v in values] for values in (node.inputs, node.outputs))
        why = missing_kernel(runtime, node.domain, node.op, opset, types, sig.param_types(*port_types) if sig else {})
        if why is not None:
            yield ctx.diag(check, node, why, judged=False)  # the report names the node already


def unused_suppression(ctx, check):
    return iter(())  # reported by the engine, which knows the suppressions


KINDS = {
    "op-family": op_family,
    "constant-range": constant_range,
    "weights-flush": weights_flush,
    "masking-constant": masking_constant,
    "epsilon-flush": epsilon_flush,
    "lossy-round-trip": lossy_round_trip,
    "low-output": low_output,
    "unknown-type": unknown_type,
    "alignment": alignment,
    "reduction-depth": reduction_depth,
    "gradient-accumulation": gradient_accumulation,
    "loss-scaling": loss_scaling,
    "master-weights": master_weights,
    "qdq-split": qdq_split,
    "fusion-split": fusion_split,
    "runtime-kernel": runtime_kernel,
    "unused-suppression": unused_suppression,
}
