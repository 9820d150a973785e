"""The Python API of lint (`autocast_onnx.lint(...)`): `autocast-onnx lint` as a function with
its options as keywords, returning a LintReport with a readable repr. `autocast_onnx.api`
re-exports it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AutocastError


@dataclass(frozen=True)
class LintReport:
    """What `lint` found: `findings` (Diagnostic each, with code, severity, node, message),
    `results` (one LintResult per model) and `passed` (nothing at or above fail_on)."""

    results: list
    fail_on: str = "error"

    @property
    def findings(self) -> list:
        return [d for r in self.results for d in r.diagnostics]

    @property
    def passed(self) -> bool:
        return not any(r.failed(self.fail_on) for r in self.results)

    def counts(self) -> dict[str, int]:
        from .report import counts

        return counts(self.findings)

    def text(self, show_protected: bool = True) -> str:
        from .report import lint_text

        return lint_text(self.results, show_protected=show_protected)

    def __repr__(self) -> str:
        c = self.counts()
        return (
            f"LintReport({len(self.results)} model(s), {len(self.findings)} finding(s): {c['error']} error, "
            f"{c['warning']} warning, {c['info']} info; {'pass' if self.passed else 'FAIL'} at fail_on={self.fail_on})"
        )


def lint(*models, select=(), ignore=(), fail_on: str = "error", precision: str | None = None, rules=(),
         exclude_ops=(), include_ops=(), exclude_nodes=(), include_nodes=(), opset=None,
         runtime=None, precise=None) -> LintReport:  # fmt: skip
    """Lint models (paths or ModelProtos), as `autocast-onnx lint`: fp32 models are checked as if
    converted to `precision` (default fp16) with these rules and selections; with `opset`, each
    model is linted upgraded to that default-domain opset, as `convert --opset` would plan it; with
    `runtime` ("cuda", "tensorrt"), planned as `convert --runtime` would, for that runtime's kernels;
    `precise` plans as `convert --precise` would."""
    from ..io import model_argument
    from ..plan.options import plan_options
    from .engine import lint as _lint
    from .engine import lint_options

    if not models:
        raise AutocastError("lint() needs at least one model", None, "pass a path or a ModelProto")
    models = tuple(model_argument(m, "models" if len(models) == 1 else f"models[{k}]") for k, m in enumerate(models))
    plan = plan_options(
        precision=precision, rules=rules, exclude_ops=exclude_ops, include_ops=include_ops,
        exclude_nodes=exclude_nodes, include_nodes=include_nodes, opset=opset,
        runtime=runtime, precise=precise,
    )  # fmt: skip
    options = lint_options(
        select=select, ignore=ignore, fail_on=fail_on, plan=plan, precision_given=precision is not None
    )
    return LintReport([_lint(m, options) for m in models], options.fail_on)
