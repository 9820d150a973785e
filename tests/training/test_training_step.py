"""TrainingStep's control flow with a stand-in for onnxruntime-training's Module and Optimizer
(the real ones are exercised in test_training_runtime.py): the scale fed, the optimizer step
taken only on finite gradients, the buffers reset after every step, the scaler updated, and
models without the loss-scaling I/O refused before any step."""

from __future__ import annotations

import numpy as np
import pytest

from autocast_onnx.errors import AutocastError
from autocast_onnx.training import DynamicLossScaler, TrainingStep


class FakeModule:
    def __init__(
        self, finite_flags, inputs=("input", "labels", "loss_scale"), outputs=("loss", "logits", "all_finite")
    ):
        self.flags = list(finite_flags)
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.fed, self.resets = [], 0

    def input_names(self):
        return self.inputs

    def output_names(self):
        return self.outputs

    def __call__(self, *feeds):
        self.fed.append(feeds)
        return [np.float32(0.5), np.zeros((2, 3), np.float32), np.array(self.flags.pop(0))]

    def lazy_reset_grad(self):
        self.resets += 1


class FakeOptimizer:
    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1


def test_finite_steps_update_and_non_finite_steps_are_skipped():
    module, optimizer = FakeModule([True, False, True]), FakeOptimizer()
    scaler = DynamicLossScaler(init_scale=8.0, growth_interval=1)
    step = TrainingStep(module, optimizer, scaler)
    results = [step(np.zeros(2), np.zeros(2)) for _ in range(3)]
    assert [r.skipped for r in results] == [False, True, False]
    assert [r.scale for r in results] == [8.0, 16.0, 8.0]  # grown after a good step, halved after overflow
    assert [float(f[-1]) for f in module.fed] == [8.0, 16.0, 8.0]  # the scale is the last input, as fp32
    assert all(f[-1].dtype == np.float32 for f in module.fed)
    assert optimizer.steps == 2 and module.resets == 3
    assert results[0].loss == 0.5 and len(results[0].outputs) == 3
    assert scaler.skipped_steps == 1 and scaler.scale == 16.0


def test_a_static_scale_model_takes_no_scaler_and_still_skips():
    module = FakeModule([False], inputs=("input", "labels"))
    optimizer = FakeOptimizer()
    result = TrainingStep(module, optimizer)(np.zeros(2), np.zeros(2))
    assert result.skipped and result.scale is None and optimizer.steps == 0 and module.resets == 1
    assert len(module.fed[0]) == 2


@pytest.mark.parametrize(
    "inputs, outputs, scaler, message",
    [
        (("input", "labels"), ("loss", "all_finite"), DynamicLossScaler(), "no 'loss_scale' input"),
        (("input", "labels", "loss_scale"), ("loss", "all_finite"), None, "pass a DynamicLossScaler"),
        (("input", "labels", "loss_scale"), ("loss", "logits"), DynamicLossScaler(), "no 'all_finite' output"),
    ],
)
def test_models_without_the_loss_scaling_io_are_refused_up_front(inputs, outputs, scaler, message):
    with pytest.raises(AutocastError, match=message):
        TrainingStep(FakeModule([True], inputs, outputs), FakeOptimizer(), scaler)
