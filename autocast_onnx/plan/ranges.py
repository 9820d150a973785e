"""Bounds from the graph: the interval a float tensor's values lie in, where the graph proves one,
and whether the outputs of an op that can grow (Exp, Pow, sums, ...) stay within the low type.

The fast plan (plan/kernel_io.py) runs at low-precision inputs and outputs the keep_fp32 ops
whose runtime kernel computes in fp32 and rounds once. For an op whose outputs stay within the
range of its inputs or a fixed range (a normalization, Softmax, Tanh), that rounds values the low
type holds; for an op whose outputs grow it holds only where the graph bounds them. So the ops of
RANGED are judged here, from the bounds of what they read:

    Exp(x - ReduceMax(x))         x - max(x) <= 0, so exp(.) <= 1: fits
    Exp(x)                        x is bounded only by the low type (65504): exp can overflow
    ReduceSum(Sigmoid(x), N=300)  <= 300: fits          Pow(x, 2) of an unbounded x: up to 4.3e9
    Log(Softmax(x))               Softmax's output can be 0 (or flush): log of it is -inf

Bounds are sound intervals (every value lies in them) computed by interval arithmetic over a
fixed set of ops; anything else is unknown. A tensor the fast plan reads is stored in (or cast
to) the low type, so an unknown input counts as the low type's whole finite range. Nothing here
reads a precision: the judgement is the values', the plan decides what to do with it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..dtypes import FLOAT, FLOAT16, dtype_name
from ..errors import AutocastError
from ..graph import GraphIndex
from .classify import constant_array, is_constant

Interval = tuple[float, float]

LOW_MAX: dict[int, float] = {FLOAT16: 65504.0}  # bf16 holds float32's range: nothing grows out of it that fp32 keeps
LOW_MIN_NORMAL: dict[int, float] = {FLOAT16: 2.0**-14}  # below it the low type keeps fewer bits (subnormals), then 0
PERIODIC_LIMIT = 4.0  # |angle| of a Sin/Cos input: below 4 fp16's spacing is at most 2**-9 rad
CONSTANT_LIMIT = 1 << 20  # elements of a constant read for its bounds
DEPTH_LIMIT = 48  # producers followed from one tensor

# the ops judged here: their kernels compute in fp32, their outputs can grow out of the low type
RANGED = frozenset({"Exp", "Log", "Pow", "ReduceSum", "ReduceL1", "ReduceL2", "ReduceProd", "Sin", "Cos"})

# ops whose output 0 takes its values from input 0 (moved, selected or averaged: within its bounds)
_WITHIN = frozenset(
    {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Gather", "GatherElements",
     "GatherND", "Slice", "Tile", "Cast", "MaxPool", "ReduceMax", "ReduceMin", "ReduceMean", "GlobalAveragePool",
     "GlobalMaxPool", "AveragePool", "DepthToSpace", "SpaceToDepth", "Split"}
)  # fmt: skip
_FIXED = {
    "Softmax": (0.0, 1.0),
    "Sigmoid": (0.0, 1.0),
    "HardSigmoid": (0.0, 1.0),
    "Tanh": (-1.0, 1.0),
    "Erf": (-1.0, 1.0),
    "Sin": (-1.0, 1.0),
    "Cos": (-1.0, 1.0),
    "Softsign": (-1.0, 1.0),
}


@dataclass(frozen=True)
class Verdict:
    """Whether a RANGED node's outputs stay within the low type, with the bound that says so (or
    that does not) and one clause for a reason: 'exp of x - max(x) <= 0 is at most 1'."""

    fits: bool
    bound: float | None  # the largest |value| of its output the graph allows (None: not bounded)
    text: str
    kind: str  # exp, log, square (any power), sum, product, periodic: what grows


class Bounds:
    """Interval bounds of the float tensors of `index`, computed on demand and memoised.
    `shapes`: tensor name -> (elem type, shape), the sizes validation generates (for the length
    of a reduced axis); None where the caller has none."""

    def __init__(self, index: GraphIndex, shapes: Mapping | None = None):
        self.index = index
        self.shapes = shapes or {}
        self._memo: dict[int, Interval | None] = {}

    def of(self, value, depth: int = 0) -> Interval | None:
        """The interval of `value`'s values, or None where the graph proves none."""
        if value is None:
            return None
        key = id(value)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # a cycle (a loop-carried value) reads as unknown
        out = self._compute(value, depth)
        self._memo[key] = out
        return out

    def _compute(self, value, depth: int) -> Interval | None:
        if is_constant(value):
            return _constant_bounds(value)
        node = value.producer
        if node is None or node.domain != "" or depth > DEPTH_LIMIT:
            return None
        return self._rule(node, value, depth + 1)

    def _rule(self, node, value, depth: int) -> Interval | None:
        op, ins = node.op, node.inputs

        def arg(k: int) -> Interval | None:
            return self.of(ins[k], depth) if k < len(ins) and ins[k] is not None else None

        if op in _FIXED:
            return _FIXED[op]
        if op in _WITHIN:
            return arg(0)
        if op in ("Concat", "Max", "Min", "Where"):
            parts = [arg(k) for k in range(1 if op == "Where" else 0, len(ins))]
            return _union(parts) if op in ("Concat", "Where") else _extreme(parts, op)
        if op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
            return self._binary(op, node, arg(0), arg(1))
        if op in ("Relu", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal"):
            return _unary(op, arg(0))
        if op == "Clip":
            return _clip(arg(0), arg(1), arg(2), node)
        if op == "Pow":
            exponent = _scalar(ins[1]) if len(ins) > 1 else None
            return power(arg(0), exponent) if exponent is not None else None
        if op == "ReduceSum":
            n = self.reduced_count(node)
            x = arg(0)
            return None if n is None or x is None else (min(x[0] * n, x[0]), max(x[1] * n, x[1]))
        return None

    def _binary(self, op: str, node, a: Interval | None, b: Interval | None) -> Interval | None:
        if op == "Sub" and _minus_its_max(node):
            x = self.of(node.inputs[0])
            return (-math.inf if x is None else x[0] - x[1], 0.0)
        if a is None or b is None:
            return None
        if op == "Add":
            return a[0] + b[0], a[1] + b[1]
        if op == "Sub":
            return a[0] - b[1], a[1] - b[0]
        if op == "Div":
            if b[0] <= 0.0 <= b[1]:
                return None
            b = (1.0 / b[1], 1.0 / b[0])
        products = [p * q for p in a for q in b]
        return None if any(map(math.isnan, products)) else (min(products), max(products))

    def reduced_count(self, node) -> int | None:
        """How many elements a Reduce* node sums into each output (its reduced axes' sizes), or
        None where a size or the axes are not known."""
        data = node.inputs[0] if node.inputs else None
        shape = self.shapes.get(data.name, (None, None))[1] if data is not None else None
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            return None
        axes = _axes(node)
        if axes is None:
            return None
        if not axes:
            noop = any(a.name == "noop_with_empty_axes" and a.i for a in node.proto.attribute)
            return 1 if noop else math.prod(shape)
        rank = len(shape)
        if any(not -rank <= a < rank for a in axes):
            return None
        return math.prod(shape[a % rank] for a in {a % rank for a in axes})


def judge(node, bounds: Bounds, low_type: int) -> Verdict | None:
    """Whether a RANGED node's outputs stay within the low type when it reads its inputs in the
    low type (an input the graph does not bound counts as the type's whole finite range). None
    for an op this module does not judge."""
    if node.domain != "" or node.op not in RANGED:
        return None
    top = LOW_MAX.get(low_type)
    if top is None:
        return Verdict(True, None, f"{dtype_name(low_type)} holds float32's range", "range")
    stored = (-top, top)
    x = _within(bounds.of(node.inputs[0]) if node.inputs else None, stored)
    low = dtype_name(low_type)
    judges = {"Exp": _judge_exp, "Log": _judge_log, "Pow": _judge_pow, "Sin": _judge_periodic, "Cos": _judge_periodic}
    if node.op in judges:
        return judges[node.op](node, x, top, low, low_type)
    return _judge_reduce(node, x, bounds.reduced_count(node), top, low)


def _judge_exp(node, x: Interval, top: float, low: str, low_type: int) -> Verdict:
    hi = math.exp(x[1]) if x[1] < 700 else math.inf
    said = f"its input is at most {x[1]:.4g}" + (" (x - max(x))" if _minus_its_max(node.inputs[0].producer) else "")
    if hi <= top:
        return Verdict(True, hi, f"{said}, so exp is at most {hi:.4g}", "exp")
    return Verdict(False, hi, f"{said}, so exp can reach {_num(hi)}, beyond {low}'s {top:g}", "exp")


def _judge_log(node, x: Interval, top: float, low: str, low_type: int) -> Verdict:
    floor = LOW_MIN_NORMAL[low_type]
    if x[0] >= floor:
        return Verdict(True, max(abs(math.log(x[0])), abs(math.log(x[1]))), f"its input is at least {x[0]:.4g}", "log")
    return Verdict(
        False,
        None,
        f"its input can be {x[0]:.4g}, below {low}'s smallest normal {floor:.3g}: stored in {low} it loses its "
        "digits or flushes to 0, and the log of it to -inf",
        "log",
    )


def _judge_pow(node, x: Interval, top: float, low: str, low_type: int) -> Verdict:
    exponent = _scalar(node.inputs[1]) if len(node.inputs) > 1 else None
    if exponent is None:
        return Verdict(False, None, "its exponent is not a constant scalar", "power")
    kind = "square" if exponent == 2 else "power"
    y = power(x, exponent)
    big = math.inf if y is None else max(abs(y[0]), abs(y[1]))
    if big <= top:
        return Verdict(True, big, f"x**{exponent:g} of |x| <= {_mag(x):.4g} is at most {big:.4g}", kind)
    return Verdict(False, big, f"x**{exponent:g} of |x| up to {_num(_mag(x))} can reach {_num(big)}", kind)


def _judge_periodic(node, x: Interval, top: float, low: str, low_type: int) -> Verdict:
    m = _mag(x)
    if m <= PERIODIC_LIMIT:
        return Verdict(True, 1.0, f"its angle is within +-{m:.4g}", "periodic")
    return Verdict(
        False,
        None,
        f"its angle can reach {_num(m)} (rotary positions, say): {low} spaces such values "
        f"{_spacing(m, low_type)} apart, a wrong phase",
        "periodic",
    )


def _judge_reduce(node, x: Interval, n: int | None, top: float, low: str) -> Verdict:
    m = _mag(x)
    if n is None:
        return Verdict(False, None, "the number of values it reduces is not known", "sum")
    grow = {"ReduceSum": n * m, "ReduceL1": n * m, "ReduceL2": math.sqrt(n) * m}
    big = grow.get(node.op)
    if big is None:  # ReduceProd
        big = m**n if m <= 1 or n * math.log(m) < 700 else math.inf
    kind = "product" if node.op == "ReduceProd" else "sum"
    if big <= top:
        return Verdict(True, big, f"it reduces {n:,} values of |x| <= {m:.4g}: at most {big:.4g}", kind)
    return Verdict(False, big, f"it reduces {n:,} values of |x| up to {_num(m)}: up to {_num(big)}", kind)


def power(x: Interval | None, p: float) -> Interval | None:
    """The interval of x**p (None where it is not bounded: a negative power of an interval
    holding 0, a fractional power of negatives)."""
    if x is None:
        return None
    lo, hi = x
    if p == 0:
        return 1.0, 1.0
    if p < 0 and lo <= 0.0 <= hi:
        return None
    if p != int(p) and lo < 0:
        return None

    def pw(v: float) -> float:
        try:
            return v**p
        except OverflowError:
            return math.inf if v > 0 or int(p) % 2 == 0 else -math.inf

    ends = [pw(lo), pw(hi)]
    if p == int(p) and int(p) % 2 == 0 and lo < 0 < hi:
        return 0.0, max(ends)
    return min(ends), max(ends)


def _minus_its_max(node) -> bool:
    """Whether `node` is Sub(x, ReduceMax(x)): every value at most 0."""
    if node is None or node.op != "Sub" or node.domain != "" or len(node.inputs) != 2:
        return False
    x, m = node.inputs
    reduce = m.producer if m is not None else None
    return reduce is not None and reduce.op == "ReduceMax" and reduce.domain == "" and reduce.inputs[0] is x


def float_constant(value, limit: int) -> np.ndarray | None:
    """The values of an fp32 constant of at most `limit` elements, as float32; None for anything
    else, or a constant that cannot be read here (the loader or the rewrite says why)."""
    if value.dtype != FLOAT or not is_constant(value):
        return None
    tensor = value.initializer
    if tensor is not None and math.prod(tensor.dims) > limit:
        return None
    try:
        array = constant_array(value)
    except (AutocastError, ValueError):
        return None
    if array is None or array.size > limit:
        return None
    return np.asarray(array, dtype=np.float32)


def _constant_bounds(value) -> Interval | None:
    """The interval of a float constant's values (None: not a float constant, too large to read,
    holding NaN, or unreadable here)."""
    array = float_constant(value, CONSTANT_LIMIT)
    if array is None or array.size == 0 or np.isnan(array).any():
        return None
    return float(array.min()), float(array.max())


def _axes(node) -> list | None:
    for attr in node.proto.attribute:
        if attr.name == "axes":
            return list(attr.ints)
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        if not is_constant(node.inputs[1]):
            return None
        array = constant_array(node.inputs[1])
        return None if array is None else [int(a) for a in np.asarray(array).ravel()]
    return []


def _scalar(value) -> float | None:
    if value is None or not is_constant(value):
        return None
    try:
        array = np.asarray(constant_array(value))
    except (AutocastError, ValueError, TypeError):
        return None
    if array.size != 1:
        return None
    return float(array.ravel()[0])


def _unary(op: str, x: Interval | None) -> Interval | None:
    if x is None:
        return (0.0, math.inf) if op in ("Relu", "Abs", "Sqrt", "Exp") else None
    lo, hi = x
    if op == "Relu":
        return max(lo, 0.0), max(hi, 0.0)
    if op == "Neg":
        return -hi, -lo
    if op == "Abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op == "Sqrt":
        return math.sqrt(max(lo, 0.0)), math.sqrt(max(hi, 0.0))
    if op == "Exp":
        return _exp(lo), _exp(hi)
    if op == "Log":
        return (math.log(lo), math.log(hi)) if lo > 0 else None
    return power(x, -1.0)  # Reciprocal


def _clip(x: Interval | None, lo: Interval | None, hi: Interval | None, node) -> Interval | None:
    floor, ceil = -math.inf, math.inf
    for attr in node.proto.attribute:  # opset < 11: min and max are attributes
        if attr.name == "min":
            floor = attr.f
        if attr.name == "max":
            ceil = attr.f
    if lo is not None:
        floor = lo[0]
    if hi is not None:
        ceil = hi[1]
    x = x if x is not None else (-math.inf, math.inf)
    out = (min(max(x[0], floor), ceil), max(min(x[1], ceil), floor))
    return None if math.isinf(out[0]) and math.isinf(out[1]) else out


def _union(parts: list) -> Interval | None:
    if not parts or any(p is None for p in parts):
        return None
    return min(p[0] for p in parts), max(p[1] for p in parts)


def _extreme(parts: list, op: str) -> Interval | None:
    if not parts or any(p is None for p in parts):
        return None
    pick = max if op == "Max" else min
    return pick(p[0] for p in parts), pick(p[1] for p in parts)


def _within(x: Interval | None, stored: Interval) -> Interval:
    """`x` as the low type stores it: within its finite range (an unknown tensor: all of it)."""
    if x is None or math.isnan(x[0]) or math.isnan(x[1]):
        return stored
    return max(x[0], stored[0]), min(x[1], stored[1])


def _exp(v: float) -> float:
    return math.exp(v) if v < 700 else math.inf


def _mag(x: Interval) -> float:
    return max(abs(x[0]), abs(x[1]))


def _num(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.4g}"


def _spacing(m: float, low_type: int) -> str:
    if low_type == FLOAT16 and m <= 65504:
        return f"{float(np.spacing(np.float16(min(m, 65000.0)))):g}"
    return "coarsely"
