"""What planning for the runtime buys on ONNX Runtime's CUDA provider: each model converted three ways and
validated on CUDA (accuracy against fp32, latency p50 of both, and the speed-up):

  any          the default plan (every node the schemas allow; BatchNormalization's parameters pinned fp32)
  cuda         --runtime cuda (nodes the CUDA kernels cannot take keep fp32: with pinned parameters, the
               BatchNormalization nodes, whose CUDA kernel takes one type for data and parameters)
  bn-follows   the default plan with a rule file that unpins BatchNormalization's parameters (they follow
               the data into fp16), so the node runs in fp16 on CUDA

    python benchmarks/bench_runtime_fit.py [--batch 32] [--precision fp16] [MODEL ...]

Needs onnxruntime-gpu and a GPU (exit 2 without the CUDA provider).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autocast_onnx  # noqa: E402
from autocast_onnx.plan.vocab import Precision  # noqa: E402
from autocast_onnx.validate.inputs import describe_inputs  # noqa: E402

MODELS = [
    "examples/models/resnet_tiny.onnx",
    "examples/models/digits_cnn.onnx",
    "tests/data/evidence/text_detector.onnx",
]
UNPIN = '[pins]\nBatchNormalization = { inputs = [], why = "parameters follow the data" }\n'


def variants(rules: str) -> dict[str, dict]:
    return {"any": {}, "cuda": {"runtime": "cuda"}, "bn-follows": {"rules": [rules]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp16")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("bench_runtime_fit: no CUDA execution provider here")
        return 2
    print(f"onnxruntime {ort.__version__}, {args.precision}, batch {args.batch}")
    print(
        f"{'model':40s} {'variant':11s} {'fp16 nodes':>10s} {'casts':>5s} {'fp32 ms':>8s} {'conv ms':>8s} "
        f"{'speed-up':>8s} {'rel err':>9s} verdict"
    )
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "bn_follows.toml"
        rules.write_text(UNPIN)
        for path in args.models:
            source = onnx.load(str(ROOT / path))
            symbolic = {d for s in describe_inputs(source) for d in s.dims if isinstance(d, str)}
            dims = {d: args.batch for d in symbolic if "batch" in d.lower() or d in ("N", "n")}
            for name, options in variants(str(rules)).items():
                result = autocast_onnx.convert(source, precision=args.precision, device="cpu", **options)
                report = autocast_onnx.validate(
                    source, result.model, device="cuda", speed=True, dims=dims, generate=0, iterations=50
                ).to_dict()
                speed = report["speed"] or {}
                low = sum(1 for p in result.plan.precisions if p != Precision.FP32)
                casts = result.casts_added
                worst = max((o["relative_error"] or 0.0) for o in report["outputs"])
                print(
                    f"{path:40s} {name:11s} {low:10d} {casts:5d} {speed['reference']['p50_ms']:8.3f} "
                    f"{speed['converted']['p50_ms']:8.3f} {speed['speedup_p50']:8.2f} {worst:9.2e} "
                    f"{'PASS' if report['passed'] else 'FAIL'}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
