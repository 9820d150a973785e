"""Export small real training graphs with onnxruntime-training, as test and benchmark inputs for
training-graph support (issue 9): a digits-sized MLP with LayerNorm and GELU, exported from torch
and turned into ONNX Runtime training artifacts (training_model.onnx, eval_model.onnx,
optimizer_model.onnx, checkpoint).

Needs its own environment, because onnxruntime-training provides the same `onnxruntime` module
as the plain wheel:

    python3 -m venv .venv-training
    .venv-training/bin/pip install torch==2.13.0          # the CPU build, first
    .venv-training/bin/pip install onnxruntime-training==1.19.2 onnx
    .venv-training/bin/python tools/export_training_artifacts.py OUT_DIR

Facts this script works around (onnxruntime-training 1.19.2, torch 2.13):
  - torch exports LayerNormalization with one output, but the LayerNormalizationGrad builder
    needs the Mean and InvStdDev outputs: generate_artifacts then fails with
    "i < node_->OutputDefs().size() was false". The two outputs are added before generating.
  - onnxruntime-training's pybind module has no get_all_operator_schema, so the signatures of
    the training ops (*Grad, InPlaceAccumulatorV2, optimizers) cannot be read from it the way
    tools/gen_ort_signatures.py reads the inference ops'.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: export_training_artifacts.py OUT_DIR")
    import onnx
    import torch
    from onnxruntime.training import artifacts

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 32)
            self.ln = torch.nn.LayerNorm(32)
            self.fc2 = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.ln(self.fc1(x))))

    torch.manual_seed(0)
    model = MLP()
    forward = out / "mlp_ln_gelu.onnx"
    torch.onnx.export(
        model,
        (torch.randn(4, 64),),
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
    for node in proto.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_invstd"])
    artifacts.generate_artifacts(
        proto,
        requires_grad=[n for n, _ in model.named_parameters()],
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out),
    )
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")


if __name__ == "__main__":
    main()
