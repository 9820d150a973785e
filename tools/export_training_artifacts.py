"""Export small real training graphs with onnxruntime-training: the test and example inputs of
training-graph support. Three digits-sized models (sklearn's 8x8 digits: 64 features, 10
classes), each exported from torch and turned into ONNX Runtime training artifacts
(training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint), with the logits as a
second output of the training and eval models:

  mlp      Linear(64, 32) -> ReLU -> Linear(32, 10)                          (Gemm, ReluGrad)
  cnn      Conv(1->8, 3x3) -> ReLU -> MaxPool(2) -> Linear(128, 10)           (Conv, ConvGrad, MaxPoolGrad)
  ln_gelu  Linear(64, 32) -> LayerNorm -> GELU -> Linear(32, 10)              (LayerNormalizationGrad, GeluGrad)

Needs its own environment, because onnxruntime-training provides the same `onnxruntime` module
as the plain wheel:

    python3 -m venv .venv-training
    .venv-training/bin/pip install torch==2.13.0          # the CPU build, first
    .venv-training/bin/pip install -e ".[training-test]"    # onnxruntime-training, onnx < 1.18
    .venv-training/bin/python tools/export_training_artifacts.py OUT_DIR [MODEL ...]

Facts this script works around (onnxruntime-training 1.19.2, torch 2.13):
  - torch exports LayerNormalization with one output, but the LayerNormalizationGrad builder
    needs the Mean and InvStdDev outputs: generate_artifacts then fails with
    "i < node_->OutputDefs().size() was false". The two outputs are added before generating.
  - onnxruntime-training 1.19.2 reads ONNX IR version 10 at most: onnx >= 1.18 writes IR 11 or
    later into optimizer_model.onnx, which Optimizer() then refuses. The [training] extra pins
    onnx < 1.18.
  - onnxruntime-training's pybind module has no get_all_operator_schema, so the signatures of
    the training ops come from data/ort_training_signatures.json instead.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _models():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 32)
            self.fc2 = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    class CNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
            return self.fc(torch.flatten(x, 1))

    class LnGelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 32)
            self.ln = torch.nn.LayerNorm(32)
            self.fc2 = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.ln(self.fc1(x))))

    return {"mlp": (MLP, (4, 64)), "cnn": (CNN, (4, 1, 8, 8)), "ln_gelu": (LnGelu, (4, 64))}


def export(name: str, out: Path, seed: int = 0) -> Path:
    """Write the training artifacts of model `name` to out/name; returns that folder."""
    import onnx
    import torch
    from onnxruntime.training import artifacts

    cls, shape = _models()[name]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = cls()
    forward = folder / "forward.onnx"
    torch.onnx.export(
        model,
        (torch.randn(*shape),),
        str(forward),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
    )
    proto = onnx.load(str(forward))
    forward.unlink()
    for node in proto.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_invstd"])
    artifacts.generate_artifacts(
        proto,
        requires_grad=[n for n, _ in model.named_parameters()],
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(folder),
        additional_output_names=["logits"],  # the eval model gives accuracy, not only the loss
    )
    return folder


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: export_training_artifacts.py OUT_DIR [mlp|cnn|ln_gelu ...]")
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(_models())
    for name in names:
        if name not in _models():
            sys.exit(f"unknown model {name!r}: choose from {', '.join(_models())}")
        folder = export(name, out)
        print(f"wrote {', '.join(sorted(p.name for p in folder.iterdir()))} to {folder}")


if __name__ == "__main__":
    main()
