"""`--opset N` keeps what the model computes, or refuses naming the node (issue 36, defect 2).

ONNX's version converter rewrites a node where its op's schema changes between two opsets, and some
of its adapters change what the node computes. The upgrade (rewrite/opset.py) therefore compares the
upgraded fp32 model with the original on generated inputs (rewrite/opset_check.py). The table below
holds a one-node model, at an older opset, of every default-domain op whose schema changes between
opset 7 and the newest the installed onnx knows (test_every_op_that_changes_has_a_case_or_a_reason
holds the table to the schemas), with representative attributes, above all the ones whose meaning
moved: Resize/Upsample modes, the Softmax family's axis (11 -> 13), Pad's attributes to inputs
(10 -> 11), Split, the reductions' axes (attribute -> input), Clip, Slice, TopK, Squeeze/Unsqueeze,
Dropout, BatchNormalization, Scan 8 -> 9, RoiAlign's coordinates (10 -> 16), GridSample's modes
(16 -> 20), GroupNormalization's scale (18 -> 21). Each is upgraded through the library API and must
either be refused in one AutocastError naming the node, or give a model that agrees with the original
on inputs the test draws itself (not the check's), and passes the full ONNX checker."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, defs, helper

from autocast_onnx import AutocastError
from autocast_onnx.rewrite import opset_check
from autocast_onnx.rewrite.opset import changed_nodes, upgrade_opset

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
LATEST = defs.onnx_opset_version()
X = (2, 3, 4)  # a float graph input of this shape
IMG = (1, 2, 5, 5)  # an image batch


@dataclass
class Case:
    """A one-node model: `inputs` in order (a tuple: a float graph input of that shape; (type, shape):
    a graph input of that type; an array: an initializer; "": an absent optional input), `outputs`
    their types (float by default), and the opsets to upgrade to. `refused`: the words the refusal
    must hold, for an upgrade known to change the meaning (None: it must keep it)."""

    op: str
    opset: int
    inputs: list
    attrs: dict = field(default_factory=dict)
    outputs: list = field(default_factory=lambda: [F])
    targets: tuple = ()
    refused: str | None = None
    id: str = ""
    outer: dict = field(default_factory=dict)  # float graph inputs that only bodies read: name -> shape

    def model(self) -> onnx.ModelProto:
        graph_inputs, inits, names = [], [], []
        for k, spec in enumerate(self.inputs):
            name = f"i{k}"
            if isinstance(spec, str):
                names.append("")
                continue
            names.append(name)
            if isinstance(spec, np.ndarray):
                inits.append(onnx.numpy_helper.from_array(spec, name))
            elif isinstance(spec[0], tuple):
                graph_inputs.append(helper.make_tensor_value_info(name, spec[1], list(spec[0])))
            else:
                graph_inputs.append(helper.make_tensor_value_info(name, F, list(spec)))
        graph_inputs += [helper.make_tensor_value_info(n, F, list(shape)) for n, shape in self.outer.items()]
        outs = [f"o{k}" for k in range(len(self.outputs))]
        node = helper.make_node(self.op, names, outs, name="n", **self.attrs)
        graph = helper.make_graph(
            [node],
            "case",
            graph_inputs,
            [_output(o, t) for o, t in zip(outs, self.outputs, strict=True)],
            inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 7 if self.opset < 15 else 8
        try:  # the outputs' shapes, which ONNX's checker wants declared
            return onnx.shape_inference.infer_shapes(m)
        except onnx.shape_inference.InferenceError:
            return m

    def upgrade_to(self) -> tuple:
        return self.targets or tuple(t for t in (13, NEWEST) if t > self.opset)


def _output(name: str, elem_type) -> onnx.ValueInfoProto:
    """A graph output of a tensor type, or ("seq", type) for a sequence of such tensors."""
    if isinstance(elem_type, tuple):
        return helper.make_tensor_sequence_value_info(name, elem_type[1], None)
    return helper.make_tensor_value_info(name, elem_type, None)


def _ort_newest() -> int:
    """The newest opset at which ONNX Runtime's CPU provider runs the ops the table's cases use at
    their newest versions (the comparison needs both models to run)."""
    return min(LATEST, 24)


NEWEST = _ort_newest()


def a(*values, dtype=np.float32) -> np.ndarray:
    return np.array(values, dtype=dtype)


def ints(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def sc(value, dtype=np.float32) -> np.ndarray:
    """A scalar (rank 0) initializer."""
    return np.array(value, dtype=dtype)


def r(*shape, seed=0, low=None) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(values) + low if low is not None else values


UNARY_FIRST = {  # op -> the opset of a one-input case (the first version from 7)
    "Abs": 7, "Acos": 7, "Acosh": 9, "Asin": 7, "Asinh": 9, "Atan": 7, "Atanh": 9, "Ceil": 7, "Cos": 7,
    "Cosh": 9, "Elu": 7, "Erf": 9, "Exp": 7, "Floor": 7, "HardSigmoid": 7, "HardSwish": 14, "Log": 7,
    "Mish": 18, "Neg": 7, "Reciprocal": 7, "Relu": 7, "Round": 11, "Selu": 7, "Sigmoid": 7, "Sign": 9,
    "Sin": 7, "Sinh": 9, "Softplus": 7, "Softsign": 7, "Sqrt": 7, "Tan": 7, "Tanh": 7, "ThresholdedRelu": 10,
    "LeakyRelu": 7, "Celu": 12, "Identity": 7, "Shrink": 9, "LpNormalization": 7, "GlobalAveragePool": 7,
    "GlobalMaxPool": 7,
}  # fmt: skip
BINARY = {
    "Add": 7, "Sub": 7, "Mul": 7, "Div": 7, "Pow": 7, "Max": 7, "Min": 7, "Mean": 7, "Sum": 7, "PRelu": 7,
}  # fmt: skip
COMPARE = {"Equal": 11, "Greater": 7, "Less": 7, "GreaterOrEqual": 12, "LessOrEqual": 12}
REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin")
REDUCE += ("ReduceProd", "ReduceSum", "ReduceSumSquare")


def _cases() -> list[Case]:
    cases = [Case(op, v, [IMG if op in _IMAGE_OPS else X]) for op, v in UNARY_FIRST.items()]
    cases += [Case("IsNaN", 9, [X], outputs=[B]), Case("IsInf", 10, [X], outputs=[B])]
    cases += [Case("GlobalLpPool", 7, [IMG], {"p": 3}, targets=(13, 21))]
    # (axes given: ONNX's own inference of MeanVarianceNormalization-13's function fails without them)
    cases += [Case("MeanVarianceNormalization", 9, [IMG], {"axes": [0, 2, 3]})]
    cases += [Case(op, v, [X, (4,) if op not in _VARIADIC else X]) for op, v in BINARY.items()]
    cases += [Case(op, 8, [X, (4,), (3, 1)], id=f"{op}-8-broadcast") for op in _VARIADIC]
    cases += [Case(op, v, [X, (4,)], outputs=[B]) for op, v in COMPARE.items()]
    cases += [Case("Mod", 10, [X, r(4, low=0.5)], {"fmod": 1})]
    cases += _reductions() + _softmax_family() + _resizing() + _padding() + _shape_ops() + _nn_ops()
    cases += _index_ops() + _quantization() + _control_flow() + _newer_ops()
    for case in cases:
        case.id = case.id or f"{case.op}-{case.opset}"
    return cases


_VARIADIC = ("Max", "Min", "Mean", "Sum")  # broadcast from opset 8 only
_IMAGE_OPS = {"LpNormalization", "GlobalAveragePool", "GlobalMaxPool"}


def _reductions() -> list[Case]:
    cases = []
    for op in REDUCE:
        cases.append(Case(op, 11, [r(2, 3, 4, low=0.1)], {"axes": [1], "keepdims": 0}, id=f"{op}-11-axes"))
        cases.append(Case(op, 11, [r(2, 3, 4, low=0.1)], {"axes": [-1]}, id=f"{op}-11-negative"))
        cases.append(Case(op, 11, [r(2, 3, 4, low=0.1)], {}, id=f"{op}-11-all"))
    cases.append(Case("ReduceSum", 13, [X, ints(1)], {"keepdims": 1}, id="ReduceSum-13-input"))
    cases.append(Case("ReduceMean", 13, [X], {"axes": [0, 2]}, id="ReduceMean-13-axes"))
    cases += [Case(op, 11, [X], {"axis": 1, "keepdims": 0}, outputs=[I64]) for op in ("ArgMax", "ArgMin")]
    cases += [Case(op, 12, [X], {"axis": -1, "select_last_index": 1}, outputs=[I64]) for op in ("ArgMax", "ArgMin")]
    return cases


def _softmax_family() -> list[Case]:
    cases = []
    for op in ("Softmax", "LogSoftmax", "Hardmax"):
        for axis in (0, 1, -1, 2):
            # opset 11 flattens the input from `axis` on; opset 13 reduces along `axis` alone: the
            # same only for the last axis
            moved = op == "Hardmax" and axis in (0, 1)
            refused = "node 'n' (Hardmax-11 -> Hardmax-13)" if moved else None
            cases.append(Case(op, 11, [X], {"axis": axis}, refused=refused, id=f"{op}-11-axis{axis}"))
        # before opset 13 the default axis is 1
        refused = "node 'n' (Hardmax-1 -> Hardmax-13)" if op == "Hardmax" else None
        cases.append(Case(op, 7, [X], {}, refused=refused, id=f"{op}-7-default"))
    return cases


def _resizing() -> list[Case]:
    up, down, odd = a(1, 1, 2, 2), a(1, 1, 0.5, 0.5), a(1, 1, 1.5, 3)
    linear = "node 'n' (Resize-10 -> Resize-"
    cases = [
        Case("Resize", 10, [IMG, up], {"mode": "linear"}, refused=linear, id="Resize-10-linear"),
        Case("Resize", 10, [IMG, odd], {"mode": "linear"}, refused=linear, id="Resize-10-linear-odd"),
        Case("Resize", 10, [IMG, up], {"mode": "nearest"}, id="Resize-10-nearest"),
        Case("Resize", 10, [IMG, down], {"mode": "nearest"}, id="Resize-10-down"),
        Case("Resize", 10, [IMG, odd], {"mode": "nearest"}, id="Resize-10-odd"),
        Case("Resize", 10, [IMG, down], {"mode": "linear"}, refused=linear, id="Resize-10-linear-down"),
        Case("Upsample", 9, [IMG, up], {"mode": "linear"}, refused="node 'n' (Upsample-9", id="Upsample-9-linear"),
        Case("Upsample", 9, [IMG, up], {"mode": "nearest"}, id="Upsample-9-nearest"),
        Case("Upsample", 7, [IMG], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 2.0]}, id="Upsample-7-nearest"),
        Case("Upsample", 7, [IMG], {"mode": "linear", "scales": [1.0, 1.0, 2.0, 2.0]}, refused="node 'n'"),
    ]
    for mode in ("linear", "nearest", "cubic"):
        attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
        cases.append(Case("Resize", 11, [IMG, a(), a(1, 1, 1.5, 2)], attrs, id=f"Resize-11-{mode}"))
    sizes = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
    cases.append(Case("Resize", 13, [IMG, "", "", ints(1, 2, 7, 3)], sizes, id="Resize-13-sizes"))
    cases.append(Case("Resize", 18, [IMG, "", a(1, 1, 0.5, 0.5)], {"mode": "linear", "antialias": 1}))
    return cases


def _padding() -> list[Case]:
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    return [
        Case("Pad", 7, [IMG], {"pads": pads, "value": 1.5}, id="Pad-7-constant"),
        Case("Pad", 10, [IMG], {"pads": pads}, id="Pad-10-default"),
        Case("Pad", 10, [IMG], {"pads": pads, "mode": "reflect"}, id="Pad-10-reflect"),
        Case("Pad", 10, [IMG], {"pads": pads, "mode": "edge", "value": 2.0}, id="Pad-10-edge-value"),
        Case("Pad", 10, [IMG], {"pads": pads, "mode": "reflect", "value": 0.5}, id="Pad-10-reflect-value"),
        Case("Pad", 11, [IMG, ints(*pads), sc(3.0)], {}, id="Pad-11-inputs"),
        Case("Pad", 11, [IMG, ints(*pads)], {"mode": "edge"}, id="Pad-11-edge"),
        Case("Pad", 18, [IMG, ints(1, 2, 2, 1), sc(3.0), ints(2, 3)], {}, id="Pad-18-axes"),
    ]


def _shape_ops() -> list[Case]:
    two = [F, F]
    return [
        Case("Split", 7, [X], {"axis": 2, "split": [1, 3]}, outputs=two, id="Split-7"),
        Case("Split", 11, [X], {"axis": -1, "split": [3, 1]}, outputs=two, id="Split-11-negative"),
        Case("Split", 11, [X], {"axis": 1}, outputs=[F, F, F], id="Split-11-even"),
        Case("Split", 13, [X, ints(2, 2)], {"axis": 2}, outputs=two, id="Split-13-input"),
        Case("Split", 13, [X], {"axis": 2}, outputs=two, id="Split-13-even"),
        Case("Clip", 7, [X], {"min": -0.5, "max": 0.7}, id="Clip-7"),
        Case("Clip", 7, [X], {}, id="Clip-7-default"),
        Case("Clip", 11, [X, sc(-0.2), sc(0.4)], id="Clip-11"),
        Case("Clip", 12, [X, "", sc(0.4)], id="Clip-12-max"),
        Case("Slice", 7, [X], {"starts": [0, 1], "ends": [2, 3], "axes": [1, 2]}, id="Slice-7"),
        Case("Slice", 7, [X], {"starts": [1], "ends": [1000]}, id="Slice-7-clamped"),
        Case("Slice", 10, [X, ints(-1), ints(-1000), ints(2), ints(-1)], id="Slice-10-negative"),
        Case("Squeeze", 7, [(2, 1, 4)], {"axes": [1]}, id="Squeeze-7"),
        Case("Squeeze", 11, [(2, 1, 4)], {"axes": [-2]}, id="Squeeze-11-negative"),
        Case("Squeeze", 11, [(2, 1, 4)], {}, id="Squeeze-11-all"),
        Case("Unsqueeze", 7, [X], {"axes": [0, 3]}, id="Unsqueeze-7"),
        Case("Unsqueeze", 11, [X], {"axes": [-1]}, id="Unsqueeze-11-negative"),
        Case("Concat", 7, [X, X], {"axis": 1}),
        Case("Concat", 11, [X, X], {"axis": -1}),
        Case("Reshape", 7, [X, ints(4, -1)]),
        Case("Reshape", 14, [X, ints(0, 12)], {"allowzero": 0}),
        Case("Flatten", 7, [X], {"axis": 2}),
        Case("Flatten", 11, [X], {"axis": -1}),
        Case("Expand", 8, [(3, 1), ints(2, 3, 4)]),
        Case("Tile", 7, [X, ints(1, 2, 1)]),
        Case("Transpose", 7, [X], {"perm": [2, 0, 1]}),
        Case("DepthToSpace", 7, [(1, 8, 2, 3)], {"blocksize": 2}),
        Case("DepthToSpace", 11, [(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}),
        Case("SpaceToDepth", 7, [(1, 2, 4, 6)], {"blocksize": 2}),
        Case("Shape", 7, [X], outputs=[I64]),
        Case("Shape", 15, [X], {"start": 1, "end": -1}, outputs=[I64]),
        Case("Size", 7, [X], outputs=[I64]),
        Case("Cast", 7, [X], {"to": TensorProto.INT32}, outputs=[TensorProto.INT32]),
        Case("Cast", 13, [X], {"to": TensorProto.DOUBLE}, outputs=[TensorProto.DOUBLE]),
        Case("CastLike", 15, [X, np.zeros(1, np.float64)], outputs=[TensorProto.DOUBLE]),
        Case("Constant", 7, [], {"value": helper.make_tensor("v", F, [2], [1.0, 2.0])}),
        Case("Constant", 12, [], {"value_floats": [1.0, 2.0]}),
        Case("ConstantOfShape", 9, [ints(2, 3)], {"value": helper.make_tensor("v", F, [1], [0.5])}),
        Case("EyeLike", 9, [(3, 4)], {"k": 1}),
        Case("Range", 11, [sc(0.5), sc(4.0), sc(0.75)]),
        Case("Trilu", 14, [X, ints(1)], {"upper": 0}),
        Case("CumSum", 11, [X, ints(1)], {"exclusive": 1, "reverse": 1}),
        Case("Det", 11, [(2, 3, 3)]),
        Case("Einsum", 12, [X, (4, 5)], {"equation": "bij,jk->bik"}),
        Case("Dropout", 7, [X], {"ratio": 0.3}, id="Dropout-7"),
        # ONNX Runtime's Dropout-10 gives an inference mask of False, Dropout-12 one of True (its spec)
        Case("Dropout", 10, [X], {"ratio": 0.3}, outputs=[F, B], refused="node 'n' (Dropout-10", id="Dropout-10-mask"),
        Case("Dropout", 10, [X], {"ratio": 0.3}, id="Dropout-10"),
        Case("Dropout", 12, [X, sc(0.3)], id="Dropout-12-ratio"),
        Case("Dropout", 13, [X, sc(0.3), np.array(False)], outputs=[F, B], id="Dropout-13-inference"),
    ]


def _nn_ops() -> list[Case]:
    w, bias = r(3, 2, 3, 3, seed=1), r(3, seed=2)
    c = 2
    bn = [IMG, r(c, seed=3), r(c, seed=4), r(c, seed=5), r(c, seed=6, low=0.5)]
    return [
        Case("Conv", 7, [IMG, w, bias], {"pads": [1, 1, 1, 1]}),
        Case("Conv", 11, [IMG, w], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        Case("ConvTranspose", 7, [IMG, r(2, 3, 3, 3, seed=1)], {"strides": [2, 2], "output_padding": [1, 1]}),
        Case("ConvTranspose", 11, [IMG, r(2, 3, 2, 2, seed=1)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        Case("MatMul", 7, [X, (4, 5)]),
        Case("Gemm", 7, [(3, 4), (4, 5), (5,)], {"alpha": 0.5, "beta": 2.0}),
        Case("Gemm", 9, [(3, 4), (5, 4), (1, 5)], {"transB": 1}),
        Case("Gemm", 11, [(3, 4), (4, 5)], {}, id="Gemm-11-no-C"),
        Case("BatchNormalization", 7, bn, {"epsilon": 1e-3}, id="BatchNormalization-7"),
        Case("BatchNormalization", 7, bn, {"spatial": 1, "momentum": 0.8}, id="BatchNormalization-7-spatial"),
        Case("BatchNormalization", 9, bn, {"epsilon": 1e-3}),
        Case("BatchNormalization", 14, bn, {"training_mode": 0}),
        Case("InstanceNormalization", 7, [IMG, r(c, seed=1), r(c, seed=2)]),
        Case("LRN", 7, [IMG], {"size": 3, "alpha": 0.01}),
        # the converter keeps GroupNormalization-18's per-group scale and bias, which 21 reads per channel
        Case(
            "GroupNormalization",
            18,
            [(1, 4, 3, 3), r(2, seed=1), r(2, seed=2)],
            {"num_groups": 2},
            refused="node 'n' (GroupNormalization-18 -> GroupNormalization-21)",
        ),
        Case("AveragePool", 7, [IMG], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        Case("AveragePool", 10, [IMG], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        Case("AveragePool", 11, [IMG], {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}),
        Case("AveragePool", 19, [IMG], {"kernel_shape": [2, 2], "dilations": [2, 2]}),
        Case("MaxPool", 7, [IMG], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        Case("MaxPool", 8, [IMG], {"kernel_shape": [2, 2], "strides": [2, 2]}, outputs=[F, I64], id="MaxPool-8-idx"),
        Case("MaxPool", 10, [IMG], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "dilations": [1, 1]}),
        Case("MaxPool", 11, [IMG], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
        Case("MaxPool", 12, [IMG], {"kernel_shape": [2, 2], "dilations": [2, 2]}),
        Case("LpPool", 7, [IMG], {"kernel_shape": [2, 2], "p": 2}),
        Case("LpPool", 11, [IMG], {"kernel_shape": [2, 2], "p": 3, "strides": [2, 2]}),
        Case("LpPool", 18, [IMG], {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}),
        # (the CPU provider has no kernel for MaxRoiPool-22, RoiAlign-22, GlobalLpPool-22: test_kernel_warnings)
        Case("MaxRoiPool", 7, [IMG, a(0, 0, 0, 3, 3).reshape(1, 5)], {"pooled_shape": [2, 2]}, targets=(13, 21)),
        Case(
            "RoiAlign",
            10,
            [IMG, a(0, 0, 3, 3).reshape(1, 4), ints(0)],
            {"output_height": 2, "output_width": 2},
            targets=(13, 16, 21),
        ),
        Case(
            "RoiAlign",
            16,
            [IMG, a(0, 0, 3, 3).reshape(1, 4), ints(0)],
            {"coordinate_transformation_mode": "half_pixel"},
            targets=(21,),
        ),
        Case("GridSample", 16, [IMG, r(1, 3, 3, 2, seed=1) / 2], {"mode": "bilinear"}, id="GridSample-16-bilinear"),
        Case("GridSample", 16, [IMG, r(1, 3, 3, 2, seed=1) / 2], {"mode": "bicubic", "align_corners": 1}),
        Case("GridSample", 16, [IMG, r(1, 3, 3, 2, seed=1) / 2], {"mode": "nearest", "padding_mode": "border"}),
        Case("RNN", 7, [(3, 2, 4), r(1, 5, 4, seed=1), r(1, 5, 5, seed=2)], {"hidden_size": 5}, outputs=[F, F]),
        Case("GRU", 7, [(3, 2, 4), r(1, 15, 4, seed=1), r(1, 15, 5, seed=2)], {"hidden_size": 5}, outputs=[F, F]),
        Case(
            "GRU",
            7,
            [(3, 2, 4), r(1, 15, 4, seed=1), r(1, 15, 5, seed=2)],
            {"hidden_size": 5, "linear_before_reset": 1},
            outputs=[F, F],
            id="GRU-7-lbr",
        ),
        Case("LSTM", 7, [(3, 2, 4), r(1, 20, 4, seed=1), r(1, 20, 5, seed=2)], {"hidden_size": 5}, outputs=[F, F, F]),
        Case(
            "LSTM",
            14,
            [(3, 2, 4), r(1, 20, 4, seed=1), r(1, 20, 5, seed=2)],
            {"hidden_size": 5, "clip": 3.0},
            outputs=[F, F, F],
        ),
    ]


def _index_ops() -> list[Case]:
    return [
        Case("Gather", 7, [X, ints(1, 0)], {"axis": 1}),
        Case("Gather", 11, [X, ints(-1, 0)], {"axis": -1}),
        Case("GatherElements", 11, [X, np.zeros((2, 3, 4), np.int64)], {"axis": 1}),
        Case("GatherND", 11, [X, ints(1, 2).reshape(1, 2)]),
        Case("GatherND", 12, [X, ints(1, 2).reshape(2, 1)], {"batch_dims": 1}),
        Case("Scatter", 9, [X, np.zeros((2, 1, 4), np.int64), (2, 1, 4)], {"axis": 1}),
        Case("ScatterElements", 11, [X, np.ones((2, 1, 4), np.int64), (2, 1, 4)], {"axis": 1}),
        Case("ScatterElements", 16, [X, np.ones((2, 1, 4), np.int64), (2, 1, 4)], {"axis": 1, "reduction": "add"}),
        Case("ScatterND", 11, [X, ints(1).reshape(1, 1), (1, 3, 4)]),
        Case("ScatterND", 16, [X, ints(1).reshape(1, 1), (1, 3, 4)], {"reduction": "mul"}),
        Case("TopK", 7, [X], {"k": 2, "axis": 1}, outputs=[F, I64]),
        Case("TopK", 10, [X, ints(2)], {"axis": -1}, outputs=[F, I64]),
        Case("TopK", 11, [X, ints(3)], {"axis": 1, "largest": 0}, outputs=[F, I64]),
        Case("Where", 9, [np.array([True, False, True, False]), X, (4,)]),
        Case("NonZero", 9, [r(2, 3) > 0], outputs=[I64]),
        Case("OneHot", 9, [ints(0, 2, 1), ints(3), a(-1.0, 1.0)], {"axis": -1}),
        Case("OneHot", 11, [ints(0, -1, 1), ints(3), a(0.0, 2.0)], {"axis": 0}),
        Case("Compress", 9, [X, np.array([True, False, True])], {"axis": 1}),
        Case("Compress", 11, [X, np.array([False, True])], {"axis": -3}),
        Case("ReverseSequence", 10, [(3, 2, 4), ints(1, 3)], {"batch_axis": 1, "time_axis": 0}),
        Case("Unique", 11, [a(2, 1, 1, 3, 2)], {"sorted": 1}, outputs=[F, I64, I64, I64]),
        Case(
            "NonMaxSuppression",
            10,
            [
                a(0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, 3, 1, 4).reshape(1, 3, 4),
                a(0.9, 0.8, 0.7).reshape(1, 1, 3),
                ints(2),
                a(0.5),
            ],
            outputs=[I64],
        ),
        Case(
            "MaxUnpool",
            9,
            [(1, 1, 2, 2), ints(0, 3, 10, 15).reshape(1, 1, 2, 2)],
            {"kernel_shape": [2, 2], "strides": [2, 2]},
        ),
        Case(
            "MaxUnpool",
            11,
            [(1, 1, 2, 2), ints(0, 3, 10, 15).reshape(1, 1, 2, 2)],
            {"kernel_shape": [2, 2], "strides": [2, 2]},
        ),
        Case("SoftmaxCrossEntropyLoss", 12, [(3, 4), ints(1, 0, 3)], {"reduction": "mean"}),
        Case("NegativeLogLikelihoodLoss", 12, [(3, 4), ints(1, 0, 3)], {"reduction": "sum"}),
    ]


def _quantization() -> list[Case]:
    return [
        Case("QuantizeLinear", 10, [X, a(0.05), np.array(3, np.uint8)], outputs=[TensorProto.UINT8]),
        Case(
            "QuantizeLinear",
            13,
            [X, a(0.05, 0.1, 0.2), np.array([1, 2, 3], np.uint8)],
            {"axis": 1},
            outputs=[TensorProto.UINT8],
        ),
        Case("DequantizeLinear", 10, [np.arange(24, dtype=np.uint8).reshape(2, 3, 4), a(0.05), np.array(3, np.uint8)]),
        Case(
            "DequantizeLinear",
            13,
            [np.arange(24, dtype=np.int8).reshape(2, 3, 4), a(0.05, 0.1, 0.2), np.array([1, 2, 3], np.int8)],
            {"axis": 1},
        ),
        Case(
            "QLinearMatMul",
            10,
            [
                np.arange(12, dtype=np.uint8).reshape(3, 4),
                a(0.1),
                np.array(1, np.uint8),
                np.arange(8, dtype=np.uint8).reshape(4, 2),
                a(0.2),
                np.array(2, np.uint8),
                a(0.5),
                np.array(3, np.uint8),
            ],
            outputs=[TensorProto.UINT8],
        ),
    ]


def _body(inputs, outputs, nodes) -> onnx.GraphProto:
    return helper.make_graph(nodes, "body", inputs, outputs)


def _control_flow() -> list[Case]:
    then = _body(
        [],
        [helper.make_tensor_value_info("t", F, None)],
        [helper.make_node("ReduceSum", ["i1"], ["t"], axes=[1], keepdims=1, name="inner")],
    )
    other = _body(
        [],
        [helper.make_tensor_value_info("e", F, None)],
        [helper.make_node("Softmax", ["i1"], ["e"], axis=1, name="inner2")],
    )
    loop = _body(
        [
            helper.make_tensor_value_info("it", I64, []),
            helper.make_tensor_value_info("c", B, []),
            helper.make_tensor_value_info("s", F, None),
        ],
        [helper.make_tensor_value_info("c2", B, []), helper.make_tensor_value_info("s2", F, None)],
        [
            helper.make_node("Identity", ["c"], ["c2"]),
            helper.make_node("Unsqueeze", ["s"], ["u"], axes=[0]),
            helper.make_node("ReduceMean", ["u"], ["s2"], axes=[0], keepdims=0),
        ],
    )
    scan = _body(
        [helper.make_tensor_value_info("acc", F, [4]), helper.make_tensor_value_info("xt", F, [4])],
        [helper.make_tensor_value_info("acc2", F, [4]), helper.make_tensor_value_info("yt", F, [4])],
        [
            helper.make_node("Add", ["acc", "xt"], ["acc2"]),
            helper.make_node("Clip", ["acc2"], ["yt"], min=-1.0, max=1.0),
        ],
    )
    lens_body = _body(
        [helper.make_tensor_value_info("acc", F, [4]), helper.make_tensor_value_info("xt", F, [4])],
        [helper.make_tensor_value_info("acc2", F, [4])],
        [helper.make_node("Add", ["acc", "xt"], ["acc2"])],
    )
    return [
        Case("If", 11, [np.array(True)], {"then_branch": then, "else_branch": other}, outer={"i1": X}, id="If-11-then"),
        Case(
            "If", 11, [np.array(False)], {"then_branch": then, "else_branch": other}, outer={"i1": X}, id="If-11-else"
        ),
        Case("Loop", 11, [ints(3), np.array(True), X], {"body": loop}),
        Case("Scan", 9, [(4,), (3, 4)], {"body": scan, "num_scan_inputs": 1}, outputs=[F, F]),
        Case(
            "Scan",
            8,
            [np.array([3], np.int32), (1, 4), (1, 3, 4)],
            {"body": lens_body, "num_scan_inputs": 1},
            refused="node 'n' (Scan)",
            id="Scan-8-lens",
        ),
        # the converter drops the batch axis of Scan-8 from the model's own inputs
        Case(
            "Scan",
            8,
            ["", (1, 4), (1, 3, 4)],
            {"body": lens_body, "num_scan_inputs": 1},
            refused="takes other inputs than the original: its input 'i1'",
            id="Scan-8-no-lens",
        ),
    ]


def _newer_ops() -> list[Case]:
    return [
        Case("DFT", 17, [r(1, 8, 1)], {"axis": 1}, id="DFT-17"),
        Case("DFT", 17, [r(1, 8, 2)], {"axis": 1, "inverse": 1}, id="DFT-17-inverse"),
        Case(
            "BitShift",
            11,
            [np.array([1, 2, 8], np.uint32), np.array([1, 1, 2], np.uint32)],
            {"direction": "LEFT"},
            outputs=[TensorProto.UINT32],
        ),
        Case("SplitToSequence", 11, [X], {"axis": 1}, outputs=[("seq", F)]),
    ]


# ops that change between opset 7 and the newest, not in the table, and why
NOT_IN_TABLE = {
    "Attention": "new at opset 23, after the converter's last adapter; later versions add types",
    "DeformConv": "new at opset 19; version 22 adds bf16 only",
    "Bernoulli": "random draws: no two runs agree (the check does not compare what depends on them)",
    "Multinomial": "random draws (as Bernoulli)",
    "RandomNormal": "random draws (as Bernoulli)",
    "RandomNormalLike": "random draws (as Bernoulli)",
    "RandomUniform": "random draws (as Bernoulli)",
    "RandomUniformLike": "random draws (as Bernoulli)",
    "Optional": "optional types: the comparison generates and compares tensors only",
    "OptionalGetElement": "optional types (as Optional)",
    "OptionalHasElement": "optional types (as Optional)",
}


CASES = _cases()


def _feeds(m: onnx.ModelProto, seed: int) -> dict:
    """The test's own inputs (another seed than the check's): floats standard normal, bools random."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in m.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[vi.name] = (rng.random(shape) < 0.5) if t.elem_type == B else rng.standard_normal(shape).astype(dtype)
    return feeds


def _run(m: onnx.ModelProto, feeds: dict) -> list:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _valid(m: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(m)
    except onnx.checker.ValidationError:
        return False
    return True


def _infers(m: onnx.ModelProto) -> bool:
    """Whether ONNX's shape inference, strict and type-checking, passes over the model."""
    try:
        onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def _outcome(case: Case, target: int):
    """(the upgraded model, its warnings) or the refusal's AutocastError."""
    m = case.model()
    try:
        change = upgrade_opset(m, target, "case.onnx")
    except AutocastError as exc:
        return exc
    return m, change.warnings


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_upgrade_keeps_what_each_op_computes_or_refuses_naming_it(case):
    for target in case.upgrade_to():
        outcome = _outcome(case, target)
        if case.refused is not None:
            assert isinstance(outcome, AutocastError), f"--opset {target} should be refused"
            line = outcome.line()
            assert case.refused in line and f"--opset {target}" in line and "drop --opset" in line, line
            continue
        assert not isinstance(outcome, AutocastError), f"--opset {target}: {outcome.line()}"
        upgraded, warnings = outcome
        assert not warnings, [w.message for w in warnings]
        if _valid(case.model()):  # ONNX's checker and inference hold the upgraded model as they hold the original
            onnx.checker.check_model(upgraded)
        if _infers(case.model()):
            assert _infers(upgraded), target
        feeds = _feeds(case.model(), seed=7)
        for want, got in zip(_run(case.model(), feeds), _run(upgraded, feeds), strict=True):
            assert opset_check.differs(want, got) is None, (target, opset_check.differs(want, got))


def test_every_op_that_changes_has_a_case_or_a_reason():
    """The table covers every default-domain op whose schema changes between opset 7 and the newest
    the installed onnx knows (a version after its first, from 8 on), or says why it does not."""
    versions: dict[str, set] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "":
            versions.setdefault(schema.name, set()).add(schema.since_version)
    changing = {op for op, vs in versions.items() if any(v > 7 and v != min(vs) for v in vs)}
    covered = {c.op for c in CASES} | set(NOT_IN_TABLE)
    assert not changing - covered, f"ops without a case: {sorted(changing - covered)}"
    assert not set(NOT_IN_TABLE) & {c.op for c in CASES}


# ---- the check itself ---------------------------------------------------------------------------------
def test_the_tolerance_passes_fp32_noise_and_catches_a_changed_meaning():
    """Two fp32 computations of one function (another summation order) agree; a node that computes
    something else (a value moved by its own size), NaNs elsewhere or another shape do not."""
    rng = np.random.default_rng(0)
    want = rng.standard_normal((64, 64)).astype(np.float32)
    terms = rng.standard_normal((64, 64, 512)).astype(np.float32)
    summed, reordered = terms.sum(axis=-1), terms[..., ::-1].cumsum(axis=-1)[..., -1]
    assert opset_check.differs(summed, reordered) is None
    assert opset_check.differs(want, want * (1 + 1e-5)) is None
    moved = want.copy()
    moved[3, 5] += 0.5
    assert "in 1 of 4096 elements" in opset_check.differs(want, moved)
    holes = want.copy()
    holes[0, 0] = np.nan
    assert "NaNs" in opset_check.differs(want, holes)
    assert opset_check.differs(holes, holes) is None
    assert "shape" in opset_check.differs(want, want[:2])
    assert "differs in 1 of 3" in opset_check.differs(ints(1, 2, 3), ints(1, 2, 4))


def test_what_depends_on_random_draws_is_not_compared():
    """A Dropout in training mode draws differently in each session: its output is left out of the
    comparison, and the node after a changed Hardmax is still caught."""
    nodes = [
        helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], name="drop"),
        helper.make_node("Hardmax", ["x"], ["h"], name="hm", axis=0),
    ]
    outputs = [helper.make_tensor_value_info("d", F, [2, 3]), helper.make_tensor_value_info("h", F, [2, 3])]
    inputs = [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("train", B, [])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [onnx.numpy_helper.from_array(sc(0.5), "ratio")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    assert opset_check.drawn(m.graph) == {"d"}
    with pytest.raises(AutocastError, match="at node 'hm' \\(Hardmax-11 -> Hardmax-13\\): its output 'h'"):
        upgrade_opset(m, 13, "m.onnx")
    del m.graph.node[1], m.graph.output[1]
    (warning,) = upgrade_opset(m, 13, "m.onnx").warnings
    assert "not compared" in warning.message and "random draws" in warning.message


def test_an_input_denotation_the_converter_drops_is_not_a_changed_input():
    """The converter drops type denotations; the inputs are still the original's."""
    x = helper.make_tensor_value_info("x", F, [1, 3, 4, 4])
    x.type.denotation = "TENSOR"
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1, name="sm")], "g", [x], [_output("y", F)]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    assert upgrade_opset(m, 13, "m.onnx").warnings == ()


def test_the_check_catches_what_the_converter_gets_wrong_on_its_own_output():
    """The comparison on ONNX's converter output, without the upgrade around it: Resize-10 linear and
    Hardmax-11 (test_opset_upgrade.py holds every command to it)."""
    by_id = {c.id: c for c in CASES}
    for case_id in ("Resize-10-linear", "Hardmax-11-axis1"):
        original = by_id[case_id].model()
        upgraded = onnx.version_converter.convert_version(original, 13)
        with pytest.raises(opset_check.Disagreement, match="at node 'n'"):
            opset_check.compare(original, upgraded, changed_nodes(original, 13))
