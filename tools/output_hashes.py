"""Fingerprints of what the tool writes for every model the repository ships, to prove a change
leaves outputs byte-identical: run it before and after, then diff the two listings.

For each model in examples/models, tests/data/evidence and tests/data/decoders it converts at
fp16 and bf16 (the converted model, its plan and its lint JSON report), and for each training
artifacts folder in tests/data/training it converts the folder. With --large it also converts
synthetic chains (benchmarks/bench_convert.py) large enough for the fast path (fast/: the worker,
the weight screen, payloads left in the file, the splice), with weights of 1, 9 and 16 KiB, one
with an overflowing weight (kept fp32 by the data rules) and one to an external-data output.
It prints one line per written
file: `sha256  size  name`, in a stable order. Paths inside the outputs that name the temporary
folder are the same in both runs (the folder is fixed), so the hashes compare as they are.

    python tools/output_hashes.py > before.txt
    ... change the code ...
    python tools/output_hashes.py > after.txt && diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_FOLDERS = ("examples/models", "tests/data/evidence", "tests/data/decoders")
TRAINING_FOLDERS = "tests/data/training"
CLI = [sys.executable, "-m", "autocast_onnx"]


def run(args: list[str]) -> None:
    """Run the CLI quietly; a failure stops the listing (a changed exit code is a change too)."""
    done = subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT)
    if done.returncode not in (0, 1):  # lint exits 1 with findings
        sys.exit(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")


def write_outputs(out: Path) -> None:
    """Every output this listing covers, written under `out`."""
    for folder in MODEL_FOLDERS:
        for model in sorted(
            p.relative_to(ROOT) for p in (ROOT / folder).glob("*.onnx")
        ):  # relative: outputs that name it match across checkouts
            for precision in ("fp16", "bf16"):
                stem = out / f"{model.stem}.{precision}"
                run(["convert", str(model), "-o", f"{stem}.onnx", "--precision", precision,
                     "--plan-out", f"{stem}.plan.json", "-q"])  # fmt: skip
            run(["lint", str(model), "--format", "json", "-o", str(out / f"{model.stem}.lint.json")])
    for folder in sorted(p.relative_to(ROOT) for p in (ROOT / TRAINING_FOLDERS).iterdir() if p.is_dir()):
        run(["convert", str(folder), "-o", str(out / f"{folder.name}.fp16"), "-q"])


def write_large_outputs(out: Path) -> None:
    """Conversions that take the fast path: synthetic chains above the worker's size floor."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    import onnx
    from bench_convert import synthetic_model

    models = out / "large-inputs"
    models.mkdir()
    for nodes, hidden in ((70000, 16), (12000, 48), (6000, 64)):
        model = synthetic_model(nodes, hidden=hidden)
        if hidden == 48:  # one weight that overflows fp16: the screen flags it, the data rules keep it fp32
            weight = model.graph.initializer[len(model.graph.initializer) // 2]
            values = np.frombuffer(weight.raw_data, dtype="<f4").copy()
            values[3] = 1e6
            weight.raw_data = values.tobytes()
        path = models / f"chain_{nodes}_{hidden}.onnx"
        onnx.save(model, path)
        stem = out / f"{path.stem}.fp16"
        run(["convert", str(path), "-o", f"{stem}.onnx", "--plan-out", f"{stem}.plan.json", "-q"])
    path = models / "chain_12000_48.onnx"
    (out / "external").mkdir()
    run(["convert", str(path), "-o", str(out / "external" / "chain.fp16.onnx"), "--external-data", "-q"])
    shutil.rmtree(models)


def listing(out: Path) -> list[str]:
    """`sha256  size  relative path` of every file under `out`, sorted."""
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {len(data):>10}  {path.relative_to(out)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/autocast-output-hashes", help="scratch folder (emptied first)")
    parser.add_argument("--large", action="store_true", help="also conversions that take the fast path")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    write_outputs(out)
    if args.large:
        write_large_outputs(out)
    print("\n".join(listing(out)))


if __name__ == "__main__":
    main()
