"""autocast-onnx against the other fp16 converters, on the same models, each as its own process.

Tools:
  floor                 onnx.load + onnx.save (what any converter pays)
  autocast-onnx         this project (autocast_onnx.convert_file, default rules)
  onnxconverter-common  onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True)
  ort-float16           onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)

The two peers run in their own virtual environment (.venv-peers, made by `--setup` from the
package registry), never as dependencies of the project. Per model and tool: process time and
peak memory (RSS), whether the output passes onnx.checker (full) and loads in ONNX Runtime, the
ops of fp32 categories (this project's keep_fp32 rules: softmax, normalizations, reductions,
exp/log/pow, ...) left computing in fp16, casts added, and the largest relative L2 error of the
output's emulated fp16 numerics against fp32 on generated inputs.

    python benchmarks/bench_peers.py --setup            # once: .venv-peers
    python benchmarks/bench_peers.py [--sizes 1000 10000] [--json docs/benchmarks/peers.json]

Latency on a GPU is a separate step (bench_latency.py), so the conversion can run where the
converters are installed and the timing where the GPU is: `--keep DIR` keeps every model and
output with a manifest, bench_latency.py times them on the CUDA execution provider, and
`--latency FILE` adds its figures to this table (latency and its ratio to the fp32 model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".venv-peers"
PEER_PACKAGES = ["onnxconverter-common==1.16.0", "onnxruntime==1.32.0", "onnx==1.19.1"]
TOOLS = ["floor", "autocast-onnx", "onnxconverter-common", "ort-float16"]
LARGE = 20_000  # nodes: above this, no ONNX Runtime load and no emulated error (minutes each)

# Runs in a fresh process: convert SRC into DST with TOOL, print time and peak RSS as JSON.
DRIVER = r"""
import json, sys, time
start = time.perf_counter()
tool, src, dst = sys.argv[1:4]
import onnx
if tool == "autocast-onnx":
    from autocast_onnx import convert_file
    convert_file(src, dst)
else:
    model = onnx.load(src)
    if tool == "onnxconverter-common":
        from onnxconverter_common.float16 import convert_float_to_float16
        model = convert_float_to_float16(model, keep_io_types=True)
    elif tool == "ort-float16":
        from onnxruntime.transformers.float16 import convert_float_to_float16
        model = convert_float_to_float16(model, keep_io_types=True)
    onnx.save(model, dst)
# VmHWM: the peak RSS of this address space (ru_maxrss would carry the parent's from before exec)
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds_in_process": time.perf_counter() - start, "peak_rss": hwm}))
"""


def setup() -> None:
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(PEERS_VENV / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)
    print(f"peers installed in {PEERS_VENV}: {', '.join(PEER_PACKAGES)}")


def if_model() -> onnx.ModelProto:
    """A model with control flow: If picks one of two attention-like branches (MatMul, Softmax)."""
    rng = np.random.default_rng(0)

    def branch(name: str, scale: float) -> onnx.GraphProto:
        w = numpy_helper.from_array((rng.standard_normal((16, 16)) * scale).astype(np.float32), f"{name}_w")
        return helper.make_graph(
            [
                helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_h"]),
                helper.make_node("Softmax", [f"{name}_h"], [f"{name}_y"], axis=-1),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4, 16])],
            [w],
        )

    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 0.5), else_branch=branch("else", 2.0)),
        ],
        "if_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def models(sizes: list[int], work: Path) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_convert import synthetic_model

    out = {p.stem: p for p in sorted((ROOT / "examples" / "models").glob("*.onnx"))}
    out.update({p.stem: p for p in sorted((ROOT / "tests" / "data" / "evidence").glob("*.onnx"))})
    onnx.save(if_model(), work / "if_attention.onnx")
    out["if_attention"] = work / "if_attention.onnx"
    for n in sizes:
        path = work / f"synthetic_{n}.onnx"
        onnx.save(synthetic_model(n), path)
        out[f"synthetic_{n}"] = path
    return out


def run_tool(tool: str, src: Path, dst: Path) -> dict:
    python = str(PEERS_VENV / "bin" / "python") if tool in ("onnxconverter-common", "ort-float16") else sys.executable
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", DRIVER, tool, str(src), str(dst)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return {"ok": False, "error": (lines[-1] if lines else f"exit {proc.returncode}")[:160]}
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"ok": True, "seconds": seconds, **measured}


def fp32_category_ops_in_fp16(model: onnx.ModelProto) -> int:
    """Nodes (main graph and bodies) whose op this project's rules keep fp32 but that compute in
    fp16 in `model`: the type of their first float output, from shape/type inference."""
    from autocast_onnx.catalog import load_rules

    rules = load_rules([])
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:
        pass
    count = 0

    def walk(graph, types):
        nonlocal count
        types = dict(types)
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            types[vi.name] = vi.type.tensor_type.elem_type
        for t in graph.initializer:
            types[t.name] = t.data_type
        for node in graph.node:
            rule = rules.op_rule(node.domain, node.op_type)
            floats = [types.get(o) for o in node.output if types.get(o) in (TensorProto.FLOAT, TensorProto.FLOAT16)]
            if rule is not None and rule.category == "keep_fp32" and floats and floats[0] == TensorProto.FLOAT16:
                count += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, types)

    walk(model.graph, {})
    return count


def evaluate(src: Path, dst: Path) -> dict:
    from autocast_onnx.validate import runner
    from autocast_onnx.validate.emulate import emulation_model

    out: dict = {}
    try:
        onnx.checker.check_model(str(dst), full_check=True)
        out["checker"] = True
    except Exception as exc:
        out["checker"] = False
        out["checker_error"] = " ".join(str(exc).split())[:160]
    converted = onnx.load(str(dst))
    source = onnx.load(str(src))
    if len(source.graph.node) > LARGE:
        out["ort_loads"] = None  # ONNX Runtime's graph optimizations take minutes at this size
    else:
        try:
            runner.session(str(dst), "cpu")
            out["ort_loads"] = True
        except Exception as exc:
            out["ort_loads"] = False
            out["ort_error"] = " ".join(str(exc).split())[:160]
    casts = sum(1 for n in converted.graph.node if n.op_type == "Cast") - sum(
        1 for n in source.graph.node if n.op_type == "Cast"
    )
    out["casts_added"] = casts
    out["fp32_ops_in_fp16"] = fp32_category_ops_in_fp16(converted)
    out["error"] = None
    if len(source.graph.node) <= LARGE:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_latency import generated_inputs, worst_error

        try:
            feeds = generated_inputs(source)
            ref = runner.run(runner.session(str(src), "cpu"), feeds)
            emu = runner.session(emulation_model(converted).SerializeToString(), "cpu", optimize=False)
            got = runner.run(emu, runner.feeds_for(emu, feeds))
            out["error"] = worst_error(ref, got)
        except Exception as exc:
            out["error_failed"] = str(exc).splitlines()[0][:120]
    return out


COLOURS = {"autocast-onnx": "#2a9d8f", "onnxconverter-common": "#e76f51", "ort-float16": "#457b9d", "floor": "#888"}


TIME_TITLE = "process seconds against nodes (log-log)"


def svg_time(rows: list[dict]) -> str:
    """Process seconds against nodes, log-log, one point per model and tool."""
    import math

    ok = [r for r in rows if r["ok"]]
    xs = [math.log10(max(r["nodes"], 1)) for r in ok]
    ys = [math.log10(r["seconds"]) for r in ok]
    x0, x1, y0, y1 = min(xs), max(xs) + 0.1, min(ys) - 0.05, max(ys) + 0.05
    w, h, m = 640, 360, 50

    def px(x, y):
        return m + (x - x0) / (x1 - x0) * (w - 2 * m), h - m - (y - y0) / (y1 - y0) * (h - 2 * m)

    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif"'
    parts = [head + ' font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="16" text-anchor="middle">{TIME_TITLE}</text>']  # fmt: skip
    for k in range(math.ceil(x0), math.floor(x1) + 1):
        x, _ = px(k, y0)
        parts.append(f'<line x1="{x}" y1="{m}" x2="{x}" y2="{h - m}" stroke="#eee"/>')
        parts.append(f'<text x="{x}" y="{h - m + 14}" text-anchor="middle">1e{k}</text>')
    for v in (0.1, 0.3, 1, 3, 10, 30, 100):
        if y0 <= math.log10(v) <= y1:
            _, y = px(x0, math.log10(v))
            parts.append(f'<line x1="{m}" y1="{y}" x2="{w - m}" y2="{y}" stroke="#eee"/>')
            parts.append(f'<text x="{m - 4}" y="{y + 4}" text-anchor="end">{v:g} s</text>')
    for tool, colour in COLOURS.items():
        pts = sorted((x, y) for r, x, y in zip(ok, xs, ys) if r["tool"] == tool)
        for x, y in pts:
            cx, cy = px(x, y)
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{colour}" fill-opacity="0.8"/>')
    for i, (tool, colour) in enumerate(COLOURS.items()):
        parts.append(f'<circle cx="{m + 10}" cy="{m + 10 + 15 * i}" r="4" fill="{colour}"/>')
        parts.append(f'<text x="{m + 20}" y="{m + 14 + 15 * i}">{tool}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def svg_per_model(rows: list[dict], key: str, title: str, log: bool) -> str:
    """One group of bars per model (the converters side by side) for `key`."""
    import math

    tools = [t for t in COLOURS if t != "floor"]
    names = list(dict.fromkeys(r["model"] for r in rows))
    vals = {(r["model"], r["tool"]): r.get(key) for r in rows if r["ok"] and r["tool"] != "floor"}
    present = [v for v in vals.values() if v]
    if not present:
        return ""
    top = max(present)
    low = min(present)
    w, bar, gap, m = 640, 6, 8, 150
    h = 40 + len(names) * (len(tools) * bar + gap)

    def length(v):
        if not v:
            return 0
        if log:
            span = math.log10(top) - math.log10(low) + 0.3
            return (math.log10(v) - math.log10(low) + 0.3) / span * (w - m - 70)
        return v / top * (w - m - 70)

    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif"'
    parts = [head + ' font-size="10">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="14" text-anchor="middle">{title}</text>']  # fmt: skip
    y = 28
    for name in names:
        parts.append(f'<text x="{m - 6}" y="{y + len(tools) * bar / 2 + 3}" text-anchor="end">{name}</text>')
        for tool in tools:
            v = vals.get((name, tool))
            parts.append(f'<rect x="{m}" y="{y}" width="{length(v):.1f}" height="{bar - 1}" fill="{COLOURS[tool]}"/>')
            label = "failed" if (name, tool) not in vals else (f"{v:.1e}" if isinstance(v, float) else str(v))
            parts.append(f'<text x="{m + length(v) + 3:.1f}" y="{y + bar - 1}" font-size="8">{label}</text>')
            y += bar
        y += gap
    parts.append("</svg>")
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="Create .venv-peers with the peer converters, then stop.")
    ap.add_argument("--sizes", nargs="*", type=int, default=[1000, 10000], help="Synthetic graph sizes (nodes).")
    ap.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    ap.add_argument("--json", type=Path, help="Also write the results here.")
    ap.add_argument("--svg", type=Path, help="Write the plots (time against nodes, error and casts per model) here.")
    ap.add_argument("--keep", type=Path, help="Keep each source and output here, for bench_latency.py.")
    ap.add_argument("--latency", type=Path, help="Latency rows written by bench_latency.py --json: added to the table.")
    args = ap.parse_args()
    if args.setup:
        setup()
        return
    if not (PEERS_VENV / "bin" / "python").exists() and set(args.tools) & {"onnxconverter-common", "ort-float16"}:
        sys.exit(f"the peer converters are not installed: run `python {Path(__file__).name} --setup` first")
    latency = read_latency(args.latency) if args.latency else None
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        sys.exit(f"--keep {args.keep}: the folder is not empty; give a new or empty one")
    kept: list[dict] = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, src in models(args.sizes, work).items():
            nodes = len(onnx.load(str(src)).graph.node)
            for tool in args.tools:
                dst = work / f"{name}.{tool}.onnx"
                result = run_tool(tool, src, dst)
                row = {"model": name, "nodes": nodes, "tool": tool, **result}
                if result["ok"] and tool != "floor":
                    row.update(evaluate(src, dst))
                    if args.keep is not None:
                        keep(args.keep, name, tool, src, dst, kept)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    if latency is not None:
        add_latency(rows, latency)
    print(table(rows))
    if args.keep is not None:
        print(f"kept {len(kept)} outputs and their sources in {args.keep}; time them with bench_latency.py")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.svg:
        plot(rows, args.svg)


def keep(folder: Path, model: str, tool: str, src: Path, dst: Path, kept: list) -> None:
    """Copy the source (once) and `tool`'s output of `model` into `folder` and rewrite its
    manifest.json. A file with external data is not kept (said on stderr): the copy would lose it."""
    for path in (src, dst):
        proto = onnx.load(str(path), load_external_data=False)
        if any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
            print(f"warning: {path.name} has external data: {model}/{tool} not kept", file=sys.stderr)
            return
    (folder / "sources").mkdir(parents=True, exist_ok=True)
    source = Path("sources") / f"{model}.onnx"
    if not (folder / source).exists():
        shutil.copyfile(src, folder / source)
    output = Path(f"{model}.{tool}.onnx")
    shutil.copyfile(dst, folder / output)
    kept.append({"model": model, "tool": tool, "source": str(source), "output": str(output)})
    (folder / "manifest.json").write_text(json.dumps(kept, indent=1) + "\n")


def read_latency(path: Path) -> dict:
    """The JSON bench_latency.py --json wrote: {"device", "label", "rows"}."""
    try:
        data = json.loads(path.read_text())
        rows, label = data["rows"], data["label"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"--latency {path}: not a file written by bench_latency.py --json ({exc})")
    return {"label": label, "device": data.get("device"), "rows": rows}


def add_latency(rows: list[dict], latency: dict) -> None:
    """Each converted row gets its latency and ratio to fp32 from bench_latency.py's rows; a
    latency row that matches no model and tool here is named on stderr, not dropped silently."""
    measured = {(r["model"], r["tool"]): r for r in latency["rows"] if r.get("tool") != "fp32"}
    used = set()
    for row in rows:
        found = measured.get((row["model"], row["tool"]))
        if row["tool"] == "floor" or found is None:
            continue
        used.add((row["model"], row["tool"]))
        row["latency_device"] = latency["label"]
        row["latency_ms"] = found.get("ms") if found.get("ok") else None
        row["latency_vs_fp32"] = found.get("vs_fp32") if found.get("ok") else None
    for model, tool in sorted(set(measured) - used):
        print(f"warning: latency of {model}/{tool} matches no row of this run: not shown", file=sys.stderr)


def plot(rows: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "peers_time.svg").write_text(svg_time(rows) + "\n")
    (folder / "peers_error.svg").write_text(
        svg_per_model(rows, "error", "emulated relative error against fp32 (log scale)", log=True) + "\n"
    )
    (folder / "peers_casts.svg").write_text(svg_per_model(rows, "casts_added", "casts added", log=False) + "\n")


LOADS = {True: "yes", False: "NO", None: "-"}


def table(rows: list[dict]) -> str:
    floor = {r["model"]: r for r in rows if r["tool"] == "floor" and r["ok"]}
    devices = sorted({r["latency_device"] for r in rows if "latency_device" in r})
    lines = [
        "| model | nodes | tool | seconds | × floor | peak MB | checker | ORT loads | fp32-category ops in fp16 "
        "| casts added | emulated rel. error |" + (" latency ms | latency × fp32 |" if devices else ""),
        "|---|---:|---|---:|---:|---:|---|---|---:|---:|---:|" + ("---:|---:|" if devices else ""),
    ]
    for r in rows:
        if r["tool"] == "floor":
            continue
        if not r["ok"]:
            lines.append(
                f"| {r['model']} | {r['nodes']} | {r['tool']} | failed: {r['error']} | | | | | | | |"
                + (" | |" if devices else "")
            )
            continue
        base = floor.get(r["model"])
        ratio = f"{r['seconds'] / base['seconds']:.2f}" if base else "-"
        err = "-" if r.get("error") is None else f"{r['error']:.2e}"
        lines.append(
            f"| {r['model']} | {r['nodes']:,} | {r['tool']} | {r['seconds']:.2f} | {ratio} "
            f"| {r['peak_rss'] / 2**20:.0f} "
            f"| {'yes' if r['checker'] else 'NO'} | {LOADS[r['ort_loads']]} | {r['fp32_ops_in_fp16']} "
            f"| {r['casts_added']} | {err} |" + (_latency_cells(r) if devices else "")
        )
    totals = {}
    for r in rows:
        if r["tool"] != "floor":
            t = totals.setdefault(r["tool"], {"valid": 0, "models": 0, "violations": 0})
            t["models"] += 1
            if r["ok"] and r.get("checker") and r.get("ort_loads") is not False:
                t["valid"] += 1
            t["violations"] += r.get("fp32_ops_in_fp16", 0) if r["ok"] else 0
    lines += [
        "",
        "Valid: the output passes onnx.checker (full) and loads in ONNX Runtime (not tried above "
        f"{LARGE:,} nodes, marked -).",
        "",
        "| tool | valid outputs | fp32-category ops in fp16, all models |",
        "|---|---:|---:|",
    ]
    for tool, t in totals.items():
        lines.append(f"| {tool} | {t['valid']}/{t['models']} | {t['violations']} |")
    if devices:
        lines += ["", f"Latency: median ms per run on {'; '.join(devices)} (bench_latency.py); - where not measured."]
    return "\n".join(lines)


def _latency_cells(row: dict) -> str:
    if row.get("latency_ms") is None:
        return " - | - |" if "latency_device" not in row else " failed | - |"
    return f" {row['latency_ms']:.3f} | {row['latency_vs_fp32']:.2f} |"


if __name__ == "__main__":
    main()
