"""Stage: validate / emulation, kernels that round inside themselves (issue 37).

The emulation model (emulate.py) computes each node in fp32 and rounds each fp16/bf16 tensor once. That is what
ONNX Runtime's CUDA kernel computes where it works in float and rounds once (catalog/compute.py: Softmax,
LayerNormalization, MatMul, Exp, ...). Some kernels instead chain several operations in the low type, each
rounding: FastGelu evaluates its tanh formula in half, the bfloat16 Sigmoid rounds exp, 1 + exp and 1 / (...),
LeakyRelu multiplies by its alpha rounded to half. Where the cancellation is strong (a + a * tanh near -1,
1 - 1 / (1 + exp) for negative inputs, exp(x) - 1 near 0) such a chain is thousands of ulps away from the float
formula rounded once, so emulating it as one rounding would hide errors the GPU makes.

`decompose(model)` rewrites each such node, before the emulation rounds, into the kernel's own steps as standard
ONNX ops at the node's low type, with the kernel's constants rounded to that type (Constant nodes). The emulation
then rounds after each step as the kernel does, and every other node is left as it was. A node is rewritten only
where the compute table says its CUDA kernel computes per step at that type (its general row, or for Gelu the
approximate='tanh' path), and only with the steps below, each transcribed from the kernel the table cites:

  FastGelu, Gelu (approximate='tanh')   gelu_approximate_impl.cu: (x + bias), c*x, *x, +b, x*(...), tanh, a*, a+, x*
  BiasGelu (fp16)                       common.cuh's half _Gelu: x + bias, sqrt(1/2)*x, erf, 1 + erf, x*0.5, *
  QuickGelu                             activations_impl.cu: alpha*x, then the two-branch sigmoid, x * sigmoid
  Sigmoid (bf16)                        activations_impl.cu: x > 0 ? 1/(1 + exp(-x)) : 1 - 1/(1 + exp(x))
  Elu, Selu, Softplus, Softsign, HardSigmoid (fp16)   activations_impl.cu, operation by operation
  LeakyRelu, ThresholdedRelu (fp16)     alpha rounded to half (the product or comparison is then one operation)
  Sum (3 or more inputs)                a chain of Adds, in input order
  BiasAdd                               (input + bias) + skip
  SkipLayerNormalization, SkipSimplifiedLayerNormalization (no strict mode)   skip_layer_norm_impl.cu, layer_norm.cuh:
                                        the sum, the scaled statistics, E[x^2] - mean^2, rsqrt, the affine step in T

Each step is a correctly rounded operation of the low type on the GPU (half, or ONNX Runtime's BFloat16 operators),
which is the fp32 operation rounded once: so the rewritten node emulates the kernel bit for bit, up to the float
math library (tanhf, expf, erff, logf differ from the CPU's by an ulp of float, which moves a rounding of the low
type once in thousands of values) and cuda_fp16's division (an approximate reciprocal in float). What is not
rewritten, and why, is in docs/validate.md ("What emulation does not model").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..catalog.compute import computes_in_fp32
from ..dtypes import BFLOAT16, FLOAT16, float_to_bf16_bits, round_trip
from ..graph import build_index
from ..graph.domains import normalize_domain
from ..rewrite.edit import Names, write_nodes

MIN_OPSET = 9  # Erf, Where and Greater over floats: the ops the steps use
MS = "com.microsoft"


class Steps:
    """The standard-op steps replacing one node, at the node's low type `low`."""

    def __init__(self, names: Names, node, low: int, opset: int = 0, shapes: dict | None = None):
        self.names = names
        self.low = low
        self.base = node.proto.name or node.op
        self.protos: list[onnx.NodeProto] = []
        self.opset = opset
        self.shapes = shapes or {}  # tensor name -> static dims (None where unknown), when a program needs them

    def step(self, op: str, inputs: list, **attributes) -> str:
        """One step with attributes (Cast, the reductions)."""
        out = self.names.fresh(f"{self.base}__emu_step")
        self.protos.append(helper.make_node(op, inputs, [out], name=self.names.fresh_node(out), **attributes))
        return out

    def ints(self, values: list) -> str:
        """An int64 Constant (a reduction's axes)."""
        out = self.names.fresh(f"{self.base}__emu_axes")
        tensor = numpy_helper.from_array(np.array(values, dtype=np.int64), out)
        self.protos.append(helper.make_node("Constant", [], [out], name=self.names.fresh_node(out), value=tensor))
        return out

    def const(self, value: float) -> str:
        """A Constant of the low type holding `value` rounded to it, as the kernel converts its constants."""
        out = self.names.fresh(f"{self.base}__emu_c")
        if self.low == FLOAT16:
            tensor = numpy_helper.from_array(np.array(value, dtype=np.float16), out)
        else:
            bits = float_to_bf16_bits(np.array([value], dtype=np.float32))
            tensor = helper.make_tensor(out, BFLOAT16, [], bits.tobytes(), raw=True)
        self.protos.append(helper.make_node("Constant", [], [out], name=self.names.fresh_node(out), value=tensor))
        return out

    def __call__(self, op: str, *inputs: str) -> str:
        """One step `op(inputs)` in the low type; returns its output."""
        out = self.names.fresh(f"{self.base}__emu_step")
        self.protos.append(helper.make_node(op, list(inputs), [out], name=self.names.fresh_node(out)))
        return out

    def rounded(self, value: float) -> float:
        """`value` as the kernel holds it after converting it to the low type."""
        return float(round_trip(np.array([value], dtype=np.float32), self.low)[0])


def _attr(node, name: str, default):
    for attribute in node.proto.attribute:
        if attribute.name == name:
            value = helper.get_attribute_value(attribute)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _input(node, port: int) -> str | None:
    value = node.inputs[port] if port < len(node.inputs) else None
    return value.name if value is not None else None


def _tanh_gelu(s: Steps, x: str) -> str:
    """FastGeluKernel: x * (a + a * tanh(x * (c * x * x + b))), every operation in the low type."""
    a, b, c = s.const(0.5), s.const(0.7978845608028654), s.const(0.035677408136300125)
    inner = s("Add", s("Mul", s("Mul", c, x), x), b)
    t = s("Tanh", s("Mul", x, inner))
    return s("Mul", x, s("Add", a, s("Mul", a, t)))


def _fast_gelu(s: Steps, node) -> str | None:
    x, bias = _input(node, 0), _input(node, 1)
    if not x:
        return None
    return _tanh_gelu(s, s("Add", x, bias) if bias else x)


def _gelu(s: Steps, node) -> str | None:
    x = _input(node, 0)
    return _tanh_gelu(s, x) if x and _attr(node, "approximate", "none") == "tanh" else None


def _bias_gelu(s: Steps, node) -> str | None:
    """x + bias, then common.cuh's half _Gelu: a * kHalf * (kOne + _Erf(kAlpha * a))."""
    x, bias = _input(node, 0), _input(node, 1)
    if s.low != FLOAT16 or not x or not bias:
        return None  # bfloat16: x * normcdf(x), whose float normcdf ONNX has no op for
    a = s("Add", x, bias)
    t = s("Add", s.const(1.0), s("Erf", s("Mul", s.const(0.7071067811865476), a)))
    return s("Mul", s("Mul", a, s.const(0.5)), t)


def _sigmoid_of(s: Steps, v: str, take_positive: str) -> str:
    """The two branches of ONNX Runtime's sigmoid functor, each in the low type, and the one `take_positive`
    (a boolean tensor) selects: 1 / (1 + exp(-v)) where it is true, 1 - 1 / (1 + exp(v)) elsewhere."""
    one = s.const(1.0)
    positive = s("Div", one, s("Add", one, s("Exp", s("Neg", v))))
    negative = s("Sub", one, s("Div", one, s("Add", one, s("Exp", v))))
    return s("Where", take_positive, positive, negative)


def _sigmoid(s: Steps, node) -> str | None:
    x = _input(node, 0)
    if s.low != BFLOAT16 or not x:
        return None  # half: a specialisation computes in float and rounds once
    return _sigmoid_of(s, x, s("Greater", x, s.const(0.0)))


def _quick_gelu(s: Steps, node) -> str | None:
    """OP_QuickGelu: v = x * alpha; sigmoid = v >= 0 ? 1/(1 + exp(-v)) : 1 - 1/(1 + exp(v)); x * sigmoid."""
    x = _input(node, 0)
    if not x:
        return None
    v = s("Mul", x, s.const(_attr(node, "alpha", 1.702)))
    return s("Mul", x, _sigmoid_of(s, v, s("Not", s("Less", v, s.const(0.0)))))


def _elu(s: Steps, node) -> str | None:
    x = _input(node, 0)
    if not x:
        return None
    negative = s("Mul", s.const(_attr(node, "alpha", 1.0)), s("Sub", s("Exp", x), s.const(1.0)))
    return s("Where", s("Greater", x, s.const(0.0)), x, negative)


def _selu(s: Steps, node) -> str | None:
    """(T)gamma * a, or (T)gamma * (T)alpha * (_Exp(a) - (T)1): gamma * alpha is itself a product in T."""
    x = _input(node, 0)
    if not x:
        return None
    gamma = s.rounded(_attr(node, "gamma", 1.05070102214813232421875))
    alpha = s.rounded(_attr(node, "alpha", 1.67326319217681884765625))
    negative = s("Mul", s.const(gamma * alpha), s("Sub", s("Exp", x), s.const(1.0)))
    return s("Where", s("Greater", x, s.const(0.0)), s("Mul", s.const(gamma), x), negative)


def _softplus(s: Steps, node) -> str | None:
    """a > 0 ? a + _Log(_Exp(-a) + 1) : _Log(_Exp(a) + 1)."""
    x = _input(node, 0)
    if not x:
        return None
    one = s.const(1.0)
    positive = s("Add", x, s("Log", s("Add", s("Exp", s("Neg", x)), one)))
    negative = s("Log", s("Add", s("Exp", x), one))
    return s("Where", s("Greater", x, s.const(0.0)), positive, negative)


def _softsign(s: Steps, node) -> str | None:
    x = _input(node, 0)
    return s("Div", x, s("Add", s.const(1.0), s("Abs", x))) if x else None


def _hard_sigmoid(s: Steps, node) -> str | None:
    """_Max(_Min((T)alpha * a + (T)beta, (T)1), (T)0)."""
    x = _input(node, 0)
    if not x:
        return None
    u = s("Add", s("Mul", s.const(_attr(node, "alpha", 0.2)), x), s.const(_attr(node, "beta", 0.5)))
    return s("Max", s("Min", u, s.const(1.0)), s.const(0.0))


def _sum(s: Steps, node) -> str | None:
    names = [v.name for v in node.inputs if v is not None]
    if len(names) < 3 or len(names) != len(node.inputs):
        return None  # two inputs: one Add, one rounding
    total = names[0]
    for name in names[1:]:
        total = s("Add", total, name)
    return total


def _bias_add(s: Steps, node) -> str | None:
    x, bias, skip = (_input(node, k) for k in range(3))
    return s("Add", s("Add", x, bias), skip) if x and bias and skip else None


def _skip_layer_norm(s: Steps, node) -> str | None:
    """skip_layer_norm_impl.cu and layer_norm.cuh without strict mode, every step in T: val = input + skip
    (+ bias); each element contributes val * (1/ld) to the mean and (val * (1/ld)) * val to the mean of
    squares (products rounded; the block sums accumulate half2 values, emulated as float sums rounded once:
    the kernel's own order rounds more), variance E[x^2] - mean^2, rsigma = hrsqrt(variance + epsilon)
    (epsilon converted to T; one rounding), then gamma * (val - mean) * rsigma + beta left to right (the
    simplified form: gamma * val * rsigma). The optional sum output is val; a node that writes its mean or
    inv_std outputs is left as it is. Opset 13 and later (ReduceSum's axes input)."""
    simplified = node.op == "SkipSimplifiedLayerNormalization"
    outputs = list(node.outputs) + [None] * (4 - len(node.outputs))
    if s.opset < 13 or outputs[1] is not None or outputs[2] is not None or outputs[0] is None:
        return None
    x, skip, gamma = (_input(node, k) for k in range(3))
    beta = None if simplified else _input(node, 3)
    bias = _input(node, 3 if simplified else 4)
    dims = s.shapes.get(x) if x else None
    if not (x and skip and gamma) or not dims or not isinstance(dims[-1], int) or dims[-1] <= 0:
        return None
    val = s("Add", x, skip)
    if bias:
        val = s("Add", val, bias)
    if outputs[3] is not None:
        s.protos.append(helper.make_node("Identity", [val], [outputs[3].name], name=s.names.fresh_node(val)))
    scaled = s("Mul", val, s.const(1.0 / dims[-1]))
    axes = s.ints([-1])
    mean_sq = s.step("ReduceSum", [s("Mul", scaled, val), axes], keepdims=1)
    if simplified:
        variance = mean_sq
    else:
        mean = s.step("ReduceSum", [scaled, axes], keepdims=1)
        variance = s("Sub", mean_sq, s("Mul", mean, mean))
    wide = s.step("Cast", [s("Add", variance, s.const(_attr(node, "epsilon", 1e-12)))], to=onnx.TensorProto.FLOAT)
    rsigma = s.step("Cast", [s("Reciprocal", s("Sqrt", wide))], to=s.low)
    if simplified:
        return s("Mul", s("Mul", gamma, val), rsigma)
    out = s("Mul", s("Mul", gamma, s("Sub", val, mean)), rsigma)
    return s("Add", out, beta) if beta else out


SOFTMAX_EFFICIENT = (1024, 2048)  # softmax.cc: the resource-efficient warp kernel for 1024 < D <= 2048


def _softmax(s: Steps, node) -> str | None:
    """softmax_warp_forward_resource_efficient (rows of 1024 < D <= 2048; the table's condition also asks
    for N >= 8192 rows, which a static shape seldom tells: the steps are taken for every such row, the side
    that shows more error): the row stays in T, so x - max rounds, exp(x - max) is stored in T (rounds), and
    the output is that value times the float reciprocal of the float sum, rounded once more. Other rows take
    the general kernel (float, one rounding) and are left as they are. Opset 13 and later (one axis)."""
    x = _input(node, 0)
    if not x or s.opset < 13 or s.low != FLOAT16:
        return None
    dims = s.shapes.get(x)
    axis = _attr(node, "axis", -1)
    if not dims or not -len(dims) <= axis < len(dims):
        return None
    width = dims[axis]
    if not isinstance(width, int) or not SOFTMAX_EFFICIENT[0] < width <= SOFTMAX_EFFICIENT[1]:
        return None
    if s.opset >= 18:
        peak = s.step("ReduceMax", [x, s.ints([axis])], keepdims=1)
    else:
        peak = s.step("ReduceMax", [x], axes=[axis], keepdims=1)
    e = s("Exp", s("Sub", x, peak))  # both stored in T
    wide = s.step("Cast", [e], to=onnx.TensorProto.FLOAT)
    total = s.step("ReduceSum", [wide, s.ints([axis])], keepdims=1)  # float accumulation
    return s.step("Cast", [s("Mul", wide, s("Reciprocal", total))], to=s.low)


def _static_shapes(model: onnx.ModelProto) -> dict:
    """tensor name -> dims (ints, None where symbolic) from ONNX shape inference, main graph."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):  # no shapes: the programs needing them decline
        return {}
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return out


def _rounded_alpha(node, low: int, default: float) -> bool:
    """LeakyRelu, ThresholdedRelu: the kernel converts alpha to the low type, then does one operation with it.
    Whether the node's alpha changed (False: the low type holds it exactly)."""
    alpha = _attr(node, "alpha", default)
    rounded = float(round_trip(np.array([alpha], dtype=np.float32), low)[0])
    if rounded == np.float32(alpha):
        return False
    kept = [a for a in node.proto.attribute if a.name != "alpha"]
    del node.proto.attribute[:]
    node.proto.attribute.extend([*kept, helper.make_attribute("alpha", rounded)])
    return True


PROGRAMS: dict[tuple[str, str], Callable[[Steps, object], str | None]] = {
    (MS, "FastGelu"): _fast_gelu,
    ("", "Gelu"): _gelu,
    (MS, "BiasGelu"): _bias_gelu,
    (MS, "QuickGelu"): _quick_gelu,
    ("", "Sigmoid"): _sigmoid,
    ("", "Elu"): _elu,
    ("", "Selu"): _selu,
    ("", "Softplus"): _softplus,
    ("", "Softsign"): _softsign,
    ("", "HardSigmoid"): _hard_sigmoid,
    ("", "Sum"): _sum,
    (MS, "BiasAdd"): _bias_add,
    ("", "Softmax"): _softmax,
    (MS, "SkipLayerNormalization"): _skip_layer_norm,
    (MS, "SkipSimplifiedLayerNormalization"): _skip_layer_norm,
}
NEEDS_SHAPES = {("", "Softmax"), (MS, "SkipLayerNormalization"), (MS, "SkipSimplifiedLayerNormalization")}
MULTI_OUTPUT = {(MS, "SkipLayerNormalization"), (MS, "SkipSimplifiedLayerNormalization")}  # the sum output too
ALPHA_ONLY = {("", "LeakyRelu"): 0.01, ("", "ThresholdedRelu"): 1.0}
_OPS = {op for _, op in PROGRAMS} | {op for _, op in ALPHA_ONLY}


def _per_step(node, low: int) -> bool:
    """Whether the compute table says the node's CUDA kernel rounds inside, on its general path or another."""
    fact = computes_in_fp32(None, node.domain, node.op, low)
    return fact is not None and (fact.rounds == "per-step" or any(c.rounds == "per-step" for c in fact.conditions))


def _ops_in(graph: onnx.GraphProto):
    for node in graph.node:
        yield node.op_type
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                yield from _ops_in(sub)


def decompose(model: onnx.ModelProto, where: str = "<converted>") -> int:
    """Rewrite, in place, each node of `model` whose CUDA kernel computes per step at its low type into those
    steps (see the module's text). Returns how many nodes were rewritten (0: the model is unchanged)."""
    if _OPS.isdisjoint(_ops_in(model.graph)):
        return 0
    index = build_index(model, where)
    if (index.opset("") or 0) < MIN_OPSET:
        return 0
    names = Names(index)
    after: dict[int, list] = {}
    done = 0
    opset = index.opset("") or 0
    shapes = _static_shapes(model) if any(op in {o for _, o in NEEDS_SHAPES} for op in _ops_in(model.graph)) else {}
    for node in index.nodes:
        key = (normalize_domain(node.domain), node.op)
        outputs = [v for v in node.outputs if v is not None]
        if (key not in PROGRAMS and key not in ALPHA_ONLY) or not outputs:
            continue
        if key not in MULTI_OUTPUT and (len(outputs) != 1 or len(node.outputs) != 1):
            continue
        low = outputs[0].dtype
        if low not in (FLOAT16, BFLOAT16) or not _per_step(node, low):
            continue
        if key in ALPHA_ONLY:
            done += _rounded_alpha(node, low, ALPHA_ONLY[key])
            continue
        steps = Steps(names, node, low, opset, shapes)
        if PROGRAMS[key](steps, node) is None:
            continue
        steps.protos[-1].output[0] = node.outputs[0].name
        if node.proto.name:
            steps.protos[0].name = node.proto.name
        node.proto.CopyFrom(steps.protos[0])
        after[node.id] = steps.protos[1:]
        done += 1
    if after:
        write_nodes(index, {}, after)
    return done
