"""Train and export a small GELU MLP on sklearn's digits (the split of examples/data), as
evidence for the GELU/Erf rule on a trained model (benchmarks/bench_rules.py):

    tests/data/evidence/digits_gelu_mlp.onnx
        Linear(64, 256) -> GELU (erf) -> Linear(256, 256) -> GELU (erf) -> Linear(256, 10)

GELU is exported as its Erf chain (Div -> Erf -> Add -> Mul -> Mul) right after an fp16 MatMul, as
in BERT-style encoders. Needs torch (the training environment has it):

    .venv-training/bin/python tools/export_gelu_mlp.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    import torch

    torch.manual_seed(0)
    train = np.load(ROOT / "examples" / "data" / "digits_train.npz")
    test = np.load(ROOT / "examples" / "data" / "digits_test.npz")
    x = torch.from_numpy(train["x"].reshape(len(train["x"]), 64))
    y = torch.from_numpy(train["y"])
    xt = torch.from_numpy(test["x"].reshape(len(test["x"]), 64))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 64):
            idx = perm[i : i + 64]
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(xt).argmax(1).numpy() == test["y"]).mean())
    out = ROOT / "tests" / "data" / "evidence" / "digits_gelu_mlp.onnx"
    torch.onnx.export(
        model,
        (xt[:2],),
        str(out),
        input_names=["pixels"],
        output_names=["logits"],
        dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    meta = {
        "model": "digits_gelu_mlp",
        "description": "MLP 64-256-256-10 with exact (erf) GELU, trained 40 epochs on sklearn digits",
        "test_accuracy": accuracy,
        "test_data": "examples/data/digits_test.npz (x reshaped to [n, 64])",
    }
    (out.with_suffix(".json")).write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out} (test accuracy {accuracy:.4f})")


if __name__ == "__main__":
    main()
