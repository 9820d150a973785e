"""Accuracy and speed of every example model after conversion, as `autocast-onnx validate`
measures them: prints a Markdown table (one row per model output).

    python benchmarks/validate_examples.py [--precision fp16] [--device auto] [--numerics auto]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import autocast_onnx
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.runner import ort

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--numerics", default="auto", choices=["auto", "emulate", "plain"])
    ap.add_argument("--iterations", type=int, default=50)
    args = ap.parse_args()
    rows = []
    for path in sorted((ROOT / "examples" / "models").glob("*.onnx")):
        inputs = None
        if path.stem == "digits_cnn":
            import tempfile

            import numpy as np

            tmp = Path(tempfile.mkdtemp()) / "digits.npz"
            np.savez(tmp, pixels=np.load(ROOT / "examples" / "data" / "digits_test.npz")["x"])
            inputs = str(tmp)
        converted = autocast_onnx.convert(path, precision=args.precision)
        report = validate(
            path,
            converted.model,
            ValidateOptions(
                inputs=inputs,
                batches=2,
                device=args.device,
                numerics=args.numerics,
                iterations=args.iterations,
                warmup=5,
            ),
        )
        for o in report["outputs"]:
            rows.append((path.stem, o, report))
    first = rows[0][2]
    print(
        f"device {first['device']}, numerics {first['numerics']}, precision {args.precision}, "
        f"onnxruntime {ort().__version__}, {platform.processor() or platform.machine()}\n"
    )
    print(
        "| model | output | max abs err | rel err | cosine | top-1 | new NaN/inf | p50 ref ms | p50 conv ms | speed-up | size |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, o, r in rows:
        s = r["speed"]
        top1 = "-" if o["top1"] is None else f"{o['top1']:.3f}"
        # a bf16 model does not load on the CPU provider: no timing (the report says why)
        speed = (
            f"{s['reference']['p50_ms']:.3f} | {s['converted']['p50_ms']:.3f} | {s['speedup_p50']:.2f}x"
            if s is not None
            else "- | - | -"
        )
        print(
            f"| {name} | {o['name']} | {o['max_abs_error']:.3g} | {o['relative_error']:.3g} | {o['cosine']:.7f} | "
            f"{top1} | {o['new_nan'] + o['new_inf']} | {speed} | {r['size_ratio']:.2f}x |"
        )


if __name__ == "__main__":
    main()
