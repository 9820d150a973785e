"""Stage: index (training graphs). Recognises a training graph and names its parts, so that the
plan can keep fp32 master weights and the rewrite can add loss scaling. Read-only.

Three kinds are recognised, from the strongest evidence down:

  ort-training   a training model of onnxruntime-training (generate_artifacts): gradient ops
                 (`*Grad`), and an `InPlaceAccumulator(V2)` per parameter that adds the
                 parameter's gradient into the graph input `<p>_grad.accumulation.buffer`; the
                 backward pass starts from an fp32 initializer `<loss>_grad` (= 1), the seed.
  onnx-training  a graph with ops of the `ai.onnx.preview.training` domain (Gradient, Adam, ...).
  loss           a forward graph whose output is written by a loss op (the eval model of an
                 artifacts folder, or a model exported with its loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from .domains import normalize_domain

ACCUMULATORS = frozenset({("com.microsoft", "InPlaceAccumulatorV2"), ("com.microsoft", "InPlaceAccumulator")})
LOSS_OPS = frozenset(
    {
        ("", "SoftmaxCrossEntropyLoss"),
        ("", "NegativeLogLikelihoodLoss"),
        ("com.microsoft", "SoftmaxCrossEntropyLossInternal"),
        ("com.microsoft", "SoftmaxCrossEntropy"),
        ("com.microsoft", "SparseSoftmaxCrossEntropy"),
    }
)
PREVIEW_TRAINING = "ai.onnx.preview.training"
BUFFER_SUFFIX = "_grad.accumulation.buffer"

# What the loss-scaling rewrite adds, and the metadata entry that says it was added.
LOSS_SCALE_INPUT = "loss_scale"
ALL_FINITE_OUTPUT = "all_finite"
LOSS_SCALE_MARK = "autocast_onnx.loss_scale"


@dataclass(frozen=True)
class Accumulation:
    """One InPlaceAccumulator: `gradient` is added into graph input `buffer` (of `parameter`)."""

    node: int  # position in the main graph's node list
    parameter: str | None
    gradient: str
    buffer: str


@dataclass(frozen=True)
class TrainingGraph:
    kind: str  # "ort-training" | "onnx-training" | "loss"
    losses: tuple[str, ...]  # graph outputs written by a loss op
    parameters: tuple[str, ...]  # graph inputs whose gradients are accumulated (the master weights)
    accumulations: tuple[Accumulation, ...]
    gradient_ops: int  # nodes that compute gradients (*Grad ops, Gradient)
    seed: str | None  # the initializer that seeds the backward pass with d(loss)/d(loss) = 1
    loss_scale: str | None  # the loss scaling already in the graph ("dynamic", "static:N"), if any

    @property
    def has_backward(self) -> bool:
        return self.kind != "loss"

    def describe(self) -> str:
        if self.kind == "ort-training":
            what = (
                f"onnxruntime-training graph: {len(self.parameters)} parameters, "
                f"{self.gradient_ops} gradient ops, loss {', '.join(self.losses) or '?'}"
            )
        elif self.kind == "onnx-training":
            what = f"training graph with ai.onnx.preview.training ops ({self.gradient_ops} gradient ops)"
        else:
            what = f"forward graph ending in a loss ({', '.join(self.losses)})"
        return what


def _is_gradient_op(node) -> bool:
    domain = normalize_domain(node.domain)
    if domain == PREVIEW_TRAINING:
        return node.op_type == "Gradient"
    return domain in ("", "com.microsoft") and (node.op_type.endswith("Grad") or "Grad_" in node.op_type)


def _is_one(tensor) -> bool:
    if tensor.data_type != onnx.TensorProto.FLOAT or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False  # external data is read from the model's folder only, which is not known here
    values = numpy_helper.to_array(tensor)
    return values.size == 1 and bool(np.all(values == 1.0))


_TRAINING_OP_NAMES = frozenset(op for _, op in LOSS_OPS | ACCUMULATORS)


def might_be_training(index, model: onnx.ModelProto) -> bool:
    """A cheap test (one pass over the index's main-graph op names) before `recognise` reads the
    protobuf nodes: inference graphs, the common case, pay almost nothing."""
    if any(o.domain == PREVIEW_TRAINING for o in model.opset_import):
        return True
    ops = {node.op for node in index.main.nodes}
    return bool(ops & _TRAINING_OP_NAMES) or any(op.endswith("Grad") or "Grad_" in op for op in ops)


def recognise(model: onnx.ModelProto) -> TrainingGraph | None:
    """What kind of training graph `model` is, or None for an inference graph."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}
    losses: list[str] = []
    accumulations: list[Accumulation] = []
    gradient_ops = 0
    preview = False
    for k, node in enumerate(graph.node):
        domain = normalize_domain(node.domain)
        key = (domain, node.op_type)
        if key in LOSS_OPS and node.output and node.output[0] in outputs:
            losses.append(node.output[0])
        if key in ACCUMULATORS and len(node.input) >= 2:
            buffer, gradient = node.input[0], node.input[1]
            parameter = buffer[: -len(BUFFER_SUFFIX)] if buffer.endswith(BUFFER_SUFFIX) else None
            if parameter is not None and parameter not in inputs:
                parameter = None
            accumulations.append(Accumulation(k, parameter, gradient, buffer))
        if _is_gradient_op(node):
            gradient_ops += 1
        if domain == PREVIEW_TRAINING:
            preview = True
    mark = next((p.value for p in model.metadata_props if p.key == LOSS_SCALE_MARK), None)
    if accumulations or (gradient_ops and not preview):
        kind = "ort-training"
    elif preview:
        kind = "onnx-training"
    elif losses:
        kind = "loss"
    else:
        return None
    seed = None
    initializers = {t.name: t for t in graph.initializer}
    for loss in losses:
        tensor = initializers.get(f"{loss}_grad")
        if tensor is not None and (_is_one(tensor) or mark is not None):
            seed = tensor.name
    return TrainingGraph(
        kind=kind,
        losses=tuple(losses),
        parameters=tuple(a.parameter for a in accumulations if a.parameter is not None),
        accumulations=tuple(accumulations),
        gradient_ops=gradient_ops,
        seed=seed,
        loss_scale=mark,
    )
