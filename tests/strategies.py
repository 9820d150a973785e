"""Hypothesis strategies for the property-based tests (tests/contracts/test_properties.py).

`onnx_models()` draws small, VALID fp32 ONNX models (ir_version 8, opset 17: they pass
onnx.checker with full_check and run on ONNX Runtime's CPU provider) built from random "steps",
each a few nodes reading tensors made by earlier steps, so that every op category of
rules/default.toml meets every other:

  low_precision  MatMul, Gemm, Conv, Einsum, attention (MatMul of two activations, scaled, masked)
  follow         Add, Sub, Mul, Div, Max, Min, Sum, Relu, LeakyRelu, Sigmoid, Tanh, Neg, Abs, Clip
                 (also with an omitted min), Erf, Softsign, HardSigmoid, HardSwish, Elu, Selu, Celu
                 (float-only schema), Dropout, Where, Greater, Less, AveragePool,
                 GlobalAveragePool
  keep_fp32      Softmax, LayerNormalization (with its Mean/InvStdDev outputs sometimes),
                 BatchNormalization, InstanceNormalization, ReduceMean/Sum/Max/Min/L2/SumSquare,
                 Exp of bounded values, Log and Sqrt of positive values, Pow, Reciprocal, Sin, Cos,
                 Softplus, CumSum, Mean, EyeLike, RMS normalization
  clear          Reshape, Transpose, Identity, Concat, Slice, Split, Squeeze, Unsqueeze, Gather with
                 constant indices and as an embedding lookup, Pad, Expand, Tile, Flatten, MaxPool,
                 ArgMax, CastLike, Cast (author casts to FLOAT, FLOAT16 and DOUBLE and back), fp16
                 regions written by the author (fp16 ops and an fp16 initializer between casts)
  non_float      Shape, ConstantOfShape, Cast to int and back, comparisons feeding Where
  control flow   If (branches read outer-scope tensors and weights), Loop (trip count and/or a
                 condition computed in the body, one or two loop-carried values, an optional scan
                 output, the iteration counter), Scan; bodies nest two deep

and the structures that have broken mixed-precision converters before: tensors with several
consumers and binary ops joining branches; initializers shared by several consumers (a low and a
keep_fp32 consumer among them: a MatMul weight that is also a Softmax input or an embedding
table, a bias that is also a LayerNormalization scale), in the main graph and in bodies;
constants near the fp16 limits (6e4, 65504, 7e4, 1e5, 1e8, 1e-8, 1e-9, 1e-12 epsilons, -1e4,
-6e4, -1e9, -3.4e38 and -inf masks, weights with one out-of-range value or with values that
flush to zero); constants as Constant nodes (value, value_float, value_floats) or initializers
(raw bytes or typed fields); graph outputs that are also consumed inside the graph, outputs
straight from an initializer, a Constant node or the graph input, a float16 graph output, a
pinned fp32 output; an initializer that is also a graph input; float16 and int64 graph inputs;
symbolic dimensions; unnamed nodes; tensor names the converter would pick for its own casts
(NAME_fp16, ...); dead branches; value_info from shape inference, or none.

Numerical design. Every float tensor a step leaves for later steps (the "pool") has a proven
bound on |value| (computed from the actual weights and input data), and a step whose result
would exceed LIMIT is followed by squashing ops (Tanh, Sigmoid, Clip, LayerNormalization,
Softmax, RMS normalization) until it does not. So no tensor that a correct converter may put in
fp16 can overflow fp16, and the converted model must match the fp32 model to within
low-precision rounding. Values beyond the fp16 range occur only in constants whose consumers the
data rules must keep fp32, in patterns that bring the result back into range (Mul by 7e4 then
Div by 7e4; a mask then Softmax). The generator avoids what no converter can make exact without
data, so that a failure is a converter bug and not fp16 arithmetic:
  * discontinuous functions of tensors computed in low precision: comparisons and int casts read
    the exact fp32 graph inputs, or feed a Where whose branches agree at the threshold;
  * a fully masked row under an additive mask within the fp16 range (see additive_mask);
  * Softmax as the squashing op of values above 1e3 (bf16 rounds a logit of 1e5 by 256).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

F32, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
I64, BOOL = TensorProto.INT64, TensorProto.BOOL

# ---- profiles: the hypothesis settings of the property-based tests (AUTOCAST_ONNX_FUZZ, see
# tests/contracts/test_properties.py; tests/catalog/test_rules_hostile.py uses them too)
_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
}
settings.register_profile("autocast_onnx_quick", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile("autocast_onnx_long", max_examples=1000, **_COMMON)

PROFILE = os.environ.get("AUTOCAST_ONNX_FUZZ", "quick")
if PROFILE not in ("quick", "long"):
    raise ValueError(f"AUTOCAST_ONNX_FUZZ={PROFILE!r}: use quick or long")
FUZZ = settings.get_profile(f"autocast_onnx_{PROFILE}")
if os.environ.get("AUTOCAST_ONNX_FUZZ_EXAMPLES"):
    FUZZ = settings(FUZZ, max_examples=int(os.environ["AUTOCAST_ONNX_FUZZ_EXAMPLES"]))

# ---- models
D = 8  # the last axis of every pool tensor
SHAPES = [(2, D), (2, 4, D)]
LIMIT = 8.0  # bound on |value| of every pool tensor
OPSET = 17


@dataclass
class Tensor:
    name: str
    bound: float  # proven max |value|


@dataclass
class Generated:
    model: onnx.ModelProto
    feeds: dict
    steps: list = field(default_factory=list)  # the steps drawn, for the failure notes


def _colsum(w: np.ndarray) -> float:
    """max over output columns of sum |w| over the contracted axis (w: [K, N])."""
    return float(np.abs(w).sum(axis=0).max())


class _Builder:
    def __init__(self, draw, shape, rng):
        self.draw = draw
        self.shape = tuple(shape)
        self.rank = len(shape)
        self.rng = rng
        self.nodes = []  # the current graph's node list
        self.inits = []  # the current graph's initializer list
        self.main_inits = self.inits
        self.depth = 0  # 0 in the main graph, 1 inside a body
        self.pool: list[Tensor] = []
        self.weights: dict = {}  # shape -> [(name, array)] visible everywhere (main graph)
        self.arrays: dict = {}  # initializer name -> array (main graph)
        self.counter = 0
        self.steps: list = []
        self.extra_outputs: list = []  # (name, elem_type, shape) outputs that are not pool tensors
        self.x_names: list = []  # exact fp32 graph inputs
        # ONNX Runtime (1.31 at least) fails with "Missing Input" when the result of a lossless pair of
        # casts (float->float->float, float->double->float, an Identity between them or not) is read
        # inside an If/Loop body: its cast-removal pass does not rename the implicit input. Such
        # results are kept out of subgraph bodies (the converter's output is not restricted).
        self.cast_out: set = set()  # outputs of Cast(to=FLOAT)
        self.used: set = set()  # tensor names taken
        self.ids = None  # name of the int64 graph input, if any
        self.z, self.z_bound = None, 0.0  # name of the float16 graph input, if any
        self.constant_nodes: list = []  # (name, array) of main-graph Constant nodes
        self.no_outer: set = set()  # tensors subgraph bodies must not read

    # ---- names, nodes, constants ---------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}_{self.counter}"

    def out_name(self, op_type, inputs):
        """A fresh tensor name; sometimes one the converter or the emulation would pick for a tensor
        of their own (NAME_fp16, NAME_fp32, NAME_bf16, NAME__emu_raw of an input), to catch
        name collisions."""
        if inputs and inputs[0] and self.draw(st.integers(0, 9)) == 0:
            name = f"{inputs[0]}{self.draw(st.sampled_from(['_fp16', '_fp32', '_bf16', '__emu_raw', '_fp16_1']))}"
            if name not in self.used:
                self.used.add(name)
                return name
        name = self.fresh(f"t_{op_type.lower()}")
        self.used.add(name)
        return name

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.out_name(op_type, inputs) for _ in range(n_out)]
        name = "" if self.draw(st.integers(0, 7)) == 0 else self.fresh(f"n_{op_type}")  # unnamed nodes too
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, array, base="c"):
        """A constant as an initializer of the current graph, or (sometimes) a Constant node."""
        array = np.asarray(array)
        name = self.fresh(base)
        how = self.draw(st.integers(0, 7))
        if how >= 6:
            attr = {"value": numpy_helper.from_array(array, name)}
            if array.dtype == np.float32 and array.ndim == 0 and how == 7:
                attr = {"value_float": float(array)}
            elif array.dtype == np.float32 and array.ndim == 1 and how == 7:
                attr = {"value_floats": [float(v) for v in array]}
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("n_Constant"), **attr))
            if self.depth == 0:
                self.constant_nodes.append((name, array))
        else:
            self.inits.append(self.stored(array, name))
        return name

    def f32(self, value, base="c"):
        return self.const(np.asarray(value, dtype=np.float32), base)

    def i64(self, values, base="i"):
        return self.const(np.asarray(values, dtype=np.int64), base)

    def weight(self, shape, scale=1.0):
        """A float weight of the main graph: new, or (often) one already used elsewhere."""
        shape = tuple(shape)
        existing = self.weights.get(shape, [])
        if existing and self.draw(st.booleans()):
            return existing[self.draw(st.integers(0, len(existing) - 1))]
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        special = self.draw(st.integers(0, 15))
        if special == 0 and array.size > 1:
            # one value beyond the fp16 range (an outlier): its consumers must stay fp32 in fp16
            array.flat[self.draw(st.integers(0, array.size - 1))] = self.draw(st.sampled_from([7e4, -1e5]))
        elif special == 1:
            # values that flush to zero in fp16 (all of a small tensor, or a few of a large one)
            count = array.size if array.size <= 8 else self.draw(st.sampled_from([1, array.size // 4]))
            array.flat[:count] = self.draw(st.sampled_from([1e-9, -3e-8, 1e-12]))
        name = self.fresh("w")
        self.main_inits.append(self.stored(array, name))
        self.arrays[name] = array
        self.weights.setdefault(shape, []).append((name, array))
        return name, array

    def stored(self, array, name):
        """An initializer as raw bytes (usual) or in the typed float_data/int32_data fields."""
        if self.draw(st.integers(0, 3)) == 0 and array.dtype == np.float32:
            return helper.make_tensor(name, F32, array.shape, array.flatten().tolist(), raw=False)
        return numpy_helper.from_array(array, name)

    def pick(self) -> Tensor:
        """A pool tensor, recent ones first (shrinks towards a chain)."""
        k = self.draw(st.integers(0, len(self.pool) - 1))
        return self.pool[len(self.pool) - 1 - k]

    def x(self) -> str:
        return self.x_names[self.draw(st.integers(0, len(self.x_names) - 1))]

    def shape_of(self, t: Tensor) -> str:
        """S as an int64 tensor: a constant, or Shape(t) (a non-float op on a float tensor)."""
        if self.draw(st.booleans()):
            return self.op("Shape", [t.name])
        return self.i64(list(self.shape), "shape")

    def last_perm(self):
        return [1, 0] if self.rank == 2 else [0, 2, 1]

    def additive_mask(self, n, fill):
        """A [n] mask of 0 and `fill` to add to scores before a Softmax. A fill within the fp16
        range (-6e4, -65504, -1e4) leaves at least one position unmasked: in a fully masked row
        the fp32 softmax still ranks the scores (s - 6e4 keeps s to ~4e-3), while fp16, whose
        spacing at 6e4 is 32, cannot - correct fp16 arithmetic, not a converter bug. Fills beyond
        the range (-1e9, -3.4e38) keep their Add fp32 and may mask a row fully."""
        masked = self.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        if abs(fill) <= 65504 and all(masked):
            masked[self.draw(st.integers(0, n - 1))] = False
        return np.where(masked, fill, 0.0).astype(np.float32)

    # ---- bounded results -----------------------------------------------------------------
    def squash(self, t: Tensor) -> Tensor:
        kinds = ["Tanh", "Clip", "Sigmoid", "LayerNormalization", "RMS"]
        if t.bound <= 1e3:
            # Softmax is sensitive to absolute errors: bf16 rounds a logit of 1e5 by 256
            kinds.append("Softmax")
        kind = self.draw(st.sampled_from(kinds))
        self.steps.append(f"squash:{kind}")
        if kind == "Tanh":
            return Tensor(self.op("Tanh", [t.name]), 1.0)
        if kind == "Sigmoid":
            return Tensor(self.op("Sigmoid", [t.name]), 1.0)
        if kind == "Clip":
            return Tensor(self.op("Clip", [t.name, self.f32(-4.0), self.f32(4.0)]), min(t.bound, 4.0))
        if kind == "Softmax":
            return Tensor(self.op("Softmax", [t.name], axis=-1), 1.0)
        if kind == "LayerNormalization":
            return self.layernorm(t)
        return self.rms(t)

    def bounded(self, t: Tensor) -> Tensor:
        for _ in range(3):
            if t.bound <= LIMIT:
                return t
            t = self.squash(t)  # a LayerNormalization whose scale has an outlier may not do it
        if t.bound > LIMIT:
            self.steps.append("squash:Tanh")
            t = Tensor(self.op("Tanh", [t.name]), 1.0)
        return t

    def layernorm(self, t: Tensor) -> Tensor:
        (g, ga), (b, ba) = self.weight((D,), 0.5), self.weight((D,), 0.5)
        eps = self.draw(st.sampled_from([1e-5, 1e-12]))
        bound = np.sqrt(D - 1) * float(np.abs(ga).max()) + float(np.abs(ba).max())
        if self.draw(st.integers(0, 3)) == 0:
            # the Mean output too (pinned fp32 by rules/default.toml [pins])
            y, mean, inv = self.op("LayerNormalization", [t.name, g, b], n_out=3, axis=-1, epsilon=eps)
            if self.depth == 0 and self.draw(st.booleans()):
                self.extra_outputs.append((inv, F32, list(self.shape[:-1]) + [1]))  # a pinned fp32 output
            return Tensor(self.op("Add", [y, mean]), bound + t.bound)
        return Tensor(self.op("LayerNormalization", [t.name, g, b], axis=-1, epsilon=eps), bound)

    def rms(self, t: Tensor) -> Tensor:
        sq = self.op("Mul", [t.name, t.name])
        ms = self.op("ReduceMean", [sq], axes=[-1], keepdims=1)
        eps = self.f32(self.draw(st.sampled_from([1e-12, 1e-6])), "eps")
        den = self.op("Sqrt", [self.op("Add", [ms, eps])])
        return Tensor(self.op("Div", [t.name, den]), float(np.sqrt(D)))

    # ---- steps: each returns a new pool tensor of shape S --------------------------------
    def moved(self, w, wa):
        """The weight as it is, or passed through a clear op first (exporters often write
        MatMul(x, Transpose(W)))."""
        via = self.draw(st.sampled_from([None, None, "Transpose", "Identity", "Reshape"]))
        if via == "Transpose":
            return self.op("Transpose", [w], perm=[1, 0]), wa.T
        if via == "Identity":
            return self.op("Identity", [w]), wa
        if via == "Reshape":
            return self.op("Reshape", [w, self.i64(list(wa.shape), "wshape")]), wa
        return w, wa

    def s_matmul(self):
        t = self.pick()
        w, wa = self.moved(*self.weight((D, D), 1 / np.sqrt(D)))
        out, bound = self.op("MatMul", [t.name, w]), t.bound * _colsum(wa)
        if self.draw(st.booleans()):
            b, ba = self.weight((D,), 0.5)
            out, bound = self.op("Add", [out, b]), bound + float(np.abs(ba).max())
        return Tensor(out, bound)

    def s_gemm(self):
        t = self.pick()
        trans = self.draw(st.booleans())
        w, wa = self.weight((D, D), 1 / np.sqrt(D))
        c, ca = self.weight((D,), 0.5)
        alpha = self.draw(st.sampled_from([1.0, 0.5]))
        a = t.name if self.rank == 2 else self.op("Reshape", [t.name, self.i64([-1, D])])
        out = self.op("Gemm", [a, w, c], alpha=alpha, transB=int(trans))
        if self.rank != 2:
            out = self.op("Reshape", [out, self.shape_of(t)])
        return Tensor(out, alpha * t.bound * _colsum(wa.T if trans else wa) + float(np.abs(ca).max()))

    def s_conv(self):
        t = self.pick()
        channels = 1 if self.rank == 2 else self.shape[1]
        w = (self.rng.standard_normal((channels, channels, 3)) / np.sqrt(3 * channels)).astype(np.float32)
        wname = self.f32(w, "conv_w")
        inp = self.op("Unsqueeze", [t.name, self.i64([1])]) if self.rank == 2 else t.name
        ins, bound = [inp, wname], t.bound * float(np.abs(w).sum(axis=(1, 2)).max())
        if self.draw(st.booleans()):
            b = (self.rng.standard_normal(channels) * 0.5).astype(np.float32)
            ins.append(self.f32(b, "conv_b"))
            bound += float(np.abs(b).max())
        out = self.op("Conv", ins, kernel_shape=[3], pads=[1, 1])
        if self.rank == 2:
            out = self.op("Squeeze", [out, self.i64([1])])
        return Tensor(out, bound)

    def s_attention(self):
        q, k, v = self.pick(), self.pick(), self.pick()
        kt = self.op("Transpose", [k.name], perm=self.last_perm())
        scores = self.op("Mul", [self.op("MatMul", [q.name, kt]), self.f32(1 / np.sqrt(D), "scale")])
        if self.draw(st.booleans()):
            n = self.shape[-2]
            fill = self.draw(st.sampled_from([-1e9, -6e4, -65504.0, -3.4e38, -1e4, -np.inf]))
            mask = self.additive_mask(n, fill)
            scores = self.op("Add", [scores, self.f32(mask, "attn_mask")])
            self.steps.append(f"mask:{fill:g}")
        probs = self.op("Softmax", [scores], axis=-1)
        return Tensor(self.op("MatMul", [probs, v.name]), v.bound)

    def s_binary(self):
        kind = self.draw(st.sampled_from(["Add", "Mul", "Sub", "Max", "Min", "Div"]))
        a = self.pick()
        if self.draw(st.integers(0, 2)) == 0:
            shape = self.draw(st.sampled_from([(), (D,)]))
            arr = (self.rng.standard_normal(shape) * 2).astype(np.float32)
            if kind == "Div":
                arr = np.where(np.abs(arr) < 0.5, 0.5, arr).astype(np.float32)
            b = Tensor(self.f32(arr, "k"), float(np.abs(arr).max()))
            den = b
        else:
            b = self.pick()
            den = None
        self.steps.append(kind)
        if kind == "Div":
            if den is None:  # a denominator >= 1
                den = Tensor(self.op("Add", [self.op("Abs", [b.name]), self.f32(1.0)]), b.bound + 1)
                return Tensor(self.op("Div", [a.name, den.name]), a.bound)
            return Tensor(self.op("Div", [a.name, den.name]), a.bound / 0.5)
        bound = {
            "Add": a.bound + b.bound,
            "Sub": a.bound + b.bound,
            "Mul": a.bound * b.bound,
            "Max": max(a.bound, b.bound),
            "Min": max(a.bound, b.bound),
        }[kind]
        names = [a.name, b.name] if self.draw(st.booleans()) else [b.name, a.name]
        return Tensor(self.op(kind, names), bound)

    def s_unary(self):
        t = self.pick()
        kind = self.draw(
            st.sampled_from(
                [
                    "Relu",
                    "Sigmoid",
                    "Tanh",
                    "Neg",
                    "Abs",
                    "LeakyRelu",
                    "Clip",
                    "WhereLeaky",
                    "Sum",
                    "Erf",
                    "Softsign",
                    "HardSigmoid",
                    "HardSwish",
                    "Elu",
                    "Selu",
                    "Celu",
                    "Dropout",
                    "ClipMax",
                ]
            )
        )
        self.steps.append(kind)
        if kind in ("Relu", "Neg", "Abs", "HardSwish", "Elu", "Celu"):
            # Celu-12 has a float-only schema: the converter must keep it fp32
            return Tensor(self.op(kind, [t.name]), max(t.bound, 1.0))
        if kind in ("Sigmoid", "Tanh", "Erf", "Softsign", "HardSigmoid"):
            return Tensor(self.op(kind, [t.name]), 1.0)
        if kind == "Selu":
            return Tensor(self.op(kind, [t.name]), 1.06 * t.bound + 1.76)
        if kind == "Dropout":  # inference: identity; its ratio input has its own type parameter
            return Tensor(self.op(kind, [t.name, self.f32(0.3, "ratio")]), t.bound)
        if kind == "ClipMax":  # Clip with its min input left out
            return Tensor(self.op("Clip", [t.name, "", self.f32(2.0, "hi")]), t.bound)
        if kind == "LeakyRelu":
            return Tensor(self.op(kind, [t.name], alpha=0.1), t.bound)
        if kind == "Sum":
            u = self.pick()
            return Tensor(self.op("Sum", [t.name, u.name, t.name]), 2 * t.bound + u.bound)
        if kind == "Clip":
            lo, hi = self.draw(st.sampled_from([(-1.0, 1.0), (-4.0, 4.0), (0.0, 6.0), (-6e4, 6e4), (-65504.0, 6e4)]))
            return Tensor(
                self.op("Clip", [t.name, self.f32(lo, "lo"), self.f32(hi, "hi")]), min(t.bound, max(abs(lo), abs(hi)))
            )
        # a comparison on a low-precision tensor, into a Where continuous at the threshold
        cond = self.op("Greater", [t.name, self.f32(0.0, "zero")])
        slope = self.op("Mul", [t.name, self.f32(0.1, "slope")])
        return Tensor(self.op("Where", [cond, t.name, slope]), t.bound)

    def s_softmax(self):
        t = self.pick()
        axis = self.draw(st.sampled_from([-1, 0]))
        return Tensor(self.op("Softmax", [t.name], axis=axis), 1.0)

    def s_layernorm(self):
        return self.layernorm(self.pick())

    def s_reduce(self):
        t = self.pick()
        if self.draw(st.booleans()):
            r = self.op("ReduceMean", [t.name], axes=[-1], keepdims=1)
            rb = t.bound
        else:
            r = self.op("ReduceSum", [t.name, self.i64([-1])], keepdims=1)
            rb = D * t.bound
        self.steps.append("reduce")
        kind = self.draw(st.sampled_from(["Sub", "Add", "Mul"]))
        return Tensor(self.op(kind, [t.name, r]), t.bound * rb if kind == "Mul" else t.bound + rb)

    def s_exp(self):
        t = self.pick()
        kind = self.draw(st.sampled_from(["tanh", "clip", "negabs"]))
        if kind == "tanh":
            return Tensor(self.op("Exp", [self.op("Tanh", [t.name])]), float(np.e))
        if kind == "clip":
            inner = self.op("Clip", [t.name, self.f32(-3.0, "lo"), self.f32(3.0, "hi")])
            return Tensor(self.op("Exp", [inner]), float(np.exp(3.0)))
        return Tensor(self.op("Exp", [self.op("Neg", [self.op("Abs", [t.name])])]), 1.0)

    def s_log(self):
        t = self.pick()
        kind = self.draw(st.sampled_from(["abs+c", "sigmoid", "sigmoid+eps"]))
        if kind == "abs+c":
            c = self.draw(st.sampled_from([1.0, 0.5]))
            arg = self.op("Add", [self.op("Abs", [t.name]), self.f32(c, "c")])
            return Tensor(self.op("Log", [arg]), max(abs(np.log(c)), float(np.log(t.bound + c))))
        arg = self.op("Sigmoid", [t.name])
        if kind == "sigmoid+eps":
            arg = self.op("Add", [arg, self.f32(1e-8, "eps")])
        return Tensor(self.op("Log", [arg]), t.bound + 1.0)

    def s_pow(self):
        t = self.pick()
        kind = self.draw(st.sampled_from(["square", "cube", "sqrt"]))
        if kind == "sqrt":
            arg = self.op("Add", [self.op("Abs", [t.name]), self.f32(1.0, "one")])
            return Tensor(self.op("Pow", [arg, self.f32(0.5, "half")]), float(np.sqrt(t.bound + 1)))
        e = 2.0 if kind == "square" else 3.0
        return Tensor(self.op("Pow", [t.name, self.f32(e, "e")]), t.bound**e)

    def s_sqrt(self):
        t = self.pick()
        if self.draw(st.booleans()):
            return self.rms(t)
        eps = self.draw(st.sampled_from([1e-8, 1.0]))
        return Tensor(
            self.op("Sqrt", [self.op("Add", [self.op("Abs", [t.name]), self.f32(eps, "eps")])]),
            float(np.sqrt(t.bound + eps)),
        )

    def s_softmax_weight(self):
        """A weight read by a keep_fp32 op (Softmax) and, when shared, also by MatMuls."""
        t = self.pick()
        w, wa = self.weight((D, D), 1.0)
        p = self.op("Softmax", [w], axis=-1)
        e = np.exp(wa - wa.max(axis=-1, keepdims=True))
        pa = e / e.sum(axis=-1, keepdims=True)
        return Tensor(self.op("MatMul", [t.name, p]), t.bound * _colsum(pa) * 1.001)

    def s_reshape(self):
        t = self.pick()
        flat = self.op("Reshape", [t.name, self.i64(self.draw(st.sampled_from([[-1], [self.shape[0], -1]])))])
        if self.draw(st.booleans()):
            flat = self.op(self.draw(st.sampled_from(["Relu", "Tanh", "Identity"])), [flat])
        return Tensor(self.op("Reshape", [flat, self.shape_of(t)]), t.bound)

    def s_transpose(self):
        t = self.pick()
        perm = self.draw(st.permutations(list(range(self.rank))))
        inverse = [int(i) for i in np.argsort(perm)]
        tt = self.op("Transpose", [t.name], perm=list(perm))
        bound = t.bound
        if self.draw(st.booleans()):
            u = self.pick()
            ut = self.op("Transpose", [u.name], perm=list(perm))
            tt, bound = self.op("Add", [tt, ut]), t.bound + u.bound
        return Tensor(self.op("Transpose", [tt], perm=inverse), bound)

    def s_identity(self):
        t = self.pick()
        return Tensor(self.op("Identity", [t.name]), t.bound)

    def s_concat(self):
        a, b = self.pick(), self.pick()
        kind = self.draw(st.sampled_from(["slice", "matmul", "axis0"]))
        if kind == "axis0":
            c = self.op("Concat", [a.name, b.name], axis=0)
            start = self.draw(st.sampled_from([0, 1, 2]))
            return Tensor(
                self.op("Slice", [c, self.i64([start]), self.i64([start + self.shape[0]]), self.i64([0])]),
                max(a.bound, b.bound),
            )
        c = self.op("Concat", [a.name, b.name], axis=-1)
        if kind == "slice":
            start = self.draw(st.sampled_from([0, 4, 8]))
            return Tensor(
                self.op("Slice", [c, self.i64([start]), self.i64([start + D]), self.i64([-1])]), max(a.bound, b.bound)
            )
        w, wa = self.weight((2 * D, D), 1 / np.sqrt(2 * D))
        return Tensor(self.op("MatMul", [c, w]), max(a.bound, b.bound) * _colsum(wa))

    def s_squeeze(self):
        t = self.pick()
        axis = self.draw(st.sampled_from([0, self.rank]))
        u = self.op("Unsqueeze", [t.name, self.i64([axis])])
        if self.draw(st.booleans()):
            u = self.op("Relu", [u])
        return Tensor(self.op("Squeeze", [u, self.i64([axis])]), t.bound)

    def s_gather(self):
        t = self.pick()
        if self.draw(st.booleans()):
            idx = [int(i) for i in self.rng.permutation(D)]
            return Tensor(self.op("Gather", [t.name, self.i64(idx, "idx")], axis=-1), t.bound)
        return Tensor(self.op("Gather", [t.name, self.i64([1, 0], "idx")], axis=0), t.bound)

    def s_nonfloat(self):
        kind = self.draw(st.sampled_from(["int_cast", "indicator", "fill", "where_x"]))
        self.steps.append(kind)
        if kind == "int_cast":
            # float -> int -> float of an exact fp32 graph input
            xi = self.op("Cast", [self.x()], to=self.draw(st.sampled_from([I64, TensorProto.INT32])))
            return Tensor(self.op("Cast", [xi], to=F32), LIMIT)
        if kind == "indicator":
            # bool -> float 0/1 indicator times the same tensor (= Relu: continuous at 0)
            t = self.pick()
            ind = self.op("Cast", [self.op("Greater", [t.name, self.f32(0.0, "zero")])], to=F32)
            return Tensor(self.op("Mul", [t.name, ind]), t.bound)
        if kind == "fill":
            t = self.pick()
            fill = self.op(
                "ConstantOfShape",
                [self.op("Shape", [t.name])],
                value=numpy_helper.from_array(np.array([0.5], np.float32), "fill_value"),
            )
            return Tensor(self.op("Add", [t.name, fill]), t.bound + 0.5)
        # comparison on the exact graph input, choosing between two arbitrary tensors
        a, b = self.pick(), self.pick()
        cond = self.op("Less", [self.x(), self.f32(float(self.draw(st.sampled_from([0.0, 0.5, -1.0]))), "thr")])
        return Tensor(self.op("Where", [cond, a.name, b.name]), max(a.bound, b.bound))

    def s_cast(self):
        t = self.pick()
        kind = self.draw(st.sampled_from(["to_float", "fp16_round_trip", "double_round_trip"]))
        self.steps.append(kind)
        if kind == "to_float":
            out = self.op("Cast", [t.name], to=F32)
            if t.name in self.cast_out:
                self.no_outer.add(out)
            self.cast_out.add(out)
            return Tensor(out, t.bound)
        mid = self.op("Cast", [t.name], to=F16 if kind == "fp16_round_trip" else F64)
        between = self.draw(st.sampled_from([None, "Identity", "Neg"]))
        if between:
            mid = self.op(between, [mid])
        out = self.op("Cast", [mid], to=F32)
        self.cast_out.add(out)
        if kind == "double_round_trip" and between != "Neg":
            self.no_outer.add(out)
        return Tensor(out, t.bound)

    def s_limits(self):
        kind = self.draw(st.sampled_from(["x7e4", "mask_where", "mask_add", "tiny", "eps_add"]))
        self.steps.append(kind)
        t = self.pick()
        if kind == "x7e4":
            big = self.op("Mul", [t.name, self.f32(7e4, "big")])
            if self.draw(st.booleans()):
                big = self.op("Relu", [big])
            if self.depth == 0 and self.draw(st.integers(0, 2)) == 0:
                self.extra_outputs.append((big, F32, list(self.shape)))  # a graph output beyond fp16
            if self.draw(st.booleans()):
                return Tensor(self.op("Div", [big, self.f32(7e4, "big")]), t.bound)
            return Tensor(self.op("Mul", [big, self.f32(1 / 7e4, "small")]), t.bound * 1.001)
        if kind == "tiny":
            small = self.op("Mul", [t.name, self.f32(1e-8, "tiny")])
            return Tensor(self.op("Mul", [small, self.f32(1e8, "huge")]), t.bound * 1.001)
        if kind == "eps_add":
            return Tensor(
                self.op("Add", [t.name, self.f32(self.draw(st.sampled_from([1e-8, 1e-12])), "eps")]), t.bound + 1e-8
            )
        fill = self.draw(st.sampled_from([-1e9, -6e4, -65504.0, -3.4e38, -np.inf]))
        if kind == "mask_where":
            cond = self.op("Less", [self.x(), self.f32(float(self.draw(st.sampled_from([0.0, -0.5]))), "thr")])
            masked = self.op("Where", [cond, t.name, self.f32(fill, "fill")])
        else:
            mask = self.additive_mask(D, fill)
            masked = self.op("Add", [t.name, self.f32(mask, "mask")])
        return Tensor(self.op("Softmax", [masked], axis=-1), 1.0)

    def s_keep_more(self):
        """More keep_fp32 ops: Reciprocal, Sin, Cos, Softplus, CumSum, Mean, ReduceMax/Min/L2/SumSquare."""
        t = self.pick()
        kind = self.draw(
            st.sampled_from(
                [
                    "Reciprocal",
                    "Sin",
                    "Cos",
                    "Softplus",
                    "CumSum",
                    "Mean",
                    "ReduceMax",
                    "ReduceMin",
                    "ReduceL2",
                    "ReduceSumSquare",
                ]
            )
        )
        self.steps.append(kind)
        if kind == "Reciprocal":
            arg = self.op("Add", [self.op("Abs", [t.name]), self.f32(1.0, "one")])
            return Tensor(self.op(kind, [arg]), 1.0)
        if kind in ("Sin", "Cos"):
            return Tensor(self.op(kind, [t.name]), 1.0)
        if kind == "Softplus":
            return Tensor(self.op(kind, [t.name]), t.bound + 0.7)
        if kind == "CumSum":
            return Tensor(
                self.op(
                    kind,
                    [t.name, self.i64(np.array(-1), "axis")],
                    exclusive=int(self.draw(st.booleans())),
                    reverse=int(self.draw(st.booleans())),
                ),
                D * t.bound,
            )
        if kind == "Mean":
            u, v = self.pick(), self.pick()
            return Tensor(self.op(kind, [t.name, u.name, v.name]), max(t.bound, u.bound, v.bound))
        r = self.op(kind, [t.name], axes=[-1], keepdims=1)
        if kind in ("ReduceMax", "ReduceMin"):
            return Tensor(self.op("Sub", [t.name, r]), 2 * t.bound)
        den = self.op("Add", [r, self.f32(1.0, "one")])
        return Tensor(self.op("Div", [t.name, den]), t.bound)

    def s_norm(self):
        """BatchNormalization / InstanceNormalization over the channel axis (C = 8 for [2, 8],
        4 for [2, 4, 8]); some running variances are tiny or zero, as in trained models."""
        t = self.pick()
        channels = self.shape[1]
        scale, bias = self.weight((channels,), 0.5), self.weight((channels,), 0.5)
        eps = self.draw(st.sampled_from([1e-5, 1e-3]))
        if self.draw(st.booleans()) and self.rank == 3:
            out = self.op("InstanceNormalization", [t.name, scale[0], bias[0]], epsilon=eps)
            return Tensor(out, np.sqrt(D - 1) * float(np.abs(scale[1]).max()) + float(np.abs(bias[1]).max()))
        mean = (self.rng.standard_normal(channels) * 0.5).astype(np.float32)
        var = np.abs(self.rng.standard_normal(channels)).astype(np.float32) + 0.5
        if self.draw(st.booleans()):
            var[0] = self.draw(st.sampled_from([0.0, 1e-8, 1e-12]))  # a dead channel
        bound = (t.bound + float(np.abs(mean).max())) / float(np.sqrt(var.min() + eps)) * float(
            np.abs(scale[1]).max()
        ) + float(np.abs(bias[1]).max())
        out = self.op(
            "BatchNormalization",
            [t.name, scale[0], bias[0], self.f32(mean, "bn_mean"), self.f32(var, "bn_var")],
            epsilon=eps,
        )
        return Tensor(out, bound)

    def s_pool(self):
        t = self.pick()
        kind = self.draw(st.sampled_from(["AveragePool", "MaxPool", "GlobalAveragePool"]))
        self.steps.append(kind)
        inp = self.op("Unsqueeze", [t.name, self.i64([1])]) if self.rank == 2 else t.name
        if kind == "GlobalAveragePool":
            out = self.op("Add", [inp, self.op(kind, [inp])])
            bound = 2 * t.bound
        elif kind == "AveragePool":
            out = self.op(kind, [inp], kernel_shape=[3], pads=[1, 1], count_include_pad=int(self.draw(st.booleans())))
            bound = t.bound
        else:
            out = self.op(kind, [inp], kernel_shape=[3], pads=[1, 1])
            bound = t.bound
        if self.rank == 2:
            out = self.op("Squeeze", [out, self.i64([1])])
        return Tensor(out, bound)

    def s_einsum(self):
        t = self.pick()
        w, wa = self.weight((D, D), 1 / np.sqrt(D))
        return Tensor(self.op("Einsum", [t.name, w], equation="...j,jk->...k"), t.bound * _colsum(wa))

    def s_split(self):
        t = self.pick()
        first, second = self.op("Split", [t.name, self.i64([4, 4], "split")], n_out=2, axis=-1)
        if self.draw(st.booleans()):
            second = self.op(self.draw(st.sampled_from(["Relu", "Tanh", "Neg"])), [second])
        parts = [first, second] if self.draw(st.booleans()) else [second, first]
        return Tensor(self.op("Concat", parts, axis=-1), t.bound)

    def s_pad(self):
        t = self.pick()
        mode = self.draw(st.sampled_from(["constant", "reflect", "edge"]))
        pads = [0] * (2 * self.rank)
        pads[self.rank - 1] = pads[2 * self.rank - 1] = 1
        ins = [t.name, self.i64(pads, "pads")]
        bound = t.bound
        if mode == "constant" and self.draw(st.booleans()):
            value = self.draw(st.sampled_from([0.0, 0.5, -1.0]))
            ins.append(self.f32(value, "pad_value"))  # must take the data's type
            bound = max(bound, abs(value))
        padded = self.op("Pad", ins, mode=mode)
        start = self.draw(st.sampled_from([0, 1, 2]))
        return Tensor(self.op("Slice", [padded, self.i64([start]), self.i64([start + D]), self.i64([-1])]), bound)

    def s_shape_ops(self):
        """Expand, Tile, Flatten."""
        t = self.pick()
        kind = self.draw(st.sampled_from(["Expand", "Tile", "Flatten"]))
        self.steps.append(kind)
        if kind == "Expand":
            r = self.op("ReduceMean", [t.name], axes=[-1], keepdims=1)
            e = self.op("Expand", [r, self.shape_of(t)])
            return Tensor(self.op("Sub", [t.name, e]), 2 * t.bound)
        if kind == "Tile":
            tiled = self.op("Tile", [t.name, self.i64([1] * (self.rank - 1) + [2], "repeats")])
            start = self.draw(st.sampled_from([0, 4, 8]))
            return Tensor(self.op("Slice", [tiled, self.i64([start]), self.i64([start + D]), self.i64([-1])]), t.bound)
        flat = self.op("Flatten", [t.name], axis=self.draw(st.sampled_from([1, self.rank - 1])))
        if self.draw(st.booleans()):
            flat = self.op("Relu", [flat])
        return Tensor(self.op("Reshape", [flat, self.shape_of(t)]), t.bound)

    def s_eyelike(self):
        """EyeLike (keep_fp32, dtype from its input) feeding a MatMul."""
        t = self.pick()
        w, _ = self.weight((D, D), 1 / np.sqrt(D))
        return Tensor(self.op("MatMul", [t.name, self.op("EyeLike", [w])]), t.bound)

    def s_embedding(self):
        """Gather rows of a (maybe shared, tied) weight by indices: an int64 graph input, or ArgMax of
        an exact fp32 input."""
        w, wa = self.weight((D, D), 1 / np.sqrt(D))
        if self.ids is not None and self.draw(st.booleans()):
            ids = self.ids
        else:
            ids = self.op("ArgMax", [self.x()], axis=-1, keepdims=0)
        return Tensor(self.op("Gather", [w, ids], axis=0), float(np.abs(wa).max()))

    def s_castlike(self):
        t = self.pick()
        if self.draw(st.booleans()):
            return Tensor(self.op("CastLike", [t.name, self.pick().name]), t.bound)
        xi = self.op("Cast", [self.x()], to=I64)
        return Tensor(self.op("CastLike", [xi, t.name]), LIMIT)

    def s_fp16_segment(self):
        """An author's fp16 region: Cast to FLOAT16, fp16 ops (an fp16 initializer among them), Cast back."""
        t = self.pick()
        h = self.op("Cast", [t.name], to=F16)
        kind = self.draw(st.sampled_from(["Relu", "Tanh", "Add", "Mul"]))
        self.steps.append(f"fp16:{kind}")
        bound = t.bound
        if kind in ("Relu", "Tanh"):
            h = self.op(kind, [h])
            bound = 1.0 if kind == "Tanh" else bound
        elif kind == "Add":
            if self.z is not None and self.draw(st.booleans()):
                u = Tensor(self.z, self.z_bound)  # the fp16 graph input, read as it is
                h = self.op("Add", [h, u.name])
            else:
                u = self.pick()
                h = self.op("Add", [h, self.op("Cast", [u.name], to=F16)])
            bound = t.bound + u.bound
        else:
            c = (self.rng.standard_normal(D) * 0.5).astype(np.float16)
            h = self.op("Mul", [h, self.const(c, "c16")])
            bound = t.bound * float(np.abs(c.astype(np.float32)).max())
        if self.depth == 0 and self.draw(st.integers(0, 3)) == 0:
            self.extra_outputs.append((h, F16, list(self.shape)))  # a float16 graph output
        return Tensor(self.op("Cast", [h], to=F32), bound)

    def s_mask_where(self):
        """Where on a constant bool mask (not a comparison) with a large fill, into Softmax."""
        t = self.pick()
        keep = np.array(self.draw(st.lists(st.booleans(), min_size=D, max_size=D)))
        fill = self.draw(st.sampled_from([-1e9, -6e4, -3.4e38, 0.0, -np.inf]))
        masked = self.op("Where", [self.const(keep, "keep"), t.name, self.f32(fill, "fill")])
        return Tensor(self.op("Softmax", [masked], axis=-1), 1.0)

    # ---- control flow --------------------------------------------------------------------
    BODY_STEPS = (
        "s_matmul",
        "s_binary",
        "s_unary",
        "s_softmax",
        "s_layernorm",
        "s_cast",
        "s_reduce",
        "s_exp",
        "s_gather",
        "s_limits",
        "s_concat",
        "s_fp16_segment",
        "s_keep_more",
        "s_if",
        "s_loop",
    )

    def _body(self, local_pool, n_min=1):
        """Run 1-2 steps in a fresh graph scope; returns (nodes, initializers, result)."""
        saved = (self.nodes, self.inits, self.pool)
        self.nodes, self.inits = [], []
        self.pool = [t for t in saved[2] if t.name not in self.no_outer] + list(local_pool)
        self.depth += 1
        try:
            result = None
            for _ in range(self.draw(st.integers(n_min, 2))):
                name = self.draw(st.sampled_from(self.BODY_STEPS))
                if name in ("s_if", "s_loop") and self.depth >= 2:
                    name = "s_matmul"
                result = self.bounded(getattr(self, name)())
                self.pool.append(result)
            if result.name in [p.name for p in saved[2]] or not any(result.name in n.output for n in self.nodes):
                result = Tensor(self.op("Identity", [result.name]), result.bound)
            return self.nodes, self.inits, result
        finally:
            self.depth -= 1
            self.nodes, self.inits, self.pool = saved

    def s_if(self):
        if self.draw(st.booleans()):
            cond = self.const(np.array(self.draw(st.booleans())), "cond")
        else:
            total = self.op("ReduceSum", [self.x()], keepdims=0)
            cond = self.op("Greater", [total, self.f32(0.0, "zero")])
        branches = []
        for tag in ("then", "else"):
            nodes, inits, result = self._body([])
            out = self.fresh(f"{tag}_out")
            nodes.append(helper.make_node("Identity", [result.name], [out], name=self.fresh(f"n_{tag}_Identity")))
            g = helper.make_graph(
                nodes, self.fresh(f"{tag}_body"), [], [helper.make_tensor_value_info(out, F32, list(self.shape))], inits
            )
            branches.append((g, result.bound))
        out = self.op("If", [cond], then_branch=branches[0][0], else_branch=branches[1][0])
        self.steps.append("If")
        return Tensor(out, max(b for _, b in branches))

    def s_loop(self):
        v0 = self.pick()
        trips = self.draw(st.integers(1, 3))
        # the condition: none, a constant true, or computed in the body (then maybe no trip count)
        cond_kind = self.draw(st.sampled_from(["none", "const", "computed"]))
        m = self.i64(np.array(trips), "trips")
        if cond_kind == "computed" and self.draw(st.booleans()):
            m = ""  # a while loop: ends when the body says so
        cond_in = "" if cond_kind == "none" else self.const(np.array(True), "cond")
        it, c_in, v = self.fresh("iter"), self.fresh("cond_in"), self.fresh("v")
        local = [Tensor(v, max(v0.bound, 4.0))]  # loop-carried: ends every iteration squashed to <= 4
        w0 = self.pick() if self.draw(st.booleans()) else None
        if w0 is not None:  # a second loop-carried value
            w = self.fresh("w_carried")
            local.append(Tensor(w, max(w0.bound, 4.0)))
        saved_nodes = self.nodes
        nodes, inits, result = self._body(local)
        self.nodes = nodes  # back in the body for its last nodes
        self.depth += 1
        if self.draw(st.booleans()):  # the iteration counter, cast to float
            fi = self.op("Cast", [it], to=F32)
            result = Tensor(
                self.op("Add", [result.name, self.op("Mul", [fi, self.f32(0.1, "step")])]), result.bound + 0.3
            )
        carried = self.op(
            "Clip",
            [
                self.op("Tanh", [result.name]) if self.draw(st.booleans()) else result.name,
                self.f32(-4.0, "lo"),
                self.f32(4.0, "hi"),
            ],
        )
        if cond_kind == "computed":
            c_out = self.op("Less", [it, self.i64(np.array(self.draw(st.integers(0, 2))), "last_iter")])
        else:
            c_out = self.op("Identity", [c_in])
        outputs = [
            helper.make_tensor_value_info(c_out, BOOL, []),
            helper.make_tensor_value_info(carried, F32, list(self.shape)),
        ]
        body_inputs = [
            helper.make_tensor_value_info(it, I64, []),
            helper.make_tensor_value_info(c_in, BOOL, []),
            helper.make_tensor_value_info(v, F32, list(self.shape)),
        ]
        if w0 is not None:
            w_out = self.op(
                "Clip",
                [
                    self.op(self.draw(st.sampled_from(["Neg", "Relu", "Tanh"])), [w]),
                    self.f32(-4.0, "lo"),
                    self.f32(4.0, "hi"),
                ],
            )
            outputs.append(helper.make_tensor_value_info(w_out, F32, list(self.shape)))
            body_inputs.append(helper.make_tensor_value_info(w, F32, list(self.shape)))
        scan = self.draw(st.booleans())
        if scan:
            s = self.op("Identity", [result.name])
            outputs.append(helper.make_tensor_value_info(s, F32, list(self.shape)))
        self.nodes = saved_nodes
        self.depth -= 1
        body = helper.make_graph(nodes, self.fresh("loop_body"), body_inputs, outputs, inits)
        self.steps.append(
            f"Loop:{cond_kind}{'' if m else ':while'}{':2carried' if w0 else ''}{':scan' if scan else ''}"
        )
        carried_in = [v0.name] + ([w0.name] if w0 is not None else [])
        outs = self.op("Loop", [m, cond_in] + carried_in, n_out=len(carried_in) + int(scan), body=body)
        outs = outs if isinstance(outs, list) else [outs]
        for extra in outs[1 : len(carried_in)]:
            self.pool.append(Tensor(extra, 4.0))
        if scan:
            mean = self.op("ReduceMean", [outs[-1]], axes=[0], keepdims=0)
            self.pool.append(Tensor(outs[0], 4.0))
            return Tensor(mean, result.bound)
        return Tensor(outs[0], 4.0)

    def s_scan(self):
        """Scan over axis 0: a state of shape S[1:] (initial: ReduceMean over axis 0) updated from each
        slice with a MatMul, and a scan output; the scan output plus the final state (broadcast)."""
        t, u = self.pick(), self.pick()
        init_state = self.op("ReduceMean", [u.name], axes=[0], keepdims=0)
        state, row = self.fresh("state"), self.fresh("row")
        inner = list(self.shape[1:])
        saved_nodes, saved_pool = self.nodes, self.pool
        self.nodes, self.depth = [], self.depth + 1
        self.pool = [p for p in saved_pool if p.name not in self.no_outer]
        w, _ = self.weight((D, D), 1 / np.sqrt(D))
        mixed = self.op("Add", [state, self.op("MatMul", [row, w])])
        state_out = self.op(
            "Clip",
            [
                self.op("Tanh", [mixed]) if self.draw(st.booleans()) else mixed,
                self.f32(-4.0, "lo"),
                self.f32(4.0, "hi"),
            ],
        )
        kind = self.draw(st.sampled_from(["Add", "Mul", "Sub"]))
        scan_out = self.op(kind, [row, self.op("Identity", [state_out])])
        body_nodes = self.nodes
        self.nodes, self.pool, self.depth = saved_nodes, saved_pool, self.depth - 1
        body = helper.make_graph(
            body_nodes,
            self.fresh("scan_body"),
            [helper.make_tensor_value_info(state, F32, inner), helper.make_tensor_value_info(row, F32, inner)],
            [helper.make_tensor_value_info(state_out, F32, inner), helper.make_tensor_value_info(scan_out, F32, inner)],
        )
        final, stacked = self.op("Scan", [init_state, t.name], n_out=2, body=body, num_scan_inputs=1)
        bound = t.bound * 4.0 if kind == "Mul" else t.bound + 4.0
        return Tensor(self.op("Add", [stacked, final]), bound + 4.0)


def _all_nodes(nodes):
    for n in nodes:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g.node)


# Step kinds with their draw weights; simplest first (hypothesis shrinks towards the first).
STEPS = [
    ("s_unary", 3),
    ("s_binary", 4),
    ("s_matmul", 6),
    ("s_gemm", 2),
    ("s_conv", 2),
    ("s_attention", 3),
    ("s_softmax", 2),
    ("s_layernorm", 2),
    ("s_reduce", 2),
    ("s_exp", 1),
    ("s_log", 1),
    ("s_pow", 1),
    ("s_sqrt", 1),
    ("s_softmax_weight", 1),
    ("s_reshape", 1),
    ("s_transpose", 1),
    ("s_identity", 1),
    ("s_concat", 2),
    ("s_squeeze", 1),
    ("s_gather", 1),
    ("s_nonfloat", 2),
    ("s_cast", 2),
    ("s_limits", 3),
    ("s_if", 2),
    ("s_loop", 2),
    ("s_keep_more", 2),
    ("s_norm", 1),
    ("s_pool", 1),
    ("s_einsum", 2),
    ("s_split", 1),
    ("s_pad", 1),
    ("s_shape_ops", 1),
    ("s_eyelike", 1),
    ("s_embedding", 1),
    ("s_castlike", 1),
    ("s_fp16_segment", 2),
    ("s_mask_where", 1),
    ("s_scan", 1),
]
_STEP_LIST = [name for name, weight in STEPS for _ in range(weight)]


@st.composite
def onnx_models(draw, max_steps: int = 12):
    """A valid fp32 model (see the module docstring) and fp32 feeds for its inputs."""
    shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    b = _Builder(draw, shape, rng)
    scale = draw(st.sampled_from([1.0, 2.0]))
    feeds = {"x": (rng.standard_normal(shape) * scale).astype(np.float32)}
    # declared input shapes: fixed, or with a symbolic batch dimension
    declared = list(shape) if draw(st.integers(0, 3)) else ["batch"] + list(shape[1:])
    inputs = [helper.make_tensor_value_info("x", F32, declared)]
    if draw(st.booleans()):
        feeds["y"] = (rng.standard_normal(shape) * scale).astype(np.float32)
        inputs.append(helper.make_tensor_value_info("y", F32, declared))
    for name, value in list(feeds.items()):
        value = np.clip(value, -LIMIT, LIMIT)
        feeds[name] = value
        b.x_names.append(name)
        b.pool.append(Tensor(name, max(float(np.abs(value).max()), 1e-3)))

    if draw(st.integers(0, 4)) == 0:  # a float16 input, read as it is and cast up
        z = np.clip(rng.standard_normal(shape) * scale, -LIMIT, LIMIT).astype(np.float16)
        feeds["z"] = z
        inputs.append(helper.make_tensor_value_info("z", F16, declared))
        b.z, b.z_bound = "z", float(np.abs(z.astype(np.float32)).max())
        b.pool.append(Tensor(b.op("Cast", ["z"], to=F32), b.z_bound))
        b.cast_out.add(b.pool[-1].name)

    if draw(st.integers(0, 3)) == 0:  # an int64 input (token ids)
        feeds["ids"] = rng.integers(0, D, size=shape[:-1]).astype(np.int64)
        inputs.append(helper.make_tensor_value_info("ids", I64, declared[:-1]))
        b.ids = "ids"

    if draw(st.integers(0, 3)) == 0:
        # a weight of the activations' shape in the pool: read by any step, maybe a graph output
        name, array = b.weight(shape, 1.0)
        b.pool.append(Tensor(name, float(np.abs(array).max())))

    for _ in range(draw(st.integers(1, max_steps))):
        name = draw(st.sampled_from(_STEP_LIST))
        b.steps.append(name[2:])
        b.pool.append(b.bounded(getattr(b, name)()))

    # Outputs: the last tensor; most tensors nothing reads (so that what the graph computes is
    # seen); and pool tensors that are often also consumed inside the graph.
    produced = [t.name for t in b.pool if t.name not in feeds and t.name not in b.arrays]
    outputs = [produced[-1]] if produced else [b.pool[-1].name]
    read = set()
    for n in _all_nodes(b.nodes):
        read.update(n.input)
    leaves = [name for name in produced if name not in read and name not in outputs]
    outputs += leaves[-draw(st.integers(0, 3)) :] if leaves else []
    for name in draw(st.lists(st.sampled_from(produced or outputs), max_size=2, unique=True)):
        if name not in outputs:
            outputs.append(name)
    # declared output shapes: fixed, with the symbolic batch dimension, or all symbolic
    out_shape = draw(st.sampled_from([list(shape), list(shape), declared, [f"d{k}" for k in range(len(shape))]]))
    value_infos = [helper.make_tensor_value_info(n, F32, out_shape) for n in outputs]
    for name, elem, out_shape in b.extra_outputs:
        if name not in outputs:
            outputs.append(name)
            value_infos.append(helper.make_tensor_value_info(name, elem, out_shape))
    if b.arrays and draw(st.integers(0, 4)) == 0:  # an output straight from an initializer
        name = draw(st.sampled_from(sorted(b.arrays)))
        value_infos.append(helper.make_tensor_value_info(name, F32, list(b.arrays[name].shape)))
    if draw(st.integers(0, 7)) == 0:  # the graph input itself as an output
        value_infos.append(helper.make_tensor_value_info("x", F32, list(shape)))
    if b.constant_nodes and draw(st.integers(0, 4)) == 0:  # an output straight from a Constant node
        name, array = b.constant_nodes[draw(st.integers(0, len(b.constant_nodes) - 1))]
        if name not in [vi.name for vi in value_infos]:
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            value_infos.append(helper.make_tensor_value_info(name, elem, list(array.shape)))
    if b.arrays and draw(st.integers(0, 5)) == 0:  # an initializer that is also a graph input
        name = draw(st.sampled_from(sorted(b.arrays)))
        inputs.append(helper.make_tensor_value_info(name, F32, list(b.arrays[name].shape)))

    graph = helper.make_graph(b.nodes, "fuzz", inputs, value_infos, b.main_inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    if draw(st.booleans()):
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # with value_info
    return Generated(model=model, feeds=feeds, steps=b.steps)
