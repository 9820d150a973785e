"""What `--opset N` does to the example and exported models: whether each upgrades cleanly from its
opset to 19 and 22 (ONNX's version converter, as `convert --opset` runs it), whether the upgraded
fp32 model computes what the original does (both run in ONNX Runtime on the same generated inputs,
as `autocast-onnx validate` generates them; the largest absolute difference over every output),
and what the upgrade gains: the share of the MatMul/Gemm/Conv work that runs in bf16 with and
without `--opset 22`, and how many BatchNormalization nodes convert with `--opset 15`. Prints
Markdown tables (docs/opset.md).

    python benchmarks/opset_upgrade.py
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path

import onnx
import onnx.numpy_helper

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.report.cost import conversion_cost
from autocast_onnx.rewrite.opset import default_opset, upgrade_opset
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.runner import ort

ROOT = Path(__file__).resolve().parent.parent
MODELS = (
    sorted((ROOT / "examples" / "models").glob("*.onnx"))
    + sorted((ROOT / "tests" / "data" / "evidence").glob("*.onnx"))
    + sorted((ROOT / "tests" / "data" / "decoders").glob("*.onnx"))
)
TARGETS = (19, 22)


def resnet_at_opset_11(folder: Path) -> Path:
    """resnet_tiny as an exporter at opset 11 writes it: the same graph declared at opset 11 (its
    ops mean the same there; Reshape's allowzero comes with opset 14 and is dropped, which changes
    nothing for a shape without a 0), so that BatchNormalization's opset-15 limit shows."""
    model = onnx.load(ROOT / "examples" / "models" / "resnet_tiny.onnx")
    shapes = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in shapes and 0 not in shapes[node.input[1]]:
            kept = [a for a in node.attribute if a.name != "allowzero"]
            del node.attribute[:]
            node.attribute.extend(kept)
    model.opset_import[0].version = 11
    onnx.checker.check_model(model, full_check=True)
    path = folder / "resnet_tiny_opset11.onnx"
    onnx.save(model, path)
    return path


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else f"{path.name} (resnet_tiny declared at 11)"


def upgraded(path: Path, opset: int) -> tuple[onnx.ModelProto | None, str]:
    """The model upgraded to `opset` (None and the refusal when the converter cannot)."""
    model = onnx.load(path)
    try:
        upgrade_opset(model, opset, str(path))
    except AutocastError as exc:
        return None, exc.what
    return model, "clean"


def largest_difference(path: Path, model: onnx.ModelProto) -> tuple[float, int]:
    """The largest absolute difference between the original's and the upgraded model's outputs
    (fp32 both) over two generated batches, and the number of outputs compared."""
    report = validate(path, model, ValidateOptions(batches=2, speed=False))
    return max(o["max_abs_error"] for o in report["outputs"]), len(report["outputs"])


def mac_share(result) -> str:
    """The share of the MatMul/Gemm/Conv multiply-accumulates in the low-precision type."""
    cost = conversion_cost(result.shapes, result.macs, result.nodes, result.stats.cast_outputs, result.plan.precisions)
    if not cost.get("macs"):
        return "-"
    return f"{100 * cost['macs_low_precision'] / cost['macs']:.1f} %"


def low_count(result, op: str) -> str:
    """How many `op` nodes the plan puts in the low-precision type, of all of them."""
    nodes = [n for n in result.plan.nodes if n.op_type == op]
    return f"{sum(1 for n in nodes if n.precision != 'fp32' and n.precision != 'unchanged')} of {len(nodes)}"


def upgrade_table() -> None:
    print("| model | opset | to 19 | max abs diff (fp32) | to 22 | max abs diff (fp32) | nodes before -> after 22 |")
    print("|---|---:|---|---:|---|---:|---|")
    for path in MODELS:
        cells = []
        before = onnx.load(path, load_external_data=False)
        after = None
        for opset in TARGETS:
            model, said = upgraded(path, opset)
            if model is None:
                cells += [said, "-"]
                continue
            diff, n = largest_difference(path, model)
            cells += [said, f"{diff:.3g} ({n} output{'s' if n > 1 else ''})"]
            after = model
        nodes = f"{len(before.graph.node)} -> {len(after.graph.node)}" if after is not None else "-"
        print(f"| {shown(path)} | {default_opset(before)} | " + " | ".join(cells) + f" | {nodes} |")


def gains_table() -> None:
    print("| model | opset | bf16 share of MACs | with --opset 22 | BatchNormalization low (fp16) | with --opset 15 |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in MODELS:
        model = onnx.load(path, load_external_data=False)
        has_conv = any(n.op_type == "Conv" for n in model.graph.node)
        has_bn = any(n.op_type == "BatchNormalization" for n in model.graph.node)
        if not (has_conv or has_bn):
            continue
        own = default_opset(model)
        bf16 = autocast_onnx.convert(path, precision="bf16") if own >= 13 else None  # no bf16 Cast before 13
        bf16_22 = autocast_onnx.convert(path, precision="bf16", opset=max(22, own))
        fp16 = autocast_onnx.convert(path, precision="fp16")
        fp16_15 = autocast_onnx.convert(path, precision="fp16", opset=max(15, own))
        bn = (low_count(fp16, "BatchNormalization"), low_count(fp16_15, "BatchNormalization")) if has_bn else ("-", "-")
        own_share = mac_share(bf16) if bf16 else "refused (no bf16 Cast)"
        print(f"| {shown(path)} | {own} | {own_share} | {mac_share(bf16_22)} | {bn[0]} | {bn[1]} |")


def main() -> None:
    print(
        f"onnx {onnx.__version__}, onnxruntime {ort().__version__}, autocast-onnx {autocast_onnx.__version__}, "
        f"{platform.processor() or platform.machine()}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        MODELS.append(resnet_at_opset_11(Path(tmp)))
        upgrade_table()
        print()
        gains_table()


if __name__ == "__main__":
    main()
