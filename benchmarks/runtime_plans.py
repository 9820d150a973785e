"""Per runtime, what a plan made for it runs at low precision on the example models: the markdown tables of
docs/fp16-or-bf16.md ("Which kernels the runtime has").

    python benchmarks/runtime_plans.py

For each runtime of --runtime (any, cuda, dml, tensorrt), each example model and precision (fp16, bf16; the
convolutional models also at --opset 22, where bf16 Conv exists): the nodes planned low, the nodes kept fp32
for want of the runtime's kernel, and the share of the MatMul/Gemm/Conv work (MACs) that runs low there.
Planning only, no runtime needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autocast_onnx  # noqa: E402
from autocast_onnx.catalog.kernels import runtime_label  # noqa: E402
from autocast_onnx.plan.vocab import Precision  # noqa: E402
from autocast_onnx.report.summary import summary_dict  # noqa: E402

MODELS = ["bert_tiny", "gpt2_tiny", "vit_tiny", "resnet_tiny", "digits_cnn"]
CONV = {"resnet_tiny", "digits_cnn", "vit_tiny"}
RUNTIMES = ["any", "cuda", "dml", "tensorrt"]


def row(source, name: str, precision: str, runtime: str, opset: int | None) -> str:
    extra = {"opset": opset} if opset else {}
    result = autocast_onnx.convert(source, precision=precision, runtime=runtime, device="cpu", **extra)
    low = sum(1 for p in result.plan.precisions if p != Precision.FP32)
    lacking = sum(
        1 for n in result.plan.nodes if n.precision == "fp32" and any(r.code == "no-kernel" for r in n.reasons)
    )
    cost = summary_dict(result)["cost"]
    share = f"{cost['macs_low_precision'] / cost['macs'] * 100:.1f}%" if cost.get("macs") else "-"
    model = name + (f" (opset {opset})" if opset else "")
    return f"| {model} | {precision} | {low} of {len(result.plan.precisions)} | {lacking} | {share} |"


def main() -> int:
    for runtime in RUNTIMES:
        label = "any runtime (the schemas alone)" if runtime == "any" else runtime_label(runtime)
        print(f"\n`--runtime {runtime}`: {label}\n")
        print("| model | precision | nodes low | kept fp32 for want of a kernel | MatMul/Gemm/Conv work low |")
        print("|---|---|---|---|---|")
        for name in MODELS:
            source = onnx.load(str(ROOT / "examples" / "models" / f"{name}.onnx"))
            for opset in (None, 22) if name in CONV else (None,):
                for precision in ("fp16", "bf16"):
                    print(row(source, name, precision, runtime, opset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
