"""Stage: report. Text, JSON and SARIF 2.1.0 for lint results, and the rules catalog (text,
Markdown). All read the same Diagnostic list."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._version import __version__
from ..diagnostics import SEVERITIES
from ..errors import AutocastError, one_line, printable_lines
from ..rewrite.provenance import describe as describe_provenance
from .catalog import load_checks

SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
LINT_SCHEMA_VERSION = 1


def counts(diagnostics) -> dict:
    c = Counter(d.severity for d in diagnostics)
    return {s: c.get(s, 0) for s in reversed(SEVERITIES)}


SEVERITY_COLOUR = {"error": "red", "warning": "yellow", "info": "blue"}


def lint_text(results, show_protected: bool = True, colour: bool = False, verbose: bool = False, rules=()) -> str:
    """Findings grouped by code, each with node, op type and message, then the check's fix hint.
    A group's header gives the severities its findings have. Unless `show_protected`, the info
    findings the conversion rules protect (fp32 models) are counted in one line, not listed.
    Unless `verbose`, weights-flush findings under the conversion rules' max_flush_fraction
    (`rules`: the user's rule files over the default profile), which the converter converts
    as they are, are counted in one line, as convert's summary counts its flush notes."""
    import click

    def sev(word: str) -> str:
        return click.style(word, fg=SEVERITY_COLOUR[word], bold=word == "error") if colour else word

    checks = {c.code: c for c in load_checks()}
    lines = []
    order = {c.code: k for k, c in enumerate(checks.values())}
    diagnostics = [d for r in results for d in r.diagnostics]
    hidden = [] if show_protected else [d for d in diagnostics if d.protected and d.severity == "info"]
    hidden_ids = {id(d) for d in hidden}
    by_code: dict[str, list] = {}
    for d in sorted(diagnostics, key=lambda d: order.get(d.code, 999)):
        if id(d) not in hidden_ids:
            by_code.setdefault(d.code, []).append(d)
    for code, group in by_code.items():
        check = checks[code]
        found = [x for x in reversed(SEVERITIES) if any(d.severity == x for d in group)]
        lines.append(f"{code} {check.name} [{', '.join(sev(x) for x in found)}]: {check.summary}")
        notes = [] if verbose or check.kind != "weights-flush" else _flush_notes(group, rules)
        note_ids = {id(d) for d in notes}
        for d in (d for d in group if id(d) not in note_ids):
            # the names and the message come from the model: escaped here, before the colours
            where = one_line(f"{d.model}: ") if len(results) > 1 and d.model else ""
            node = one_line(d.node or "(model)")
            graph = "" if d.graph == "main" else one_line(f" in {d.graph}")
            mark = f" [{sev(d.severity)}]" if len(found) > 1 else ""
            lines.append(f"  {where}{node}{graph} ({one_line(d.op_type or '-')}){mark}: {one_line(d.message)}")
        if notes:
            lines.append(_flush_notes_line(notes, rules, len(notes) < len(group)))
        lines.append(f"  fix: {check.fix}")
        lines.append("")
    if hidden:
        lines.append(
            f"{len(hidden)} finding(s) the conversion rules protect (info, not listed; --show-protected to list)"
        )
    total = counts(diagnostics)
    suppressed = sum(r.suppressed for r in results)
    for r in results:
        mode = (
            "as converted" if r.mode == "actual" else f"fp32 model, checked as if every float op ran in {r.precision}"
        )
        lines.append(one_line(f"{r.model or '<model>'}: {len(r.diagnostics)} finding(s) ({mode})"))
        if r.provenance is not None:
            lines.append(one_line(describe_provenance(r.model or "<model>", r.provenance, r.provenance_unreadable)))
        # the provenance line says its own problems; the rest of the model's warnings here
        lines.extend(one_line(f"  warning: {w}") for w in r.warnings if not w.startswith("the provenance record"))
    lines.append(
        f"{len(diagnostics)} finding(s): {sev('error')} {total['error']}, {sev('warning')} {total['warning']}, "
        f"{sev('info')} {total['info']}; {suppressed} suppressed"
        if colour
        else f"{len(diagnostics)} finding(s): {total['error']} error, {total['warning']} warning, "
        f"{total['info']} info; {suppressed} suppressed"
    )
    return "\n".join(lines)


def _flush_threshold(rules) -> float:
    """max_flush_fraction of the conversion rules (the default profile, then `rules`)."""
    from ..catalog import load_rules

    return float(load_rules(list(rules)).thresholds["max_flush_fraction"])


def _flush_notes(group: list, rules) -> list:
    """The weights-flush findings that need no action: a fraction of flushing values at most the
    conversion rules' max_flush_fraction (the converter converts such a constant and says so in
    one note), and not raised to an error by the configuration."""
    limit = _flush_threshold(rules)
    return [d for d in group if d.severity != "error" and d.value is not None and d.value <= limit]


def _flush_notes_line(notes: list, rules, more: bool) -> str:
    """One line for the flush findings that need no action: how many, the worst fraction."""
    worst = max(float(d.value) for d in notes)
    limit = _flush_threshold(rules)
    return (
        f"  {len(notes)}{' more' if more else ''} constant(s) with a few values that flush to zero, each under "
        f"max_flush_fraction ({limit:g}), worst {worst * 100:.2g}% of a tensor's nonzero values: the converter "
        "converts them (-v or --format json lists them)"
    )


def lint_statistics(results, fmt: str = "text") -> str:
    """Findings counted per check (most first), by severity: `lint --statistics`."""
    checks = {c.code: c for c in load_checks()}
    per: dict[str, Counter] = {}
    for r in results:
        for d in r.diagnostics:
            per.setdefault(d.code, Counter())[d.severity] += 1
    rows = sorted(per.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    if fmt != "text":
        return json.dumps(
            [
                {"code": code, "name": checks[code].name, "count": sum(c.values()), "by_severity": dict(c)}
                for code, c in rows
            ],
            indent=1,
        )
    lines = [
        f"{sum(c.values()):>6}  {code:<6} {checks[code].name:<40} "
        + ", ".join(f"{n} {x}" for x in reversed(SEVERITIES) for n in [c.get(x, 0)] if n)
        for code, c in rows
    ]
    total = sum(sum(c.values()) for _, c in rows)
    lines.append(f"{total:>6}  finding(s) in {len(results)} model(s)")
    return printable_lines(lines)


def lint_dict(results) -> dict:
    diagnostics = [d for r in results for d in r.diagnostics]
    return {
        "schema_version": LINT_SCHEMA_VERSION,
        "tool": {"name": "autocast-onnx", "version": __version__},
        "models": [
            {
                "path": r.model,
                "mode": r.mode,
                "precision": r.precision,
                "checks": r.checks,
                "findings": len(r.diagnostics),
                "suppressed": r.suppressed,
                "provenance": r.provenance,
                "warnings": r.warnings,
            }
            for r in results
        ],
        "summary": counts(diagnostics),
        "diagnostics": [d.as_dict() for d in diagnostics],
    }


def lint_json(results) -> str:
    return json.dumps(lint_dict(results), indent=1, default=float, allow_nan=False)


SRCROOT = "%SRCROOT%"  # the uriBaseId of locations inside the model's repository
FINGERPRINT_KEY = "autocastFinding/v1"  # partialFingerprints key; a new version if the hash's inputs change
DOCS_URL_ENV = "AUTOCAST_ONNX_DOCS_URL"  # absolute URL of autocast-onnx's docs/ folder, for the rules' helpUri


def source_root(models) -> Path:
    """The folder SARIF locations are relative to: the top level of the repository holding the
    first of `models` that is in one, else the current folder. The top level is the nearest
    folder above the model with a `.git` folder, or a `.git` file (a worktree's); a submodule's
    checkout is part of its superproject's tree, so a model in a submodule counts for the
    superproject (code scanning shows findings on the repository's own paths). Found without
    running git, so it works where git is not installed."""
    for model in models:
        found = _checkout_top(Path(os.path.abspath(model))) if model else None
        if found is not None:
            return found
    return Path.cwd()


def _checkout_top(path: Path) -> Path | None:
    """The top level of the checkout holding `path`, past submodules; None outside any."""
    for folder in path.parents:
        marker = folder / ".git"
        if marker.is_dir() or (marker.exists() and not _superproject(folder, marker)):
            return folder
        if marker.exists():  # a submodule: the superproject's top level is further up
            return _checkout_top(folder)
    return None


def _superproject(folder: Path, marker: Path) -> Path | None:
    """The superproject of the submodule checked out at `folder`, whose `.git` file `marker`
    names its git folder (`gitdir: SUPER/.git/modules/NAME`); None when `marker` is not a
    submodule's (a worktree's names SUPER/.git/worktrees/NAME) or cannot be read."""
    try:
        text = marker.read_text(encoding="utf-8", errors="surrogateescape")[:4096]
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(os.path.abspath(folder / text[len("gitdir:") :].strip()))
    parts = gitdir.parts
    for k in range(len(parts) - 1, 0, -1):
        if parts[k] == "modules" and parts[k - 1] == ".git":
            superproject = Path(*parts[: k - 1])
            return superproject if folder.is_relative_to(superproject) else None
    return None


def _model_location(model: str | None, root: Path) -> tuple[dict, str]:
    """The artifactLocation of a model and the path its fingerprint uses: relative to `root`
    (uriBaseId %SRCROOT%, percent-encoded) when the model is under it, else its absolute file URI."""
    if not model:
        return {"uri": "model.onnx"}, "model.onnx"
    path = Path(os.path.abspath(model))
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        return {"uri": path.as_uri()}, path.as_posix()
    # a file name that is not UTF-8 (undecodable bytes kept as surrogates) is percent-encoded
    # byte by byte, as Path.as_uri does
    return {"uri": quote(os.fsencode(relative)), "uriBaseId": SRCROOT}, relative


def fingerprint(d, path: str) -> str:
    """A finding's identity across runs and machines: the check, the model's path in its
    repository, the graph, the node, its op type and the tensor. Not the message (its measured
    value may change while the finding stays), not absolute paths, times or positions."""
    parts = (d.code, path, d.graph, d.node or "", d.op_type or "", d.tensor or "")
    # surrogateescape: a path's undecodable bytes hash as the bytes they are (UTF-8 text as before)
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _docs_url() -> str | None:
    """The absolute URL of the docs/ folder from AUTOCAST_ONNX_DOCS_URL (the GitHub Action sets
    it to the action's own revision), with a trailing slash; None when unset. SARIF requires an
    absolute helpUri and code scanning rejects a file with a relative one, so there is no
    relative fallback: without the variable the rules have no helpUri and their help text names
    the section of docs/rules.md."""
    url = os.environ.get(DOCS_URL_ENV, "").strip()
    if not url:
        return None
    if not re.fullmatch(r"https?://[^\s/]+/\S*", url):
        raise AutocastError(
            f"{url!r} is not an absolute http(s) URL",
            DOCS_URL_ENV,
            "set it to the URL of autocast-onnx's docs/ folder, e.g. "
            "https://github.com/OWNER/autocast-onnx/blob/REF/docs/, or unset it",
        )
    return url if url.endswith("/") else url + "/"


def _sarif_rule(c, docs: str | None) -> dict:
    """One check as a SARIF reportingDescriptor, linked to its section of docs/rules.md."""
    anchor = f"rules.md#{c.code.lower()}-{c.name}"
    rule = {
        "id": c.code,
        "name": c.name,
        "shortDescription": {"text": c.summary},
        "fullDescription": {"text": " ".join(c.why.split())},
        "help": {"text": f"{c.fix} (autocast-onnx docs/{anchor})"},
        "defaultConfiguration": {"level": SARIF_LEVEL[c.severity]},
        "properties": {"kind": c.kind},
    }
    if docs is not None:
        rule["helpUri"] = docs + anchor
    return rule


def _sarif_result(d, index: dict, location: dict, path: str) -> dict:
    """One finding as a SARIF result: the model file, the node as its logical location, the
    finding's data as properties, and its fingerprint."""
    located: dict[str, Any] = {"physicalLocation": {"artifactLocation": location}}
    if d.node is not None:
        located["logicalLocations"] = [{"name": d.node, "fullyQualifiedName": f"{d.graph}::{d.node}", "kind": "object"}]
    value = d.as_dict()["value"]
    properties = {
        k: v
        for k, v in (
            ("opType", d.op_type),
            ("graph", d.graph),
            ("nodeIndex", d.node_index),
            ("tensor", d.tensor),
            ("value", value),
            ("protected", d.protected),
        )
        if v is not None
    }
    result = {
        "ruleId": d.code,
        "ruleIndex": index[d.code],
        "level": SARIF_LEVEL[d.severity],
        "message": {"text": d.message},
        "locations": [located],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint(d, path)},
    }
    if properties:
        result["properties"] = properties
    return result


def sarif_dict(diagnostics, root: Path | None = None) -> dict:
    """SARIF 2.1.0 that code scanning maps: every check as a rule, every finding as a result whose
    location is relative to `root` (default: source_root of the findings' models), with
    run.originalUriBaseIds saying where that is, and a fingerprint that tracks the finding from
    run to run."""
    diagnostics = list(diagnostics)
    checks = list(load_checks())
    index = {c.code: k for k, c in enumerate(checks)}
    docs = _docs_url()
    if root is None:
        root = source_root(dict.fromkeys(d.model for d in diagnostics))
    artifacts: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    results = []
    for d in diagnostics:
        location, path = _model_location(d.model, root)
        if location["uri"] not in seen:
            seen[location["uri"]] = len(artifacts)
            artifacts.append({"location": dict(location)})
        results.append(_sarif_result(d, index, {**location, "index": seen[location["uri"]]}, path))
    rules = [_sarif_rule(c, docs) for c in checks]
    run: dict[str, Any] = {"tool": {"driver": {"name": "autocast-onnx", "version": __version__, "rules": rules}}}
    if any("uriBaseId" in a["location"] for a in artifacts):
        base = root.absolute().as_uri()
        run["originalUriBaseIds"] = {SRCROOT: {"uri": base if base.endswith("/") else base + "/"}}
    run["artifacts"] = artifacts
    run["results"] = results
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0", "runs": [run]}


def sarif_json(diagnostics, root: Path | None = None) -> str:
    return json.dumps(sarif_dict(diagnostics, root), indent=1, default=float, allow_nan=False)


def rules_text() -> str:
    lines = []
    for c in load_checks():
        lines.append(f"{c.code}  {c.name:<34} {c.severity:<8} {c.summary}")
    return "\n".join(lines)


def rule_text(c) -> str:
    """One check in full, for `autocast-onnx rules CODE`."""
    import textwrap

    out = [f"{c.code} {c.name} [{c.severity}]: {c.summary}", ""]
    out += textwrap.wrap("Why: " + " ".join(c.why.split()), 100)
    out += [""] + textwrap.wrap("Fix: " + c.fix, 100)
    if c.example:
        out += ["", "Example:", f"    {c.example}"]
    return "\n".join(out)


def rules_markdown(only=None) -> str:
    """docs/rules.md, generated from rules/lint.toml (`only`: these checks, for `rules CODE`)."""
    out = [
        "# Lint checks",
        "",
        "Generated from [`rules/lint.toml`](../rules/lint.toml) by "
        "`autocast-onnx rules --format markdown > docs/rules.md`; do not edit by hand.",
        "",
        "Select or ignore checks by code, code prefix or name (`--select AC1 --ignore AC402`), in the "
        "configuration (`select`, `ignore`, `fail-on`, `suppress`) or per node with the metadata key "
        "`autocast-onnx:ignore` (a comma-separated list of codes). Exit codes: 0 no finding at or above "
        "`--fail-on` (default error), 1 findings, 2 usage or input error.",
        "",
        "| code | name | severity | summary |",
        "|---|---|---|---|",
    ]
    checks = list(only) if only is not None else load_checks()
    for c in checks:
        out.append(f"| [{c.code}](#{c.code.lower()}-{c.name}) | {c.name} | {c.severity} | {c.summary} |")
    for c in checks:
        out += [
            "",
            f"## {c.code} {c.name}",
            "",
            f"**{c.summary}.** Severity: {c.severity}.",
            "",
            "Why is this bad? " + " ".join(c.why.split()),
            "",
            f"How to fix it: {c.fix}",
        ]
        if c.example:
            out += ["", "Example:", "", f"    {c.example}"]
    return "\n".join(out) + "\n"
