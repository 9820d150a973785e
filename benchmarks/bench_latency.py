"""Latency of each converter's output against the fp32 model, on one ONNX Runtime device.

Reads a folder that `bench_peers.py --keep DIR` filled (each model's fp32 source and every
tool's output, listed in DIR/manifest.json) and, per model, runs the source and each output
on the same generated inputs: median milliseconds per run after warm-up (I/O binding on CUDA,
so host copies are not timed), the ratio to the fp32 source, and the relative L2 error of the
output's results against the source's on that device. The conversion and this measurement are
separate steps so the models can be converted where the converters are installed and timed
where the GPU is:

    python benchmarks/bench_peers.py --keep /tmp/peers              # converts, keeps the models
    python benchmarks/bench_latency.py /tmp/peers --device cuda --json latency.json
    python benchmarks/bench_peers.py --latency latency.json ...     # the table with latency columns

`--device cpu` runs the same measurement on the CPU provider, which removes fp16 casts and runs
fp16 ops through fallbacks: its ratios say nothing about a GPU and the table marks them so.
A device the installed ONNX Runtime cannot provide is an error (exit 2), never a silent
fallback to another device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MANIFEST = "manifest.json"


def gpu_name() -> str | None:
    """The GPU's name from nvidia-smi, or None where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None


def read_manifest(folder: Path) -> list[dict]:
    """The entries of folder/manifest.json: {model, tool, source, output} with paths made absolute;
    one clear error (exit 2) for a folder that is not one bench_peers.py kept."""
    path = folder / MANIFEST
    if not path.is_file():
        raise SystemExit(f"error: {folder}: no {MANIFEST} here; make the folder with bench_peers.py --keep {folder}")
    try:
        rows = [
            {"model": e["model"], "tool": e["tool"], "source": folder / e["source"], "output": folder / e["output"]}
            for e in json.loads(path.read_text())
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"error: {path}: not a manifest bench_peers.py wrote ({exc!r}); keep it again") from None
    if not rows:
        raise SystemExit(f"error: {path}: lists no converted model; keep the folder again with bench_peers.py --keep")
    missing = [str(r["output"]) for r in rows if not r["output"].is_file()] + [
        str(r["source"]) for r in rows if not r["source"].is_file()
    ]
    if missing:
        raise SystemExit(f"error: {missing[0]}: listed in {path} but missing; keep the folder again")
    return rows


def generated_inputs(model: onnx.ModelProto) -> dict:
    """The inputs every tool's output of `model` is run on: validate's generator, seed 0."""
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

    return generate(plan_inputs(describe_inputs(model)), seed=0)


def worst_error(ref: list, got: list) -> float | None:
    """The largest relative L2 error of the float outputs `got` against `ref` (None: none is float)."""
    from autocast_onnx.validate.diagnose import relative_error

    errs = [relative_error(g, r) for r, g in zip(ref, got) if r.dtype.kind == "f"]
    return max(errs) if errs else None


def measure(entries: list[dict], device: str, iterations: int, warmup: int, models: list[str] | None = None) -> list:
    """One row per fp32 source (tool "fp32") and per converted output: latency on `device`, and
    for outputs the ratio to their source and the error against its results on that device."""
    from autocast_onnx.errors import AutocastError
    from autocast_onnx.validate import runner

    by_model: dict[str, list[dict]] = {}
    for e in entries:
        by_model.setdefault(e["model"], []).append(e)
    if models:
        unknown = sorted(set(models) - set(by_model))
        if unknown:
            raise SystemExit(f"error: --models {unknown[0]}: not in the manifest; choose from {', '.join(by_model)}")
        by_model = {m: by_model[m] for m in models}
    rows = []
    for model, outs in by_model.items():
        source = outs[0]["source"]
        feeds = generated_inputs(onnx.load(str(source), load_external_data=False))
        ref_sess = runner.session(str(source), device)
        ref = runner.run(ref_sess, feeds)
        base = runner.latency(ref_sess, feeds, device, iterations, warmup)
        rows.append({"model": model, "tool": "fp32", "device": device, "ms": base["p50_ms"], "ok": True})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for e in outs:
            row = {"model": model, "tool": e["tool"], "device": device}
            try:
                sess = runner.session(str(e["output"]), device)
                own = runner.feeds_for(sess, feeds)
                got = runner.run(sess, own)
                lat = runner.latency(sess, own, device, iterations, warmup)
            except AutocastError as exc:
                row.update(ok=False, failure=exc.what[:160])
            else:
                ms = lat["p50_ms"]
                row.update(ok=True, ms=ms, vs_fp32=ms / base["p50_ms"], error=worst_error(ref, got))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], device: str, label: str) -> str:
    lines = [
        f"latency on {label} (median ms per run)",
        "",
        "| model | tool | ms | × fp32 | rel. error vs fp32 on the device |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['model']} | {r['tool']} | failed: {r['failure']} | | |")
        elif r["tool"] == "fp32":
            lines.append(f"| {r['model']} | fp32 | {r['ms']:.3f} | 1.00 | - |")
        else:
            err = "-" if r.get("error") is None else f"{r['error']:.2e}"
            lines.append(f"| {r['model']} | {r['tool']} | {r['ms']:.3f} | {r['vs_fp32']:.2f} | {err} |")
    ratios: dict[str, list] = {}
    for r in rows:
        if r["ok"] and r["tool"] != "fp32":
            ratios.setdefault(r["tool"], []).append(r["vs_fp32"])
    if ratios:
        lines += ["", "| tool | median × fp32 | models |", "|---|---:|---:|"]
        for tool, values in ratios.items():
            lines.append(f"| {tool} | {statistics.median(values):.2f} | {len(values)} |")
    if device == "cpu":
        lines += ["", "CPU provider: it removes fp16 casts and runs fp16 ops by fallback; not a GPU figure."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="A folder made by bench_peers.py --keep.")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--iterations", type=int, default=50, help="Timed runs per model (median reported).")
    ap.add_argument("--warmup", type=int, default=10, help="Untimed runs first.")
    ap.add_argument("--models", nargs="+", help="Only these models of the manifest.")
    ap.add_argument("--json", type=Path, help="Also write the rows here (bench_peers.py --latency reads them).")
    args = ap.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        ap.error("--iterations must be at least 1 and --warmup at least 0")
    try:
        entries = read_manifest(args.folder)
        from autocast_onnx.errors import AutocastError
        from autocast_onnx.validate import runner

        try:
            device, _ = runner.resolve_device(args.device)
        except AutocastError as exc:
            raise SystemExit(f"error: {exc.line()}") from None
        name = (gpu_name() or "a GPU nvidia-smi did not name") if device == "cuda" else "CPU"
        label = f"{name}, onnxruntime {runner.ort().__version__} ({device})"
        rows = measure(entries, device, args.iterations, args.warmup, args.models)
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 2
    print(table(rows, device, label))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": device, "label": label, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
