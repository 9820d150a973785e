"""Stage: report. Text and self-contained HTML for an error-attribution report
(validate/diagnose.py): per output, the nodes ranked by the error they introduce, and the error
along the graph depth (where it is born, how it grows)."""

from __future__ import annotations

import html
import json
import math

from ..errors import printable_lines


def diagnose_text(report: dict) -> str:
    nodes = {n["name"]: n for n in report["nodes"]}
    lines = [
        f"error attribution: {report.get('converted', '<converted>')} against {report.get('reference', '<reference>')}"
        f" (reasons from {report.get('reasons_from', 'the plan')})"
    ]
    for out, info in report["outputs"].items():
        lines.append(f"output {out}: relative error {info['error']:.3e}; nodes by the error they introduce:")
        head = f"  {'node':<36} {'op':<14} {'prec':<5} {'introduced':>10} {'received':>10} {'produced':>10}"
        lines.append(head + f" {'gain':>7}  why")
        for name in info["ranking"]:
            n = nodes[name]
            why = n["reason"] or n["category"] or ""
            gain = f"{n['amplification']:.3g}" if n["amplification"] is not None else "-"
            lines.append(
                f"  {name[-36:]:<36} {n['op_type'][:14]:<14} {n['precision']:<5} {n['introduced']:>10.3e} "
                f"{n['received']:>10.3e} {n['produced']:>10.3e} {gain:>7}  {why[:70]}"
            )
    return printable_lines(lines)


def _profile_svg(points: list, width: int = 640, height: int = 260) -> str:
    """log10(relative error) against graph depth."""
    pts = [(d, v) for d, v in points if v > 0 and math.isfinite(v)]
    if len(pts) < 2:
        return "<p>(too few points to plot)</p>"
    left, right, top, bottom = 60, 20, 10, 40
    x0, x1 = min(d for d, _ in pts), max(d for d, _ in pts)
    y0 = math.floor(min(math.log10(v) for _, v in pts))
    y1 = math.ceil(max(math.log10(v) for _, v in pts))
    y1 = max(y1, y0 + 1)

    def px(d):
        return left + (d - x0) / max(x1 - x0, 1) * (width - left - right)

    def py(v):
        return top + (y1 - math.log10(v)) / (y1 - y0) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for k in range(int(y0), int(y1) + 1):
        y = py(10.0**k)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">1e{k}</text>')
    line = " ".join(f"{px(d):.1f},{py(v):.1f}" for d, v in pts)
    parts.append(f'<polyline points="{line}" fill="none" stroke="#264653" stroke-width="1.5"/>')
    parts.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle" font-size="12">'
        "graph depth (longest path from the inputs)</text>"
    )
    parts.append(f'<text x="{left}" y="{height - 22}" font-size="11">{x0}</text>')
    parts.append(f'<text x="{width - right}" y="{height - 22}" text-anchor="end" font-size="11">{x1}</text>')
    parts.append("</svg>")
    return "".join(parts)


def diagnose_html(report: dict) -> str:
    esc = html.escape
    nodes = {n["name"]: n for n in report["nodes"]}
    body = [
        "<!doctype html><html><head><meta charset='utf-8'><title>autocast-onnx diagnose</title>",
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}"
        "td.n{text-align:right;font-family:monospace}</style></head><body>",
        f"<h1>Error attribution</h1><p>{esc(str(report.get('converted')))} against "
        f"{esc(str(report.get('reference')))}; reasons from {esc(str(report.get('reasons_from')))}.</p>",
    ]
    for out, info in report["outputs"].items():
        body.append(f"<h2>{esc(out)}: relative error {info['error']:.3e}</h2>")
        body.append("<p>Largest error produced at each graph depth, among the nodes this output depends on:</p>")
        body.append(_profile_svg(report["profiles"].get(out, [])))
        body.append("<table><tr><th>node</th><th>op</th><th>precision</th><th>introduced</th><th>received</th>"
                    "<th>produced</th><th>why</th></tr>")  # fmt: skip
        for name in info["ranking"]:
            n = nodes[name]
            body.append(
                f"<tr><td>{esc(name)}</td><td>{esc(n['op_type'])}</td><td>{esc(n['precision'])}</td>"
                f"<td class=n>{n['introduced']:.3e}</td><td class=n>{n['received']:.3e}</td>"
                f"<td class=n>{n['produced']:.3e}</td><td>{esc(n['reason'] or n['category'] or '')}</td></tr>"
            )
        body.append("</table>")
    body.append("<h2>All nodes</h2><pre>" + esc(json.dumps(report["nodes"], indent=1)) + "</pre></body></html>")
    return "\n".join(body)
