"""Peak memory of converting a model larger than 2 GB stored with external data.

Builds (in a temporary folder, never committed) a stack of LAYERS MatMul layers with
[WIDTH, WIDTH] fp32 weights written straight to an external data file, one weight at a time,
plus a LayerNormalization and Softmax per layer. Then, each in a fresh process, it measures the
peak resident memory (ru_maxrss) of:
  - onnx.load + onnx.save with external data (what a tool that loads the model pays);
  - `autocast-onnx convert` (fp16; streams the weights);
and prints them against the size of the weights that must be converted, with the time of
copying the weight file (the floor for a tool that must read and write every byte).
PYTHONPATH pointing at another checkout measures that version of autocast-onnx.

    python benchmarks/bench_memory.py [--layers 36] [--width 4096] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

CHILD = r"""
import sys, time
t = time.perf_counter()
mode, src, dst = sys.argv[1:4]
if mode == "onnx":
    import onnx
    m = onnx.load(src)
    onnx.save(m, dst, save_as_external_data=True, location=dst.rsplit("/", 1)[-1] + ".data")
else:
    from autocast_onnx.cli.main import main
    sys.argv = ["autocast-onnx", "convert", src, "-o", dst, "-q"]
    try:
        main()
    except SystemExit as exc:
        if exc.code:
            raise
# VmHWM: this address space's peak RSS (ru_maxrss would carry the parent's from before exec)
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(hwm, time.perf_counter() - t)
"""


def build(folder: Path, layers: int, width: int) -> tuple[Path, int]:
    rng = np.random.default_rng(0)
    data_name = "big.onnx.data"
    nodes, inits = [], []
    offset = 0
    x = "x"
    with open(folder / data_name, "wb") as fh:
        for i in range(layers):
            w = (rng.standard_normal((width, width), dtype=np.float32) * 0.02).astype("<f4")
            fh.write(w.tobytes())
            t = TensorProto(
                name=f"w{i}", dims=[width, width], data_type=TensorProto.FLOAT, data_location=TensorProto.EXTERNAL
            )
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(w.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            offset += w.nbytes
            inits.append(t)
            nodes += [
                helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"fc{i}"),
                helper.make_node("LayerNormalization", [f"h{i}", "g", "b"], [f"n{i}"], name=f"ln{i}"),
                helper.make_node("Softmax", [f"n{i}"], [f"s{i}"], name=f"sm{i}"),
            ]
            x = f"s{i}"
    inits += [
        helper.make_tensor("g", TensorProto.FLOAT, [width], np.ones(width, np.float32)),
        helper.make_tensor("b", TensorProto.FLOAT, [width], np.zeros(width, np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / "big.onnx"
    path.write_bytes(model.SerializeToString())
    return path, offset


def measure(mode: str, src: Path, dst: Path) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(dst)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    peak, seconds = out.stdout.split()[-2:]
    return int(peak), float(seconds)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--keep", type=Path, help="build in this folder and keep the files")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="autocast-mem-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        src, weight_bytes = build(folder, args.layers, args.width)
        print(
            f"model: {args.layers} MatMul layers of [{args.width}, {args.width}] fp32, weights {gib(weight_bytes)} "
            f"in external data (built in {time.perf_counter() - t:.1f} s)"
        )
        t = time.perf_counter()
        shutil.copyfile(folder / "big.onnx.data", folder / "copy.bin")
        with open(folder / "copy.bin", "rb+") as fh:
            os.fsync(fh.fileno())
        copy_s = time.perf_counter() - t
        (folder / "copy.bin").unlink()
        base_peak, base_s = measure("onnx", src, folder / "copy.onnx")
        for f in folder.glob("copy.onnx*"):
            f.unlink()
        conv_peak, conv_s = measure("convert", src, folder / "big.fp16.onnx")
        out_model = onnx.load(folder / "big.fp16.onnx", load_external_data=False)
        converted = sum(1 for t in out_model.graph.initializer if t.data_type == TensorProto.FLOAT16)
        data_size = os.path.getsize(folder / "big.fp16.onnx.data")
        print(f"converted: {converted} weights to fp16, output data {gib(data_size)}")
        print(f"{'run':<36} {'peak RSS':>10} {'seconds':>8} {'peak / fp32 weights':>20}")
        for label, peak, secs in (
            ("onnx.load + onnx.save (external)", base_peak, base_s),
            ("autocast-onnx convert (fp16)", conv_peak, conv_s),
        ):
            print(f"{label:<36} {gib(peak):>10} {secs:>8.1f} {peak / weight_bytes:>20.2f}")
        print(f"{'copy of the fp32 weight file':<36} {'-':>10} {copy_s:>8.1f}")
        print(
            f"convert peak vs fp16 output weights: {conv_peak / data_size:.2f}x; "
            f"time vs the copy: {conv_s / copy_s:.2f}x"
        )
    finally:
        if args.keep is None:
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()


if __name__ == "__main__":
    main()
