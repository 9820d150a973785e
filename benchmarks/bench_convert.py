"""Conversion speed on synthetic transformer-like graphs of growing size.

For each size it writes a model to a temporary folder, then times, side by side in one run:
  - baseline: onnx.load + onnx.save of the same model (what any tool that touches the file pays);
  - autocast-onnx: the whole `convert` command path (read, plan, rewrite, onnx.checker, write),
    with the default --check basic and with --check full (adds ONNX shape/type inference).
It prints a table of seconds and the ratio convert / baseline, best of --repeat runs.

With --process each run is a whole process instead, as a user meets them: `python -c "onnx.save(
onnx.load(IN), OUT)"` (the floor) against `autocast-onnx convert IN -o OUT -q` (the CLI, default
--check basic), run alternately --repeat times, each after an untimed os.sync(); it prints the
medians of wall time and of peak resident memory (VmHWM) with their ratios, and the spread of
the ratio of each convert run to the floor run just before it. PYTHONPATH pointing at another checkout measures that
version of autocast-onnx. The measured package is byte-compiled first, as `pip install` does (an
editable checkout under PYTHONDONTWRITEBYTECODE would compile every module in every process).

    python benchmarks/bench_convert.py [--sizes 1000 10000 100000] [--repeat 3] [--hidden 16]
    python benchmarks/bench_convert.py --process --sizes 100000 300000 --hidden 48 --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
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


# Runs in a fresh process: the floor or the CLI's console entry on SRC -> DST; prints seconds
# from before the imports and VmHWM, the peak RSS of this address space, as it exits.
CHILD = r"""
import os, sys, time
start = time.perf_counter()
mode, src, dst = sys.argv[1:4]
def report():
    hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(time.perf_counter() - start, hwm, flush=True)
if mode == "floor":  # exits as any script does
    import onnx
    onnx.save(onnx.load(src), dst)
    report()
else:
    hard_exit = os._exit
    me = os.getpid()
    def report_and_exit(code):  # the console entry ends with os._exit: report first
        if os.getpid() == me:  # not in a worker the conversion forked (it ends with os._exit too)
            report()
        hard_exit(code)
    os._exit = report_and_exit
    try:
        from autocast_onnx.cli.main import run
    except ImportError:  # a version before the console entry had its own exit
        from autocast_onnx.cli.main import main as run
    sys.argv = ["autocast-onnx", "convert", src, "-o", dst, "-q"]
    try:
        run()
    except SystemExit as exc:
        if exc.code:
            raise
        report()
"""


def run_process(mode: str, src: Path, dst: Path) -> tuple[float, int]:
    """Wall time (interpreter start and exit included) and peak RSS of one child process. The
    page cache's dirty pages are written back first, untimed: the floor does not sync the copy
    it writes, and its write-back would otherwise run during the next run, whichever it is."""
    os.sync()
    start = time.perf_counter()
    # run in the model's folder: `python -c` puts the working folder first on sys.path, so from a
    # checkout's root the child would import that checkout instead of the one PYTHONPATH names
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(src), str(dst)], capture_output=True, text=True, cwd=src.parent
    )
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{mode} failed on {src}:\n{out.stderr}")
    return wall, int(out.stdout.split()[1])


def main_process(args, tmp: Path) -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import autocast_onnx, os; print(os.path.dirname(autocast_onnx.__file__))"],
        capture_output=True,
        text=True,
        cwd=tmp,
        check=True,
    )
    package = found.stdout.strip()
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], check=True, capture_output=True)
    print(f"autocast-onnx from {package}")
    print(f"whole processes, hidden size {args.hidden}, medians of {args.repeat} alternating runs")
    print("(pairs: each convert run over the floor run just before it, lowest-median-highest)")
    print(
        f"{'nodes':>8} {'MB':>6} {'floor s':>8} {'convert s':>10} {'ratio':>6} {'pairs':>15} "
        f"{'floor MiB':>10} {'convert MiB':>12} {'ratio':>6}"
    )
    for size in args.sizes:
        src = tmp / f"synthetic_{size}.onnx"
        onnx.save(synthetic_model(size, hidden=args.hidden), src)
        floor, conv = [], []
        for _ in range(args.repeat):
            floor.append(run_process("floor", src, tmp / "copy.onnx"))
            conv.append(run_process("convert", src, tmp / "out.onnx"))
        ft, fm = statistics.median(t for t, _ in floor), statistics.median(m for _, m in floor)
        ct, cm = statistics.median(t for t, _ in conv), statistics.median(m for _, m in conv)
        pairs = sorted(c / f for (f, _), (c, _) in zip(floor, conv))
        spread = f"{pairs[0]:.2f}-{statistics.median(pairs):.2f}-{pairs[-1]:.2f}"
        print(
            f"{len(onnx.load(src, load_external_data=False).graph.node):>8} {src.stat().st_size / 1e6:>6.0f} "
            f"{ft:>8.2f} {ct:>10.2f} {ct / ft:>6.2f} {spread:>15} "
            f"{fm / 2**20:>10.0f} {cm / 2**20:>12.0f} {cm / fm:>6.2f}",
            flush=True,
        )
        src.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--hidden", type=int, default=16, help="width of the square weight matrices (16: 1 KiB per weight; 64: 16 KiB)"
    )
    ap.add_argument("--process", action="store_true", help="whole processes: the floor against the CLI")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.process:
            main_process(args, tmp)
            return
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
