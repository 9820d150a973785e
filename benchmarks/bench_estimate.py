"""Estimated GPU speed of every conversion of the shipped models, and the cost model held against
the GPU figures recorded so far (issue 38).

Part 1 prices, with the roofline model (autocast_onnx/roofline), each shipped model as read (fp32)
and its conversions: this tool's default (the fast plan), `--precise`, `--runtime any`, and
onnxruntime.transformers.float16 (keep_io_types) when it imports; at the sizes validation
generates for open input dimensions, on the GPU named. It prints one row per model with the
estimated milliseconds and the speed-up over fp32 of each conversion, so the ranking of the plans
is visible without a GPU.

Part 2 holds the model against what was measured: the fp32 p50 latencies of the shipped models
on an NVIDIA H200 (onnxruntime-gpu 1.31.1, docs/benchmarks.md, "Where the nodes ran on a GPU",
issue 30: the rows at the shipped opset, fp16, planned for cuda), transcribed below with the
table they come from. Those small models are launch-bound, so they fix the launch constant: the
least-squares fit of per-kernel time (relative error) is printed beside the table's assumption,
with each model's estimate at both. The converted rows of that table were measured on plans
since replaced, so they are not compared.

Part 3 (with --real CACHE) prices the real-size models benchmarks/bench_gpu_plan.py built (its
cache holds them at batch 8) the same way, on the H100 and the H200.

    python benchmarks/bench_estimate.py [--gpu H100] [--real benchmarks/.gpu_plan_cache]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

import autocast_onnx
from autocast_onnx.graph import build_index
from autocast_onnx.graph.shapes import tensor_shapes
from autocast_onnx.plan import fusions
from autocast_onnx.roofline import estimate, gpu, table

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted(
    p
    for folder in ("examples/models", "tests/data/decoders", "tests/data/evidence")
    for p in (ROOT / folder).glob("*.onnx")
)

# fp32 p50 ms on the H200, from docs/benchmarks.md (issue 30's table: "fp16 | cuda" rows at the
# shipped opset; the fp32 column is the reference model's latency in that run)
MEASURED_H200_FP32_MS = {
    "bert_tiny": 0.867,
    "digits_cnn": 0.136,
    "gpt2_tiny": 0.784,
    "resnet_tiny": 0.211,
    "vit_tiny": 0.923,
    "gemma": 0.933,
    "llama": 0.868,
}


def priced(model: onnx.ModelProto, name: str):
    """The estimate of a model file's main graph, with the fusions ONNX Runtime would apply to it."""
    shapes = tensor_shapes(model)
    groups = [
        tuple(n.outputs[0].name for n in f.nodes)
        for f in fusions.find(build_index(model))
        if not f.split and all(n.scope.parent is None for n in f.nodes)
    ]
    return estimate(model.graph.node, [o.name for o in model.graph.output], gpu(name), shapes, groups)


def conversions(path: Path) -> dict:
    out = {
        "autocast": autocast_onnx.convert(str(path)).model,
        "autocast precise": autocast_onnx.convert(str(path), precise=True).model,
        "autocast any": autocast_onnx.convert(str(path), runtime="any").model,
    }
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        out["ort float16"] = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    except Exception as exc:  # the peer is optional here, and may refuse a model: its row says so
        out["ort float16"] = exc
    return out


COLUMNS = ["autocast", "autocast precise", "autocast any", "ort float16"]


def table_of(paths: list, name: str, digits: int) -> None:
    """One row per model: its kernels, the fp32 estimate and each conversion's, with its speed-up."""
    print(f"| model | kernels | fp32 ms | {' | '.join(COLUMNS)} |")
    print("|---|---:|---:|" + "---:|" * len(COLUMNS))
    for path in paths:
        base = priced(onnx.load(str(path)), name)
        cells = []
        for model in conversions(path).values():
            if isinstance(model, Exception):
                cells.append(f"failed: {type(model).__name__}")
                continue
            e = priced(model, name)
            cells.append(f"{e.seconds * 1e3:.{digits}f} ({base.seconds / e.seconds:.2f}x)")
        print(f"| {path.stem} | {len(base.kernels)} | {base.seconds * 1e3:.{digits}f} | {' | '.join(cells)} |")


def part_one(name: str) -> None:
    print(f"Part 1: estimated latency on {gpu(name).name} (ms, and speed-up over fp32)")
    table_of(MODELS, name, 3)


def part_two() -> None:
    launch = table().launch_s
    rows = []
    for stem, measured in MEASURED_H200_FP32_MS.items():
        [path] = [p for p in MODELS if p.stem == stem]
        e = priced(onnx.load(str(path)), "H200")
        busy = [k.seconds if k.bound != "launch" else 0.0 for k in e.kernels]  # each kernel's own time
        rows.append((stem, measured * 1e-3, busy))

    def at(busy: list, per: float) -> float:  # a kernel takes its time or the dispatch's, the longer
        return sum(max(b, per) for b in busy)

    def loss(per: float) -> float:  # squared relative error over the models
        return sum(((at(b, per) - m) / m) ** 2 for _, m, b in rows)

    fitted = min((k * 1e-7 for k in range(1, 400)), key=loss)  # 0.1 us steps up to 40 us
    print(
        f"\nPart 2: fp32 latency on the H200, measured (issue 30) and estimated; launch {launch * 1e6:.1f} us "
        f"in the table, {fitted * 1e6:.1f} us fitted here"
    )
    print("| model | kernels | measured ms | estimated ms (table's launch) | ratio | estimated ms (fitted) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for stem, m, b in rows:
        a, f = at(b, launch), at(b, fitted)
        print(f"| {stem} | {len(b)} | {m * 1e3:.3f} | {a * 1e3:.3f} | {a / m:.2f} | {f * 1e3:.3f} | {f / m:.2f} |")


def part_three(cache: Path, names: list[str]) -> None:
    """The real-size models benchmarks/bench_gpu_plan.py builds (read from its cache, batch 8), priced on
    the H100 and the H200: fp32 and every conversion, as in part 1."""
    found = sorted(cache.glob("*_b8.onnx"))
    if not found:
        print(f"\nPart 3: no real-size models in {cache} (run benchmarks/bench_gpu_plan.py first)")
        return
    for name in names:
        print(f"\nPart 3: real-size models (bench_gpu_plan.py's, batch 8) on {gpu(name).name} (ms, speed-up over fp32)")
        table_of(found, name, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default=None, help="the GPU of part 1 (default: the table's)")
    ap.add_argument("--real", type=Path, help="also price bench_gpu_plan.py's real-size models from this cache folder")
    args = ap.parse_args()
    part_one(args.gpu)
    part_two()
    if args.real is not None:
        part_three(args.real, ["H100", "H200"])


if __name__ == "__main__":
    main()
