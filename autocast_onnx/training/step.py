"""One mixed-precision training step with onnxruntime-training's `Module` and `Optimizer`, for a
training model converted by autocast-onnx (its `loss_scale` input and `all_finite` output):

    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    from autocast_onnx.training import DynamicLossScaler, TrainingStep

    state = CheckpointState.load_checkpoint("out/checkpoint")
    module = Module("out/training_model.onnx", state, "out/eval_model.onnx")
    step = TrainingStep(module, Optimizer("out/optimizer_model.onnx", module), DynamicLossScaler())
    module.train()
    for x, y in batches:
        result = step(x, y)          # loss, all_finite, scale used, whether the update was skipped

Each call feeds the scaler's scale as the last user input, reads `all_finite`, and then either
applies the optimizer (finite gradients) or skips it (inf/NaN: the update would corrupt the fp32
master weights); in both cases the gradient buffers are reset for the next step, and the scaler
updates its scale. A model converted with a static scale (--loss-scale N) has no scale input:
pass `scaler=None`; non-finite steps are still skipped.

Nothing here imports onnxruntime: the module and optimizer are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import AutocastError
from ..graph.training import ALL_FINITE_OUTPUT, LOSS_SCALE_INPUT
from .scaler import DynamicLossScaler


@dataclass(frozen=True)
class StepResult:
    loss: float
    all_finite: bool
    scale: float | None  # the loss scale this step ran with (None: a static scale in the graph)
    skipped: bool  # the optimizer step was skipped (non-finite gradients)
    outputs: tuple = field(repr=False)  # every user output of the training model, in order


class TrainingStep:
    """See the module docstring. `loss_index` is the position of the loss among the training
    model's user outputs (generate_artifacts writes it first); all_finite is found by name
    (`all_finite_index` overrides that, for a module without output_names())."""

    def __init__(self, module, optimizer, scaler: DynamicLossScaler | None = None, *, loss_index: int = 0,
                 all_finite_index: int | None = None) -> None:  # fmt: skip
        self.module = module
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_index = loss_index
        inputs = list(module.input_names()) if hasattr(module, "input_names") else None
        outputs = list(module.output_names()) if hasattr(module, "output_names") else None
        if inputs is not None and scaler is not None and LOSS_SCALE_INPUT not in inputs:
            raise AutocastError(
                f"the training model has no {LOSS_SCALE_INPUT!r} input (its inputs: {', '.join(inputs)})",
                "TrainingStep",
                "convert it with --loss-scale dynamic, or pass scaler=None for a static scale",
            )
        if inputs is not None and scaler is None and LOSS_SCALE_INPUT in inputs:
            raise AutocastError(
                f"the training model takes a {LOSS_SCALE_INPUT!r} input: pass a DynamicLossScaler",
                "TrainingStep",
                "TrainingStep(module, optimizer, DynamicLossScaler())",
            )
        if all_finite_index is None:
            if outputs is not None and ALL_FINITE_OUTPUT not in outputs:
                raise AutocastError(
                    f"the training model has no {ALL_FINITE_OUTPUT!r} output (its outputs: {', '.join(outputs)})",
                    "TrainingStep",
                    "use a training model converted by autocast-onnx with loss scaling (not --loss-scale none)",
                )
            all_finite_index = outputs.index(ALL_FINITE_OUTPUT) if outputs is not None else -1
        self.all_finite_index = all_finite_index

    def __call__(self, *inputs) -> StepResult:
        scale = None
        feeds = list(inputs)
        if self.scaler is not None:
            scale = self.scaler.scale
            feeds.append(np.array(scale, dtype=np.float32))
        outputs = self.module(*feeds)
        outputs = tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)
        if len(outputs) < 2:
            raise AutocastError(
                f"the training model returned {len(outputs)} output(s); expected the loss and all_finite",
                "TrainingStep",
                "use a training model converted by autocast-onnx with loss scaling (not --loss-scale none)",
            )
        flag = np.asarray(outputs[self.all_finite_index])
        if flag.dtype != np.bool_ or flag.size != 1:
            raise AutocastError(
                f"output {self.all_finite_index} is not the bool scalar all_finite (dtype {flag.dtype}, "
                f"shape {flag.shape})",
                "TrainingStep",
                "pass all_finite_index= the position of all_finite among the model's outputs",
            )
        finite = bool(flag.reshape(()))
        if finite:
            self.optimizer.step()
        self.module.lazy_reset_grad()
        if self.scaler is not None:
            self.scaler.update(finite)
        loss = float(np.asarray(outputs[self.loss_index]).reshape(-1)[0])
        return StepResult(loss=loss, all_finite=finite, scale=scale, skipped=not finite, outputs=outputs)
