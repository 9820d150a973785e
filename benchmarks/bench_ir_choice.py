"""Why autocast-onnx keeps its own graph index instead of onnx-graphsurgeon's IR: time to bring
a synthetic residual-block model (see bench_convert.py) into each, side by side in one run, and
the cost of graphsurgeon's export and toposort that a rewrite through it would add.

    pip install onnx-graphsurgeon   # not a dependency of autocast-onnx
    python benchmarks/bench_ir_choice.py [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_convert import synthetic_model

from autocast_onnx.graph import build_index


def timed(fn):
    gc.disable()
    try:
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    args = parser.parse_args()
    try:
        import onnx_graphsurgeon as gs
    except ImportError:
        sys.exit("install onnx-graphsurgeon to run this benchmark (pip install onnx-graphsurgeon)")
    print(
        f"{'nodes':>8} {'our index s':>12} {'gs import s':>12} {'gs export s':>12} {'gs toposort s':>14} "
        f"{'gs import+export / index':>25}"
    )
    for n in args.sizes:
        model = synthetic_model(n)
        t_index, index = timed(lambda model=model: build_index(model))
        t_import, graph = timed(lambda model=model: gs.import_onnx(model))
        t_export, exported = timed(lambda graph=graph: gs.export_onnx(graph))
        t_topo, _ = timed(graph.toposort)
        print(
            f"{n:>8} {t_index:>12.3f} {t_import:>12.3f} {t_export:>12.3f} {t_topo:>14.3f} "
            f"{(t_import + t_export) / t_index:>24.1f}x"
        )
        del index, graph, exported, model
        gc.collect()


if __name__ == "__main__":
    main()
