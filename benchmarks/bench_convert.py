"""Conversion speed on synthetic transformer-like graphs of growing size.

For each size it writes a model to a temporary folder, then times, side by side in one run:
  - baseline: onnx.load + onnx.save of the same model (what any tool that touches the file pays);
  - autocast-onnx: the whole `convert` command path (read, plan, rewrite, onnx.checker, write),
    with the default --check basic and with --check full (adds ONNX shape/type inference).
It prints a table of seconds and the ratio convert / baseline, best of --repeat runs.

    python benchmarks/bench_convert.py [--sizes 1000 10000 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autocast_onnx.pipeline import convert_file

BLOCK_NODES = 10


def synthetic_model(n_nodes: int, seed: int = 0, hidden: int = 16) -> onnx.ModelProto:
    """Residual blocks of 10 nodes: MatMul, Add(bias), Relu, MatMul, Add(residual),
    LayerNormalization, Transpose, Transpose, Softmax, Mul - each block with its own weights."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for b in range(max(1, n_nodes // BLOCK_NODES)):
        p = f"b{b}."
        w1, w2, bias = p + "w1", p + "w2", p + "bias"
        inits += [
            numpy_helper.from_array(rng.standard_normal((hidden, hidden), dtype=np.float32) * 0.2, w1),
            numpy_helper.from_array(rng.standard_normal((hidden, hidden), dtype=np.float32) * 0.2, w2),
            numpy_helper.from_array(rng.standard_normal((hidden,), dtype=np.float32) * 0.1, bias),
        ]
        nodes += [
            helper.make_node("MatMul", [x, w1], [p + "mm1"], name=p + "mm1"),
            helper.make_node("Add", [p + "mm1", bias], [p + "add_bias"], name=p + "add_bias"),
            helper.make_node("Relu", [p + "add_bias"], [p + "relu"], name=p + "relu"),
            helper.make_node("MatMul", [p + "relu", w2], [p + "mm2"], name=p + "mm2"),
            helper.make_node("Add", [p + "mm2", x], [p + "residual"], name=p + "residual"),
            helper.make_node(
                "LayerNormalization", [p + "residual", "ln_scale", "ln_bias"], [p + "ln"], name=p + "ln", axis=-1
            ),
            helper.make_node("Transpose", [p + "ln"], [p + "t1"], name=p + "t1", perm=[1, 0]),
            helper.make_node("Transpose", [p + "t1"], [p + "t2"], name=p + "t2", perm=[1, 0]),
            helper.make_node("Softmax", [p + "t2"], [p + "softmax"], name=p + "softmax", axis=-1),
            helper.make_node("Mul", [p + "softmax", p + "ln"], [p + "out"], name=p + "out"),
        ]
        x = p + "out"
    inits += [
        numpy_helper.from_array(np.ones(hidden, np.float32), "ln_scale"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "synthetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def best_of(repeat, fn):
    """Best wall time of `fn` over `repeat` runs. Its result is freed outside the timed region
    (freeing a 100k-node index costs ~0.3 s, which the CLI pays at exit, not before writing)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
        del result
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--hidden", type=int, default=16, help="width of the square weight matrices (16: 1 KiB per weight; 64: 16 KiB)"
    )
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for size in args.sizes:
            src = tmp / f"synthetic_{size}.onnx"
            onnx.save(synthetic_model(size, hidden=args.hidden), src)
            n_nodes = len(onnx.load(src).graph.node)
            base = best_of(args.repeat, lambda src=src: onnx.save(onnx.load(src), tmp / "copy.onnx"))
            conv = best_of(args.repeat, lambda src=src: convert_file(src, tmp / "out.onnx"))
            full = best_of(args.repeat, lambda src=src: convert_file(src, tmp / "out.onnx", check="full"))
            result = convert_file(src, tmp / "out.onnx")
            rows.append((n_nodes, base, conv, conv / base, full, result.casts_added, result.seconds))
    print(f"hidden size {args.hidden}, best of {args.repeat} runs")
    print(
        f"{'nodes':>8} {'load+save s':>12} {'convert s':>10} {'ratio':>6} {'--check full s':>15} {'ratio':>6} "
        f"{'casts':>6}  stages of one default run (s)"
    )
    for n_nodes, base, conv, ratio, full, casts, secs in rows:
        stages = " ".join(f"{k}={v:.3f}" for k, v in secs.items() if k != "total")
        print(
            f"{n_nodes:>8} {base:>12.3f} {conv:>10.3f} {ratio:>6.2f} {full:>15.3f} {full / base:>6.2f} "
            f"{casts:>6}  {stages}"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = (last[2] / first[2]) / (last[0] / first[0])
        print(f"convert time per node, largest vs smallest size: {growth:.2f}x (1.00 = linear)")


if __name__ == "__main__":
    main()
