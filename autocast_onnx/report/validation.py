"""Stage: report. The terminal table and the JSON file of a validation report."""

from __future__ import annotations

import json

from ..errors import printable_lines


def _g(x, fmt=".3g"):
    return "-" if x is None else format(x, fmt)


def _fixed(gen: dict) -> str:
    """How a continuation fit a fixed sequence length, or nothing."""
    length = gen.get("fixed_length")
    return f", right-padded to the fixed length {length}" if length else ""


def _output_lines(o: dict, report: dict) -> list[str]:
    """One output's row of the table, then what qualifies it: a probability map's masks, the
    padded positions left out, the scale its relative error is measured against, its failures."""
    lines = [
        f"  {o['name'][:24]:<24} {_g(o['max_abs_error']):>10} {_g(o['relative_error']):>10} "
        f"{_g(o['mean_abs_error']):>10} {_g(o['cosine'], '.6f'):>10} {_g(o['top1'], '.3f'):>6} "
        f"{o['new_nan'] + o['new_inf']:>8}  {'pass' if o['passed'] else 'FAIL'}"
    ]
    m = o.get("map")
    if m:
        own = report["thresholds"].get("outputs", {}).get(o["name"], {})
        limit = own.get("min_iou", report["thresholds"].get("min_iou"))
        judged = f"judged by IoU >= min-iou {limit:g}" if limit is not None else "IoU informational (no min-iou)"
        lines.append(
            f"      probability map ({m['kind']}): IoU {m['iou']:.4f} of the masks at > {m['threshold']:g}, "
            f"{m['flipped']} of {m['pixels']} pixels flip ({100 * m['flipped_fraction']:.3g}%); {judged}"
        )
    padding = o.get("padding")
    if padding and padding["positions"]:
        lines.append(
            f"      padded positions not compared: {padding['positions']} ({padding['mask']} marks them padding; "
            "--compare-padded compares them)"
        )
    scale = o.get("relative_scale")
    if scale is not None and scale > o["max_abs_reference"] and o["max_abs_error"]:
        lines.append(
            f"      rel is max abs / {scale:.3g}, the low-precision resolution at 1: max |reference| "
            f"{o['max_abs_reference']:.3g} is below it"
        )
    lines.extend(f"      - {failure}" for failure in o["failures"])
    return lines


def _thresholds_line(t: dict) -> str:
    """The limits in force, then each output's own (`; prob_map: rtol 0.05`)."""
    text = "thresholds: " + ", ".join(
        f"{k.replace('_', '-')} {v:g}" for k, v in t.items() if v is not None and k != "outputs"
    )
    for name, own in t.get("outputs", {}).items():
        text += f"; {name}: " + ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in own.items())
    return text


def validation_text(report: dict) -> str:
    lines = []
    ref, conv = report["reference"], report["converted"]
    lines.append(f"validate: {ref['path'] or '<reference>'} vs {conv['path'] or '<converted>'}")
    numerics = {
        "emulate": "emulated fp16/bf16 rounding on CPU (see docs/validate.md)",
        "plain": "as ONNX Runtime runs it",
    }[report["numerics"]]
    lines.append(f"device: {report['device']}  numerics: {numerics}")
    if report.get("device_note"):
        lines.append(f"note: {report['device_note']}")
    inputs = report["inputs"]
    dims = ", ".join(f"{k}={v}{' (default)' if k in inputs['dim_defaults'] else ''}" for k, v in inputs["dims"].items())
    lines.append(f"inputs: {inputs['source']}, {inputs['batches']} batch(es)" + (f"; dims {dims}" if dims else ""))
    header = f"  {'output':<24} {'max abs':>10} {'rel':>10} {'mean abs':>10} {'cosine':>10} {'top1':>6} {'nan/inf':>8}  verdict"
    lines.append(header)
    for o in report["outputs"]:
        lines.extend(_output_lines(o, report))
    scored = [f"{o['name']} ({o['class_scores']})" for o in report["outputs"] if o.get("class_scores")]
    lines.append(
        "class scores (top-1 over the last axis): "
        + (", ".join(scored) if scored else "none")
        + ("" if scored else " (--class-output NAME scores one)")
    )
    lines.append(_thresholds_line(report["thresholds"]))
    if report.get("compare_padded"):
        lines.append("padded positions: compared too (--compare-padded)")
    gen = report.get("generation")
    if gen:
        agree = ", ".join(f"{a}/{gen['tokens']}" for a in gen["agreeing_tokens"])
        lines.append(
            f"greedy continuation ({gen['tokens']} tokens after {gen['prompts']} prompt(s) of {gen['prompt_length']}"
            f"{', with the KV cache' if gen['cache'] else ''}"
            f"{_fixed(gen)}): tokens agreeing before the first divergence {agree}"
            + (" (all agree)" if gen["all_agree"] else "")
        )
    if report.get("generation_skipped"):
        lines.append(report["generation_skipped"])
    speed = report.get("speed")
    if speed:
        r, c = speed["reference"], speed["converted"]
        lines.append(
            f"speed ({speed['device']}, batch {speed['batch_size']}, {r['iterations']} runs after "
            f"{r['warmup']} warm-up): reference p50 {r['p50_ms']:.3f} ms, converted p50 {c['p50_ms']:.3f} ms "
            f"-> speed-up {speed['speedup_p50']:.2f}x"
        )
        lines.append(
            f"  p90 {r['p90_ms']:.3f} / {c['p90_ms']:.3f} ms, min {r['min_ms']:.3f} / {c['min_ms']:.3f} ms, "
            f"throughput {r['throughput_per_s']:.1f} / {c['throughput_per_s']:.1f} per s"
        )
        if speed.get("note"):
            lines.append(f"  note: {speed['note']}")
    if report.get("speed_skipped"):
        lines.append(report["speed_skipped"])
    lines.extend(quantized_lines(report.get("quantized")))
    if report.get("size_ratio") is not None:
        lines.append(f"model size: {ref['bytes']} -> {conv['bytes']} bytes ({report['size_ratio']:.2f}x)")
    for warning in report.get("warnings", []):
        lines.append(f"warning: {warning}")
    if report.get("warnings") and report.get("strict"):
        lines.append("--strict: the warnings above fail the validation")
    lines.append("result: " + ("PASS" if report["passed"] else "FAIL"))
    return printable_lines(lines)


def _units_text(units: dict) -> str:
    """`37 (Add 3, Conv 9, ...)`: the ops that read every float input straight from DequantizeLinear."""
    listed = ", ".join(f"{op} {n}" for op, n in units["units"].items())
    return f"{sum(units['units'].values())}" + (f" ({listed})" if listed else "")


def _fused_text(ops: dict | None) -> str:
    if ops is None:
        return "not measured"
    listed = ", ".join(f"{op} {n}" for op, n in ops.items())
    return f"{sum(ops.values())}" + (f" ({listed})" if listed else "")


def quantized_lines(q: dict | None) -> list[str]:
    """The int8 lines of a report on a Q/DQ model (validate/fusion.py): the units that stay int8
    in the converted model against the reference, the Casts that break one, the scales' types,
    the int8 operators ONNX Runtime's CPU optimizer fuses in each, then the notes."""
    if not q:
        return []
    ref, conv, fusion = q["reference"], q["converted"], q["fusion"]
    scales = ", ".join(f"{t} {n}" for t, n in conv["scale_types"].items())
    lines = [
        f"int8 units: {_units_text(conv)} in the converted model, {_units_text(ref)} in the reference; "
        f"{len(conv['between'])} Cast(s) between a Q/DQ node and its op ({len(ref['between'])} in the reference); "
        f"Q/DQ scales {scales or 'none'}",
        f"  ONNX Runtime CPU int8 fusion ({fusion['level']}): converted {_fused_text(fusion['converted'])}, "
        f"reference {_fused_text(fusion['reference'])}",
    ]
    if conv.get("weight_only") or ref.get("weight_only"):
        listed = ", ".join(f"{op} {n}" for op, n in conv["weight_only"].items())
        lines.append(
            f"  weight-only quantized: {sum(conv['weight_only'].values())}{f' ({listed})' if listed else ''} "
            f"in the converted model, {sum(ref['weight_only'].values())} in the reference"
        )
    if fusion.get("note"):
        lines.append(f"  fusion not measured: {fusion['note']}")
    lines.extend(f"  note: {note}" for note in q["notes"])
    return lines


def validation_json(report: dict) -> str:
    return json.dumps(report, indent=1, allow_nan=False, default=float)
