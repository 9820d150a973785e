"""Stage: report. A self-contained HTML page for a validation report: inline SVG charts (no
scripts, no external files) of per-output error, precision by op type, and latency."""

from __future__ import annotations

import html
import json
import math

COLORS = {"fp16": "#2a9d8f", "bf16": "#8ab17d", "fp32": "#e76f51", "none": "#bbbbbb", "unchanged": "#bbbbbb"}


def _esc(x) -> str:
    return html.escape(str(x))


def _bars(rows, width=640, bar_h=22, label_w=200, fmt="{:.3g}", threshold=None, log=False, unit=""):
    """Horizontal bar chart. rows: (label, value, colour)."""
    if not rows:
        return "<p>(nothing to plot)</p>"
    values = [max(v, 1e-12) if log else v for _, v, _ in rows]
    top = max(values + ([threshold] if threshold else []))
    low = min(values + ([threshold] if threshold else [])) if log else 0.0

    def x(v):
        if log:
            lo, hi = math.log10(low) - 0.5, math.log10(top) + 0.1
            return label_w + (math.log10(max(v, 1e-12)) - lo) / (hi - lo) * (width - label_w - 80)
        return label_w + (v / top if top else 0) * (width - label_w - 80)

    h = bar_h * len(rows) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img">']
    for i, (label, value, colour) in enumerate(rows):
        y = 10 + i * bar_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h * 0.65:.1f}" text-anchor="end" font-size="12">{_esc(label[:30])}</text>'
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 3}" width="{max(1.0, x(value) - label_w):.1f}" height="{bar_h - 6}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{x(value) + 4:.1f}" y="{y + bar_h * 0.65:.1f}" font-size="11">{_esc(fmt.format(value))}{unit}</text>'
        )
    if threshold:
        tx = x(threshold)
        parts.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="5" y2="{h - 18}" stroke="#444" stroke-dasharray="4 3"/>')
        parts.append(
            f'<text x="{tx:.1f}" y="{h - 5}" font-size="11" text-anchor="middle">threshold {threshold:g}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _stacked(rows, width=640, bar_h=20, label_w=200):
    """Stacked horizontal bars: rows of (label, {kind: count})."""
    if not rows:
        return "<p>(nothing to plot)</p>"
    top = max(sum(c.values()) for _, c in rows)
    h = bar_h * len(rows) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img">']
    for i, (label, counts) in enumerate(rows):
        y = 10 + i * bar_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h * 0.7:.1f}" text-anchor="end" font-size="12">{_esc(label)}</text>'
        )
        x = label_w
        for kind in ("fp16", "bf16", "fp32", "none"):
            n = counts.get(kind, 0)
            if not n:
                continue
            w = n / top * (width - label_w - 60)
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{bar_h - 4}" fill="{COLORS[kind]}">'
                f"<title>{_esc(label)}: {n} {kind}</title></rect>"
            )
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + bar_h * 0.7:.1f}" font-size="11">{sum(counts.values())}</text>')
    legend_y = h - 12
    lx = label_w
    for kind in ("fp16", "bf16", "fp32", "none"):
        parts.append(
            f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{COLORS[kind]}"/>'
            f'<text x="{lx + 14}" y="{legend_y}" font-size="11">{kind}</text>'
        )
        lx += 70
    parts.append("</svg>")
    return "".join(parts)


def failed_metrics(o: dict, t: dict) -> set[str]:
    """The metrics of one output's summary that failed their thresholds (what the report colours):
    its own thresholds where it has them (`thresholds.outputs`); a probability map judged by IoU
    answers to atol, rtol and min-cosine only where it sets them itself (metrics.verdict)."""
    own = t.get("outputs", {}).get(o["name"], {})
    t = {**t, **own}
    as_map = o.get("map") is not None and t.get("min_iou") is not None
    raw = {k for k in ("atol", "rtol", "min_cosine") if not as_map or k in own}
    out = set()
    if o["new_nan"] or o["new_inf"]:
        out.add("nonfinite")
    if as_map and o["map"]["iou"] < t["min_iou"]:
        out.add("iou")
    if "atol" in raw and t.get("atol") is not None and o["max_abs_error"] > t["atol"]:
        out.add("max_abs")
    if "rtol" in raw and t.get("rtol") is not None and o["relative_error"] > t["rtol"]:
        out.add("relative")
    if "min_cosine" in raw and t.get("min_cosine") is not None and o["cosine"] < t["min_cosine"]:
        out.add("cosine")
    if t.get("min_top1") is not None and o["top1"] is not None and o["top1"] < t["min_top1"]:
        out.add("top1")
    return out


def _quantized_html(quantized: dict | None) -> str:
    """The int8 lines of a Q/DQ model's report (report/validation.py), or nothing."""
    from .validation import quantized_lines

    lines = quantized_lines(quantized)
    return f"<h2>Int8 units (Q/DQ)</h2>\n<pre>{_esc(chr(10).join(lines))}</pre>" if lines else ""


def validation_html(report: dict) -> str:
    outputs = report["outputs"]
    t = report["thresholds"]
    bad = [failed_metrics(o, t) for o in outputs]
    ok_colour, bad_colour = "#2a9d8f", "#e63946"
    err_rows = [
        (o["name"], o["relative_error"], bad_colour if "relative" in b else ok_colour) for o, b in zip(outputs, bad)
    ]
    cos_rows = [
        (o["name"], max(1e-12, 1.0 - o["cosine"]), bad_colour if "cosine" in b else ok_colour)
        for o, b in zip(outputs, bad)
    ]
    ops = sorted(report.get("precision_by_op", {}).items(), key=lambda kv: -sum(kv[1].values()))
    prec = _stacked(ops[:40])
    speed = report.get("speed")
    speed_html = f"<p>{_esc(report.get('speed_skipped') or 'Speed was not measured (--no-speed).')}</p>"
    if speed:
        r, c = speed["reference"], speed["converted"]
        speed_html = _bars(
            [
                ("reference p50", r["p50_ms"], "#8d99ae"),
                ("converted p50", c["p50_ms"], "#2a9d8f"),
                ("reference p90", r["p90_ms"], "#c0c7d3"),
                ("converted p90", c["p90_ms"], "#8fd1c8"),
                ("reference min", r["min_ms"], "#dde1e8"),
                ("converted min", c["min_ms"], "#c4e8e3"),
            ],
            fmt="{:.3f}",
            unit=" ms",
        )
        speed_html += (
            f"<p>Speed-up (p50): <b>{speed['speedup_p50']:.2f}×</b> on {_esc(speed['device'])}, batch "
            f"{speed['batch_size']}, {r['iterations']} runs after {r['warmup']} warm-up.</p>"
        )
        if speed.get("note"):
            speed_html += f"<p class=note>{_esc(speed['note'])}</p>"

    def cell(text: str, failed: bool) -> str:
        return f"<td class=fail>{text}</td>" if failed else f"<td>{text}</td>"

    row_list = []
    for o, b in zip(outputs, bad):
        top1 = "-" if o["top1"] is None else format(o["top1"], ".4f")
        verdict_text = "pass" if o["passed"] else "FAIL: " + _esc("; ".join(o["failures"]))
        row_list.append(
            f"<tr><td>{_esc(o['name'])}</td>"
            + cell(format(o["max_abs_error"], ".4g"), "max_abs" in b)
            + cell(format(o["relative_error"], ".4g"), "relative" in b)
            + f"<td>{o['mean_abs_error']:.4g}</td>"
            + cell(format(o["cosine"], ".6f"), "cosine" in b)
            + cell(top1, "top1" in b)
            + cell(f"{o['new_nan']}/{o['new_inf']}", "nonfinite" in b)
            + cell(verdict_text, not o["passed"])
            + "</tr>"
        )
    rows = "".join(row_list)
    warnings = "".join(f"<p class=warn>warning: {_esc(w)}</p>" for w in report.get("warnings", []))
    verdict = "PASS" if report["passed"] else "FAIL"
    numerics = (
        "emulated low-precision rounding on CPU" if report["numerics"] == "emulate" else "as ONNX Runtime runs it"
    )
    dims = ", ".join(f"{k}={v}" for k, v in report["inputs"]["dims"].items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autocast-onnx validation: {verdict}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }}
h1 span.pass {{ color: #2a9d8f; }} h1 span.fail {{ color: #e63946; }}
table {{ border-collapse: collapse; margin: 1em 0; }} td, th {{ border: 1px solid #ddd; padding: 4px 8px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} td.fail {{ background: #fde8e8; color: #b00020; }}
.warn {{ color: #8a5a00; background: #fff4d6; padding: 4px 8px; }}
.note {{ color: #666; font-size: 0.9em; }}
</style></head><body>
<h1>Validation: <span class="{verdict.lower()}">{verdict}</span></h1>
<p>Reference <code>{_esc(report["reference"]["path"] or "<in memory>")}</code>, converted
<code>{_esc(report["converted"]["path"] or "<in memory>")}</code>. Device {_esc(report["device"])}; numerics:
{numerics}. Inputs: {_esc(report["inputs"]["source"])}, {report["inputs"]["batches"]} batch(es){"; " + _esc(dims) if dims else ""}.</p>
{f"<p class=note>{_esc(report['device_note'])}</p>" if report.get("device_note") else ""}
{warnings}
<h2>Per-output error</h2>
<table><tr><th>output</th><th>max abs</th><th>relative</th><th>mean abs</th><th>cosine</th><th>top-1</th><th>new NaN/inf</th><th>verdict</th></tr>{rows}</table>
<h3>Relative error (max |error| / max |reference|, log scale)</h3>
{_bars(err_rows, threshold=t.get("rtol"), log=True)}
<h3>1 − cosine similarity (log scale)</h3>
{_bars(cos_rows, threshold=(1 - t["min_cosine"]) if t.get("min_cosine") is not None else None, log=True)}
<h2>Precision by op type (converted model)</h2>
{prec}
{_quantized_html(report.get("quantized"))}
<h2>Latency</h2>
{speed_html}
<h2>Raw report</h2>
<details><summary>JSON</summary><pre>{_esc(json.dumps(report, indent=1, default=float))}</pre></details>
</body></html>
"""
