"""Stage: lint. Runs the selected checks over a model, applies suppressions (by node-name
regex from the configuration, and by node metadata), reports unused suppressions, and returns
the diagnostics sorted by code and position."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from ..diagnostics import Diagnostic, at_least
from ..errors import AutocastError
from ..graph.sanity import load_checked
from ..io import LoadedModel
from ..patterns import UserPattern, shown
from ..rewrite.provenance import examine as examine_provenance
from .catalog import load_checks
from .checks import KINDS, LintContext, report

METADATA_KEY = "autocast-onnx:ignore"


@dataclass
class Suppression:
    code: str  # code or prefix ("AC1", "AC101", "all")
    node: str  # regex on node names
    source: str  # where it was declared
    used: int = 0

    # the node regex, compiled at first use for bounded matching (patterns.py); not copied by replace()
    pattern: UserPattern | None = field(default=None, init=False, repr=False, compare=False)

    def matches(self, diag: Diagnostic) -> bool:
        if not _code_matches(diag.code, diag.name, self.code):
            return False
        if diag.node is None:
            return False
        if self.pattern is None:
            self.pattern = UserPattern(self.node, f"{self.source} suppression of {self.code!r}")
        return self.pattern.search(diag.node)


@dataclass(frozen=True)
class LintOptions:
    select: list = field(default_factory=lambda: ["AC"])
    ignore: list = field(default_factory=list)
    fail_on: str = "error"
    precision: str | None = None  # for fp32 models: which low type to assume (default fp16)
    report_unused_config: bool = True  # AC901 for configuration suppressions (off when the caller
    # lints several models and reports them once)
    suppress: list = field(default_factory=list)  # Suppression entries from the configuration
    rules: list = field(default_factory=list)  # conversion rule files (decide "protected")
    plan: object = None  # plan.options.PlanOptions: selections that decide "protected"


@dataclass
class LintResult:
    model: str | None
    mode: str  # "actual" or "prospective"
    precision: str
    diagnostics: list
    checks: list  # codes that ran
    suppressed: int = 0
    config_suppression_use: list = field(default_factory=list)  # per options.suppress entry
    # how autocast-onnx converted the model, from its metadata (rewrite/provenance.py); None: no record
    provenance: dict | None = None
    # what of that record cannot be read, one phrase each (the text report warns of it)
    provenance_unreadable: list = field(default_factory=list)
    # what the run could not do or check, of the model as a whole (no finding of a check): the
    # --opset upgrade's comparison that could not be made, what of the model it could not carry
    # over; the text and JSON reports list them
    warnings: list[str] = field(default_factory=list)

    def failed(self, fail_on: str) -> bool:
        return any(at_least(d.severity, fail_on) for d in self.diagnostics)


def _code_matches(code: str, name: str, selector: str) -> bool:
    return selector in ("all", "ALL") or code.startswith(selector) or name == selector


def selected(checks, select, ignore):
    for selector in list(select) + list(ignore):
        if not any(_code_matches(c.code, c.name, selector) for c in checks):
            raise AutocastError(
                f"'{selector}' selects no check", "--select/--ignore", "see `autocast-onnx rules` for the codes"
            )
    return [
        c
        for c in checks
        if any(_code_matches(c.code, c.name, s) for s in select)
        and not any(_code_matches(c.code, c.name, s) for s in ignore)
    ]


def _metadata_suppressions(ctx) -> list:
    found = []
    for node in ctx.index.nodes:
        for prop in node.proto.metadata_props:
            if prop.key == METADATA_KEY:
                for code in [c.strip() for c in prop.value.split(",") if c.strip()]:
                    found.append(
                        Suppression(
                            code=code, node=f"^{re.escape(node.label)}$", source=f"metadata of node {node.label}"
                        )
                    )
    return found


def unused_config_suppressions(results, options) -> list:
    """AC901 findings for configuration suppressions that matched nothing in any of `results`."""
    checks = [c for c in selected(load_checks(), options.select, options.ignore) if c.kind == "unused-suppression"]
    if not checks:
        return []
    check = checks[0]
    out = []
    for k, s in enumerate(options.suppress):
        if not any(r.config_suppression_use[k] for r in results):
            message = (
                f"suppression of {s.code} for nodes matching {s.node!r} ({s.source}) "
                f"matched no finding in {len(results)} model(s)"
            )
            out.append(report(check, message))
    return out


def _upgraded(proto: onnx.ModelProto, given: bool, path: str | None, base, options: LintOptions):
    """(the model to lint, the plan options to lint it with, the upgrade or None): with --opset,
    the model upgraded as the conversion would plan it (a copy of a model the caller gave), checked
    against the original by the upgrade (rewrite/opset.py), and the plan options without the opset."""
    from ..plan.options import PlanOptions

    plan_options = options.plan
    if not isinstance(plan_options, PlanOptions) or plan_options.opset is None:
        return proto, plan_options, None
    from onnx import TensorProto

    from ..rewrite.opset import upgrade_opset

    proto = onnx.ModelProto.FromString(proto.SerializeToString()) if given else proto
    precision = options.precision or plan_options.target.value
    low = TensorProto.BFLOAT16 if precision == "bf16" else TensorProto.FLOAT16
    where = path or "<model>"
    change = upgrade_opset(proto, plan_options.opset, where, runtime=plan_options.runtime, low_type=low, base_dir=base)
    return proto, replace(plan_options, opset=None), change


def _upgrade_findings(warnings, ctx, check, path: str | None) -> list[Diagnostic]:
    """The upgrade's warnings of an upgraded node the runtime cannot run, as findings of the
    runtime-kernel check (AC404) on the node, so that suppressions apply to them."""
    if check.kind != "runtime-kernel" or not warnings:
        return []
    named = {n.name: n for n in ctx.index.nodes if n.name}
    return [
        report(check, f"--opset upgrade: {w.message}", node=named.get(w.node), model=path)
        for w in warnings
        if w.kind == "kernel"
    ]


def lint(model, options: LintOptions | None = None) -> LintResult:
    """Lint a model (a path, a ModelProto, or a command's LoadedModel read and checked once, one
    without external data; neither of the last two is edited)."""
    options = options or LintOptions()
    if isinstance(model, onnx.ModelProto):
        proto, path, base, given = model, None, None, True
    elif isinstance(model, LoadedModel):
        assert model.path is not None and not model.external_files, model.path  # its weights are not in memory
        proto, path, base, given = model.model, model.shown, model.path.parent, True
    else:
        loaded = load_checked(model)
        proto, path, base, given = loaded.model, str(model), Path(model).parent, False
    proto, plan_options, upgrade = _upgraded(proto, given, path, base, options)
    ctx = LintContext(proto, path, options.precision, options.rules, base, plan_options=plan_options)
    checks = selected(load_checks(), options.select, options.ignore)
    for s in options.suppress:
        try:
            UserPattern(s.node, s.source)
        except re.error as exc:
            raise AutocastError(f"bad regex {s.node!r} in a suppression: {exc}", s.source, "fix the pattern") from None
    # Fresh copies: use counts belong to this run, not to the caller's options.
    suppressions = [replace(s, used=0) for s in options.suppress] + _metadata_suppressions(ctx)
    diagnostics = []
    suppressed = 0
    for check in checks:
        for diag in [*KINDS[check.kind](ctx, check), *_upgrade_findings(_warned(upgrade), ctx, check, path)]:
            hit = next((s for s in suppressions if s.matches(diag)), None)
            if hit is not None:
                hit.used += 1
                suppressed += 1
                continue
            diagnostics.append(diag)
    unused_check = next((c for c in checks if c.kind == "unused-suppression"), None)
    n_config = len(options.suppress)
    if unused_check is not None:
        for k, s in enumerate(suppressions):
            if not s.used and (k >= n_config or options.report_unused_config):
                message = f"suppression of {s.code} for nodes matching {s.node!r} ({s.source}) matched no finding"
                diagnostics.append(report(unused_check, message, model=path))
    order = {c.code: k for k, c in enumerate(load_checks())}
    diagnostics.sort(
        key=lambda d: (
            order.get(d.code, 999),
            d.graph,
            d.node_index if d.node_index is not None else -1,
            d.tensor or "",
        )
    )
    precision = "fp16" if ctx.low == 10 else "bf16"
    provenance, unreadable = examine_provenance(proto)
    return LintResult(
        model=path,
        mode=ctx.mode,
        precision=precision,
        diagnostics=diagnostics,
        checks=[c.code for c in checks],
        suppressed=suppressed,
        config_suppression_use=[s.used for s in suppressions[:n_config]],
        provenance=provenance,
        provenance_unreadable=unreadable,
        warnings=_model_warnings(upgrade, unreadable),
    )


def _warned(upgrade) -> list:
    """The --opset upgrade's warnings (none without an upgrade)."""
    return list(upgrade.warnings) if upgrade else []


def _model_warnings(upgrade, unreadable: list) -> list[str]:
    """LintResult.warnings: the upgrade's warnings that are no finding of a node (the kernel ones
    are AC404 findings), then the provenance record's problems."""
    said = [f"--opset {upgrade.after}: {w.message}" for w in _warned(upgrade) if w.kind != "kernel"]
    if unreadable:
        said.append(f"the provenance record cannot be read ({', '.join(unreadable)})")
    return said


def lint_options(
    settings: dict | None = None,
    *,
    select=(),
    ignore=(),
    fail_on=None,
    plan=None,
    precision_given: bool = True,
):
    """LintOptions from configuration `settings`, the lint flags and the plan options (the rules
    and selections that decide which findings the default conversion protects). With
    `precision_given` false an fp32 model is linted against the plan's precision only as a default."""
    from ..diagnostics import SEVERITIES
    from ..plan.options import plan_options

    settings = settings or {}
    plan = plan or plan_options(settings)
    if fail_on is not None and fail_on not in SEVERITIES:
        raise AutocastError(
            f"--fail-on must be one of {', '.join(SEVERITIES)}, not {shown(fail_on)}", "--fail-on", "fix it"
        )
    suppress = [
        Suppression(code=e["code"], node=e.get("node", ".*"), source=settings.get("_source", "config"))
        for e in settings.get("suppress", [])
    ]
    return LintOptions(
        select=list(select) or settings.get("select", ["AC"]),
        ignore=list(ignore) or settings.get("ignore", []),
        fail_on=fail_on or settings.get("fail_on", "error"),
        precision=plan.target.value if precision_given else None,
        suppress=suppress,
        rules=list(plan.rules),
        plan=plan,
    )
