"""Stage: rewrite (loss scaling). Puts loss scaling into an onnxruntime-training graph, in two
steps around the precision plan:

  seed_loss_scale (before planning)  the fp32 seed of the backward pass, d(loss)/d(loss) = 1,
      becomes the scalar fp32 graph input `loss_scale` (dynamic) or the constant N (static), so
      every gradient is computed scaled and small gradients survive fp16. The loss output itself
      is not touched: it stays unscaled.
  unscale_gradients (after the plan is applied)  each gradient, already fp32 where it reaches
      its InPlaceAccumulator (the plan keeps accumulators fp32), is multiplied by 1/scale in fp32
      and checked: the bool output `all_finite` is true when every gradient of the step is
      finite. A training loop skips the optimizer step when it is false (see
      autocast_onnx.training.TrainingStep).

Both steps record what they did in the model's metadata (LOSS_SCALE_MARK), so a converted model
is recognised and never scaled twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import AutocastError, InternalCheckError
from ..graph.training import (
    ALL_FINITE_OUTPUT,
    LOSS_SCALE_INPUT,
    LOSS_SCALE_MARK,
    TrainingGraph,
)

MODES = ("dynamic", "none")


@dataclass(frozen=True)
class LossScale:
    mode: str  # "dynamic" | "static" | "none"
    value: float | None = None  # the constant of a static scale

    @property
    def mark(self) -> str:
        return f"static:{self.value:g}" if self.mode == "static" else self.mode

    def __str__(self) -> str:
        return f"{self.value:g}" if self.mode == "static" else self.mode


def parse_loss_scale(text) -> LossScale:
    """'dynamic', 'none' or a number N > 0 (a static scale; powers of two keep scaling exact)."""
    if isinstance(text, LossScale):
        return text
    word = str(text).strip().lower()
    if word in MODES:
        return LossScale(word)
    try:
        value = float(word)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > float(np.finfo(np.float32).max):
        raise AutocastError(
            f"--loss-scale must be dynamic, none or a finite number > 0, not {text!r}",
            "--loss-scale",
            "use dynamic (the default for training graphs), a power of two such as 1024, or none",
        )
    return LossScale("static", value)


@dataclass
class LossScaling:
    """What the rewrite added: stated in the summary, the plan and the manifest."""

    mode: str
    input: str | None  # the scale input (dynamic)
    output: str | None  # the all_finite output
    gradients: int  # gradients unscaled and checked

    def to_dict(self) -> dict:
        return {"mode": self.mode, "input": self.input, "output": self.output, "gradients": self.gradients}


def refuse_loss_scale(training: TrainingGraph | None, scale: LossScale, where: str) -> None:
    """An explicit --loss-scale must have something to act on."""
    if scale.mode == "none":
        return
    if training is None or not training.has_backward:
        what = "an inference graph" if training is None else training.describe()
        raise AutocastError(
            f"--loss-scale {scale} has nothing to scale: the model is {what}, with no backward pass",
            where,
            "drop --loss-scale; it applies to onnxruntime-training models (training_model.onnx)",
        )
    if training.loss_scale is not None:
        raise AutocastError(
            f"the model already has loss scaling ({training.loss_scale}): it was converted by autocast-onnx",
            where,
            "convert the original fp32 training model instead, or drop --loss-scale",
        )
    if training.kind != "ort-training" or training.seed is None:
        raise AutocastError(
            f"--loss-scale {scale}: no backward seed (an fp32 '<loss>_grad' initializer = 1) found in this "
            f"{training.describe()}",
            where,
            "loss scaling is inserted into onnxruntime-training models; pass --loss-scale none",
        )


def seed_loss_scale(model: onnx.ModelProto, training: TrainingGraph, scale: LossScale) -> None:
    """Step 1 (on the fp32 graph, before planning): the backward seed becomes the scale."""
    graph = model.graph
    seed = next(t for t in graph.initializer if t.name == training.seed)
    if scale.mode == "static":
        seed.CopyFrom(numpy_helper.from_array(np.array(scale.value, dtype=np.float32), seed.name))
    else:
        taken = {v.name for v in graph.input} | {v.name for v in graph.output} | {t.name for t in graph.initializer}
        taken |= {o for n in graph.node for o in n.output}
        if LOSS_SCALE_INPUT in taken:
            raise AutocastError(
                f"the model already has a tensor named {LOSS_SCALE_INPUT!r}",
                training.seed,
                "rename it, or pass --loss-scale N (a static scale needs no new input)",
            )
        graph.initializer.remove(seed)
        for node in graph.node:
            for k, name in enumerate(node.input):
                if name == training.seed:
                    node.input[k] = LOSS_SCALE_INPUT
        # after the user's inputs (data, labels), before parameters, buffers and lazy_reset_grad
        trained = set(training.parameters) | {a.buffer for a in training.accumulations} | {"lazy_reset_grad"}
        position = next((k for k, v in enumerate(graph.input) if v.name in trained), len(graph.input))
        graph.input.insert(position, helper.make_tensor_value_info(LOSS_SCALE_INPUT, TensorProto.FLOAT, []))
    _set_mark(model, scale.mark)


def unscale_gradients(model: onnx.ModelProto, training: TrainingGraph, scale: LossScale) -> LossScaling:
    """Step 2 (after the plan is applied): unscale each gradient in fp32 before its accumulator,
    and add the `all_finite` output."""
    graph = model.graph
    types = _float_types(graph)
    fresh = _Fresh(graph)
    new_nodes: dict[int, list] = {}
    head: list = []
    if scale.mode == "dynamic":
        inverse = fresh("loss_scale.inverse")
        head.append(helper.make_node("Reciprocal", [LOSS_SCALE_INPUT], [inverse], name=inverse))
    else:
        inverse = fresh("loss_scale.inverse")
        value = float(scale.value or 1.0)
        graph.initializer.append(numpy_helper.from_array(np.array(1.0 / value, dtype=np.float32), inverse))
    flags = []
    accumulators = _accumulator_positions(graph, training)
    for position, acc in accumulators:
        node = graph.node[position]
        gradient = node.input[1]
        if types.get(gradient, TensorProto.FLOAT) != TensorProto.FLOAT:
            raise InternalCheckError(f"gradient {gradient!r} reaches its accumulator as type {types[gradient]}")
        base = acc.parameter if acc.parameter is not None else acc.gradient
        unscaled = fresh(f"{base}_grad.unscaled")
        inf, nan, bad, badf, flag = (
            fresh(f"{base}_grad.{what}") for what in ("isinf", "isnan", "nonfinite", "nonfinite_f", "any")
        )
        new_nodes[position] = [
            helper.make_node("Mul", [gradient, inverse], [unscaled], name=unscaled),
            helper.make_node("IsInf", [unscaled], [inf], name=inf),
            helper.make_node("IsNaN", [unscaled], [nan], name=nan),
            helper.make_node("Or", [inf, nan], [bad], name=bad),
            helper.make_node("Cast", [bad], [badf], name=badf, to=TensorProto.FLOAT),
            helper.make_node("ReduceMax", [badf], [flag], name=flag, keepdims=0),
        ]
        node.input[1] = unscaled
        flags.append(flag)
    any_bad, any_bool = fresh("gradients.any_nonfinite"), fresh("gradients.any_nonfinite_b")
    tail = [
        helper.make_node("Max", flags, [any_bad], name=any_bad),
        helper.make_node("Cast", [any_bad], [any_bool], name=any_bool, to=TensorProto.BOOL),
        helper.make_node("Not", [any_bool], [ALL_FINITE_OUTPUT], name=ALL_FINITE_OUTPUT),
    ]
    ordered = list(head)
    for k, node in enumerate(graph.node):
        ordered.extend(new_nodes.get(k, ()))
        ordered.append(node)
    ordered.extend(tail)
    del graph.node[:]
    graph.node.extend(ordered)
    # after the user outputs (the loss), before the accumulators' outputs
    position = next(
        (k for k, v in enumerate(graph.output) if v.name.endswith("_grad.accumulation.out")), len(graph.output)
    )
    graph.output.insert(position, helper.make_tensor_value_info(ALL_FINITE_OUTPUT, TensorProto.BOOL, []))
    return LossScaling(
        mode=str(scale),
        input=LOSS_SCALE_INPUT if scale.mode == "dynamic" else None,
        output=ALL_FINITE_OUTPUT,
        gradients=len(accumulators),
    )


def _accumulator_positions(graph, training: TrainingGraph):
    """The accumulators, found again by their buffer input (the plan's rewrite moved nodes)."""
    by_buffer = {a.buffer: a for a in training.accumulations}
    found = []
    for k, node in enumerate(graph.node):
        if node.input and node.input[0] in by_buffer and node.op_type.startswith("InPlaceAccumulator"):
            found.append((k, by_buffer[node.input[0]]))
    if len(found) != len(by_buffer):
        raise InternalCheckError(f"found {len(found)} of {len(by_buffer)} gradient accumulators after the rewrite")
    return found


def _float_types(graph) -> dict:
    types = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        types[vi.name] = vi.type.tensor_type.elem_type
    for node in graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to is not None:
                types[node.output[0]] = to
    return types


class _Fresh:
    """Names used nowhere in the graph (tensors and nodes), for the nodes this rewrite adds."""

    def __init__(self, graph) -> None:
        self.taken = (
            {v.name for v in graph.input} | {v.name for v in graph.output} | {t.name for t in graph.initializer}
        )
        self.taken |= {o for n in graph.node for o in n.output} | {n.name for n in graph.node}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name


def _set_mark(model: onnx.ModelProto, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == LOSS_SCALE_MARK:
            prop.value = value
            return
    model.metadata_props.add(key=LOSS_SCALE_MARK, value=value)


__all__ = [
    "LossScale",
    "LossScaling",
    "parse_loss_scale",
    "refuse_loss_scale",
    "seed_loss_scale",
    "unscale_gradients",
]
