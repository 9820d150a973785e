"""Conversion cost in instructions, not seconds: the same ratio as bench_convert.py (convert /
load+save of the synthetic residual-block model), counted by valgrind's callgrind, which gives
the same count on a busy machine as on an idle one. Use it to compare two revisions of the core
when wall-clock times on a shared machine are too noisy to tell them apart:

    python benchmarks/bench_instructions.py --sizes 10000
    python benchmarks/bench_instructions.py --sizes 10000 --source /path/to/other/checkout

Each (size, mode) runs in its own process: "setup" (imports, build and write the model), then
setup + load+save, then setup + convert; the setup count is subtracted from the other two.
Needs `valgrind` (Debian package). About 30 s per size of 10,000 nodes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import gc, sys, tempfile
from pathlib import Path
root, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root)
sys.path.insert(0, root + "/benchmarks")
import onnx
from bench_convert import synthetic_model
from autocast_onnx.pipeline import convert_file
tmp = Path(tempfile.mkdtemp())
src = tmp / "m.onnx"
onnx.save(synthetic_model(n), src)
gc.collect()
if mode == "loadsave":
    onnx.save(onnx.load(src), tmp / "copy.onnx")
elif mode == "convert":
    convert_file(src, tmp / "out.onnx")
"""


def count(source: Path, mode: str, size: int, script: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                str(script),
                str(source),
                mode,
                str(size),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        sys.exit(f"callgrind run failed ({mode}, {size} nodes): {proc.stderr.strip().splitlines()[-1:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000])
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout whose autocast_onnx is measured")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        print(f"source {args.source.resolve()}")
        print(f"{'nodes':>8} {'load+save Minstr':>17} {'convert Minstr':>15} {'ratio':>6}")
        for size in args.sizes:
            setup = count(args.source, "setup", size, script)
            base = count(args.source, "loadsave", size, script) - setup
            conv = count(args.source, "convert", size, script) - setup
            print(f"{size:>8} {base / 1e6:>17.1f} {conv / 1e6:>15.1f} {conv / base:>6.2f}")


if __name__ == "__main__":
    main()
