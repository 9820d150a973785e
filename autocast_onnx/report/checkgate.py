"""Stage: report. The verdict and one-screen summary of `autocast-onnx check`, with the
comparison against a baseline report (new findings, validation regressions)."""

from __future__ import annotations

from ..diagnostics import at_least
from ..errors import printable_lines


def compare_baseline(report: dict, prior: dict | None, after, fail_on: str) -> dict:
    """The gate's verdict. Without a baseline: fail on any finding of the converted model at or
    above `fail_on`, or on a failed validation. With one: fail only on findings whose (code,
    graph, node, tensor) the baseline does not have, and on outputs that passed there and fail now."""
    blocking = [d for d in after.diagnostics if at_least(d.severity, fail_on)]
    validation = report.get("validation")
    failed_outputs = [o["name"] for o in (validation or {}).get("outputs", []) if not o["passed"]]
    gate = {"baseline": prior is not None, "blocking_findings": len(blocking), "failed_outputs": failed_outputs}
    if prior is None:
        gate["new_findings"] = [d.as_dict() for d in blocking]
        gate["regressions"] = failed_outputs
    else:
        known = {
            (d["code"], d["graph"], d["node"] or "", d["tensor"] or "") for d in prior["lint_converted"]["diagnostics"]
        }
        gate["new_findings"] = [d.as_dict() for d in blocking if d.key() not in known]
        if prior.get("validation") is None:
            # the baseline did not validate: it says nothing about accuracy, so every failure counts
            gate["regressions"] = failed_outputs
        else:
            failed_before = {o["name"] for o in prior["validation"].get("outputs", []) if not o["passed"]}
            gate["regressions"] = [name for name in failed_outputs if name not in failed_before]
    gate["passed"] = not gate["new_findings"] and not gate["regressions"]
    return gate


def check_summary(report: dict) -> str:
    from .validation import quantized_lines

    lines = [f"check {report['model']}"]
    before = report["lint_original"]["summary"]
    mode = report["lint_original"]["models"][0]["mode"]
    label = "fp32 model, as if every float op were low precision" if mode == "prospective" else "model as given"
    lines.append(f"  lint ({label}): {before['error']} error, {before['warning']} warning, {before['info']} info")
    conv = report["conversion"]
    counts = ", ".join(f"{k} {v}" for k, v in conv["counts"].items() if v)
    # the report lists every plan warning's message; the flush notes (nothing to act on) are
    # counted apart, as convert's summary counts them
    notes = sum(1 for message in conv["warnings"] if _is_flush_note(message))
    said = f"{len(conv['warnings']) - notes} warning(s)" + (f", {notes} note(s)" if notes else "")
    lines.append(f"  convert to {conv['precision']}: {counts}; {conv['casts_added']} casts; {said}")
    after = report["lint_converted"]["summary"]
    lines.append(f"  lint (converted model): {after['error']} error, {after['warning']} warning, {after['info']} info")
    v = report.get("validation")
    if v is None:
        lines.append("  validate: skipped")
    else:
        worst = max(v["outputs"], key=lambda o: o["relative_error"])
        speed = f"; speed-up {v['speed']['speedup_p50']:.2f}x on {v['speed']['device']}" if v.get("speed") else ""
        lines.append(
            f"  validate ({v['numerics']} on {v['device']}): {'pass' if v['passed'] else 'FAIL'}; worst "
            f"relative error {worst['relative_error']:.3g} ({worst['name']}){speed}"
        )
        gen = v.get("generation")
        if gen:
            agree = ", ".join(f"{a}/{gen['tokens']}" for a in gen["agreeing_tokens"])
            lines.append(f"  greedy continuation: tokens agreeing before the first divergence {agree}")
        lines.extend(f"  {line}" for line in quantized_lines(v.get("quantized")))
    gate = report["gate"]
    for d in gate["new_findings"][:10]:
        lines.append(
            f"  {'new ' if gate['baseline'] else ''}finding {d['code']} {d['name']} at {d['node'] or '(model)'}: "
            f"{d['message']}"
        )
    for name in gate["regressions"]:
        lines.append(f"  {'regression' if gate['baseline'] else 'failed output'}: {name}")
    lines.append(
        "result: " + ("PASS" if gate["passed"] else "FAIL") + (" (against the baseline)" if gate["baseline"] else "")
    )
    return printable_lines(lines)


def _is_flush_note(message: str) -> bool:
    """Whether a plan warning's message is a flush note (summary.NOTE_CODES): a constant's own
    counts ('3 of 589824 nonzero values ...') and the node it was converted for."""
    from .summary import flushed_fraction

    return flushed_fraction(message) is not None and "; converted for " in message
