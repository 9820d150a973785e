"""The --target search on a deep conv net whose error is rounding, not range: time, evaluations and
the share of nodes kept fp32, for the current search against the plain bisection it replaced
(PYTHONPATH pointing at an older checkout runs that one; this script only measures).

The model is a synthetic detector: a stem, residual blocks of Conv -> BatchNormalization ->
HardSwish -> Conv -> BatchNormalization -> Add, and a head ConvTranspose -> Sigmoid whose logits
sit near the threshold, so rounding that grows through the blocks shows at the output (no tensor
leaves the fp16 range).

    python benchmarks/bench_target.py [--blocks 100] [--target rtol=0.0003] [--bisection]
    python benchmarks/bench_target.py --model tests/data/evidence/text_detector.onnx --target rtol=0.005
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx.validate.search import parse_target, search


def detector(blocks: int, channels: int = 16, size: int = 32, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def weight(name, shape, scale):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def bn(x, name):
        c = channels
        s = weight(f"{name}.s", [c], 0.1)
        inits[-1] = numpy_helper.from_array((1 + rng.standard_normal(c) * 0.1).astype(np.float32), s)
        b = weight(f"{name}.b", [c], 0.05)
        m = weight(f"{name}.m", [c], 0.05)
        v = f"{name}.v"
        inits.append(numpy_helper.from_array((1 + rng.random(c) * 0.2).astype(np.float32), v))
        nodes.append(helper.make_node("BatchNormalization", [x, s, b, m, v], [f"{name}.y"], name=name))
        return f"{name}.y"

    fan = 3 * 3 * channels
    x = "image"
    nodes.append(
        helper.make_node(
            "Conv",
            [x, weight("stem.w", [channels, 3, 3, 3], (2 / 27) ** 0.5)],
            ["stem"],
            name="stem",
            pads=[1, 1, 1, 1],
        )
    )
    x = "stem"
    for k in range(blocks):
        p = f"b{k}"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, weight(f"{p}.w1", [channels, channels, 3, 3], (2 / fan) ** 0.5)],
                [f"{p}.c1"],
                name=f"{p}.conv1",
                pads=[1, 1, 1, 1],
            )
        )
        h = bn(f"{p}.c1", f"{p}.bn1")
        nodes.append(helper.make_node("HardSwish", [h], [f"{p}.a"], name=f"{p}.act"))
        nodes.append(
            helper.make_node(
                "Conv",
                [f"{p}.a", weight(f"{p}.w2", [channels, channels, 3, 3], 0.03 * (2 / fan) ** 0.5)],
                [f"{p}.c2"],
                name=f"{p}.conv2",
                pads=[1, 1, 1, 1],
            )
        )
        h = bn(f"{p}.c2", f"{p}.bn2")
        nodes.append(helper.make_node("Add", [x, h], [f"{p}.out"], name=f"{p}.add"))
        x = f"{p}.out"
    nodes.append(
        helper.make_node(
            "ConvTranspose", [x, weight("head.w", [channels, 1, 2, 2], 0.3)], ["logits"], name="head", strides=[2, 2]
        )
    )
    nodes.append(helper.make_node("Sigmoid", ["logits"], ["prob"], name="prob"))
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, 2 * size, 2 * size])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def bisection(model, batches, target: str) -> tuple[dict, dict]:
    """The search this project used before attribution: while the targets fail, find the shortest
    prefix (in execution order) of the remaining candidates that passes and keep its last node."""
    from autocast_onnx.graph import build_index
    from autocast_onnx.plan import global_order
    from autocast_onnx.plan.model import Reason
    from autocast_onnx.validate.search import _Evaluator

    ev = _Evaluator(model, batches, {"precision": "fp16"}, parse_target([target]), "cpu")
    first = ev.convert({})
    low = {p.id for p in first.plan.nodes if p.precision in ("fp16", "bf16")}
    order = [n.id for n in global_order(build_index(model)) if n.id in low]

    def forced(ids):
        return {i: Reason("accuracy-search", "bisection") for i in ids}

    kept: list = []
    remaining = list(order)
    while not ev.passes(forced(kept))[0]:
        lo, hi = 1, len(remaining)
        while lo < hi:
            mid = (lo + hi) // 2
            if ev.passes(forced(kept + remaining[:mid]))[0]:
                hi = mid
            else:
                lo = mid + 1
        kept.append(remaining.pop(lo - 1))
    return forced(kept), {"evaluations": ev.evaluations, "kept": kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument(
        "--model",
        type=Path,
        help="Search this model instead (e.g. tests/data/evidence/text_detector.onnx); its inputs come from "
        "the .npz beside it, one batch per row.",
    )
    parser.add_argument("--target", default="rtol=0.0003")
    parser.add_argument("--bisection", action="store_true", help="Also run the plain bisection, for comparison.")
    args = parser.parse_args()
    if args.model is not None:
        model = onnx.load(str(args.model))
        data = np.load(args.model.with_suffix(".npz"))
        rows = len(data[data.files[0]])
        batches = [{k: data[k][i : i + 1] for k in data.files} for i in range(rows)]
        what = f"{args.model.name}, {len(batches)} batches"
    else:
        model = detector(args.blocks)
        rng = np.random.default_rng(1)
        batches = [{"image": rng.random((1, 3, 32, 32), dtype=np.float32)} for _ in range(2)]
        what = f"{args.blocks} blocks"
    nodes = len(model.graph.node)
    default = sum(1 for p in autocast_onnx.convert(model).plan.precisions if p == "fp32")
    print(f"model: {nodes} nodes ({what}); target {args.target}; fp32 with the default rules: {default}")
    print("| search | seconds | evaluations | kept fp32 by the search | fp32 nodes after | casts |")
    print("|---|---:|---:|---:|---:|---:|")
    runs = [("attribution + bands", lambda: search(model, batches, {"precision": "fp16"}, parse_target([args.target])))]
    if args.bisection:
        runs.append(("bisection", lambda: bisection(model, batches, args.target)))
    for label, run in runs:
        start = time.perf_counter()
        forced, log = run()
        seconds = time.perf_counter() - start
        result = autocast_onnx.convert(model, force_fp32=forced)
        fp32 = sum(1 for p in result.plan.precisions if p == "fp32")
        print(
            f"| {label} | {seconds:.1f} | {log['evaluations']} | {len(log['kept'])} | "
            f"{fp32} ({fp32 / nodes * 100:.1f}%) | {result.stats.casts_added} |"
        )


if __name__ == "__main__":
    main()
