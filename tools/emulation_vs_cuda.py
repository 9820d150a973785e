"""How closely the CPU emulation of low precision (validate/emulate.py) follows ONNX Runtime's CUDA provider.

    python tools/emulation_vs_cuda.py [MODEL ...] [--precision fp16 bf16]

For each model and precision: the conversion (--runtime cuda), its emulation model run on the CPU provider,
the converted model itself run on the CUDA provider, and the fp32 model on CUDA, all on the same generated
inputs. Per output it prints the error of each against fp32 (largest absolute error over the largest
reference magnitude), the gap between emulation and CUDA on the same scale, and, for outputs whose last axis
holds class scores, the top-1 agreement of each with fp32 and of the two with each other, with the smallest
margin between the fp32 model's two best scores where they disagree. Needs onnxruntime-gpu and a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from gpu_placement import feeds_of  # noqa: E402

import autocast_onnx  # noqa: E402
from autocast_onnx.validate.emulate import emulation_model  # noqa: E402

MODELS = ["tests/data/decoders/llama.onnx", "tests/data/decoders/qwen2_kv.onnx", "examples/models/gpt2_tiny.onnx"]


def run(model: onnx.ModelProto, feeds: dict, provider: str) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=[provider, "CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))


def compare(name: str, ref: np.ndarray, emu: np.ndarray, cuda: np.ndarray) -> str:
    ref, emu, cuda = (np.asarray(x, np.float64) for x in (ref, emu, cuda))
    scale = float(np.max(np.abs(ref))) or 1.0
    err = lambda x, y: float(np.max(np.abs(x - y))) / scale  # noqa: E731
    text = f"  {name:24s} emu {err(emu, ref):.2e}  cuda {err(cuda, ref):.2e}  emu-vs-cuda {err(emu, cuda):.2e}"
    if ref.ndim >= 2 and ref.shape[-1] >= 8:
        text += f"  top1 emu {top1(emu, ref):.3f} cuda {top1(cuda, ref):.3f} emu-vs-cuda {top1(emu, cuda):.3f}"
        best = np.sort(ref, -1)
        margin = (best[..., -1] - best[..., -2]) / scale
        flips = np.argmax(cuda, -1) != np.argmax(ref, -1)
        if flips.any():
            text += f"  (fp32 margin where CUDA flips: {float(margin[flips].min()):.1e} of the scale)"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--precision", nargs="+", default=["fp16", "bf16"])
    args = parser.parse_args(argv)
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("emulation_vs_cuda: no CUDA execution provider here")
        return 2
    for path in args.models:
        source = onnx.load(str(ROOT / path))
        feeds = feeds_of(path)
        ref = run(source, feeds, "CUDAExecutionProvider")
        names = [o.name for o in source.graph.output]
        for precision in args.precision:
            converted = autocast_onnx.convert(source, precision=precision, runtime="cuda", device="cpu").model
            emu = run(emulation_model(converted), feeds, "CPUExecutionProvider")
            cuda = run(converted, feeds, "CUDAExecutionProvider")
            print(f"{path} {precision}")
            for name, r, e, c in zip(names, ref, emu, cuda):
                print(compare(name, r, e, c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
