"""Evidence for the default rules: casts, cast traffic and emulated error per model for rule
variants, side by side in one run (the numbers behind docs/rules-evidence.md).

Each variant is a small rule file applied over the defaults. Error is the largest relative L2
error over a model's float outputs, of the emulated conversion (fp16 rounding as a GPU computes
it: fp32 inside each kernel, fp16 between kernels) against fp32, on generated inputs (seed 0);
the trained digits models (the example CNN, and a GELU MLP made by tools/export_gelu_mlp.py)
also report test accuracy on the digits test set. "nonfinite" counts new
inf/NaN values.

    python benchmarks/bench_rules.py [--variants default bn-low ln-low softmax-low erf-fp32 ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx

import autocast_onnx
from autocast_onnx.report.cost import conversion_cost
from autocast_onnx.validate.diagnose import relative_error
from autocast_onnx.validate.emulate import emulation_model
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["bert_tiny", "gpt2_tiny", "vit_tiny", "resnet_tiny", "digits_cnn", "digits_gelu_mlp", "text_detector"]
# trained models made for this evidence (tools/export_gelu_mlp.py, tools/export_text_detector.py);
# the others are the examples
EVIDENCE = {
    "digits_gelu_mlp": ROOT / "tests" / "data" / "evidence" / "digits_gelu_mlp.onnx",
    "text_detector": ROOT / "tests" / "data" / "evidence" / "text_detector.onnx",
}
VARIANTS = {
    "default": "",
    "before (bn-fp32, no head)": (
        '[ops.keep_fp32]\nBatchNormalization = "the default before the measured change"\n'
        '[settings]\noutput_head = "off"\n'
    ),
    "head-off": '[settings]\noutput_head = "off"\n',
    "bn-fp16-params": '[pins]\nBatchNormalization = { inputs = [], why = "parameters converted with the data" }\n',
    "ln-low": '[ops.follow]\nLayerNormalization = "fp16 data; ORT CUDA accumulates in fp32"\n',
    "softmax-low": '[ops.follow]\nSoftmax = "fp16 data; ORT CUDA accumulates in fp32"\n',
    "norms+softmax-low": (
        '[ops.follow]\nBatchNormalization = "fp16 data"\nLayerNormalization = "fp16 data"\nSoftmax = "fp16 data"\n'
    ),
    "erf-fp32": '[ops.keep_fp32]\nErf = "GELU chain in fp32"\n',
    "pow-low": '[ops.follow]\nPow = "tanh-GELU cube in fp16"\n',
    "sigmoid-tanh-fp32": '[ops.keep_fp32]\nSigmoid = "SiLU and gates in fp32"\nTanh = "tanh-GELU in fp32"\n',
}


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(name: str, model: onnx.ModelProto) -> dict:
    if name.startswith("digits"):
        data = np.load(ROOT / "examples" / "data" / "digits_test.npz")
        rank = len(model.graph.input[0].type.tensor_type.shape.dim)
        x = data["x"] if rank == 4 else data["x"].reshape(len(data["x"]), -1)
        return [{model.graph.input[0].name: x}]
    if name in EVIDENCE and EVIDENCE[name].with_suffix(".npz").is_file():
        data = np.load(EVIDENCE[name].with_suffix(".npz"))  # held-out images, one batch per row
        return [{k: data[k][i : i + 1] for k in data.files} for i in range(len(data[data.files[0]]))]
    return [generate(plan_inputs(describe_inputs(model)), seed=0)]


def measure(name: str, variant: str, rules_dir: Path) -> dict:
    source = onnx.load(str(EVIDENCE.get(name, ROOT / "examples" / "models" / f"{name}.onnx")))
    rules = []
    text = VARIANTS[variant]
    if text:
        path = rules_dir / f"{variant.replace(' ', '_').replace('(', '').replace(')', '')}.toml"
        path.write_text(text)
        rules = [path]
    result = autocast_onnx.convert(source, rules=rules)
    cost = conversion_cost(result.shapes, result.macs, result.nodes, result.stats.cast_outputs, result.plan.precisions)
    batches = _feeds(name, source)
    reference, emulated = _session(source), _session(emulation_model(result.model))
    error, max_abs, nonfinite = 0.0, 0.0, 0
    for feeds in batches:
        for r, g in zip(reference.run(None, feeds), emulated.run(None, feeds)):
            if r.dtype.kind == "f":
                error = max(error, relative_error(g.astype(np.float32), r))
                max_abs = max(max_abs, float(np.nanmax(np.abs(g.astype(np.float32) - r))))
                nonfinite += int((~np.isfinite(g)).sum() - (~np.isfinite(r)).sum())
    out = {
        "casts": result.stats.casts_added,
        "cast_bytes": cost.get("cast_bytes"),
        "low_macs": cost["macs_low_precision"] / cost["macs"] if cost.get("macs") else None,
        "fp32_nodes": sum(1 for p in result.plan.precisions if p == "fp32"),
        "nodes": len(result.plan.precisions),
        "error": error,
        "max_abs": max_abs,
        "nonfinite": nonfinite,
    }
    if name.startswith("digits"):
        labels = np.load(ROOT / "examples" / "data" / "digits_test.npz")["y"]
        got = emulated.run(None, batches[0])
        out["accuracy"] = float((got[0].argmax(1) == labels).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(
            "| model | variant | casts | cast bytes | fp32 nodes | low-precision MACs | rel. error | max abs "
            "| new inf/NaN | accuracy |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        totals: dict = {}
        for name in args.models:
            for variant in args.variants:
                m = measure(name, variant, Path(tmp))
                acc = f"{m['accuracy'] * 100:.2f}%" if "accuracy" in m else ""
                low = f"{m['low_macs'] * 100:.1f}%" if m["low_macs"] is not None else "n/a"
                print(
                    f"| {name} | {variant} | {m['casts']} | {m['cast_bytes']:,} | {m['fp32_nodes']}/{m['nodes']} | "
                    f"{low} | {m['error']:.2e} | {m['max_abs']:.2e} | {m['nonfinite']} | {acc} |"
                )
                t = totals.setdefault(variant, [0, 0.0])
                t[0] += m["casts"]
                t[1] = max(t[1], m["error"])
        print()
        print("| variant | casts, all models | ratio to default | worst rel. error |")
        print("|---|---:|---:|---:|")
        base = totals.get("default", [None])[0]
        for variant, (casts, worst) in totals.items():
            ratio = f"{casts / base:.2f}" if base else "n/a"
            print(f"| {variant} | {casts} | {ratio} | {worst:.2e} |")


if __name__ == "__main__":
    main()
