"""The Python API: the CLI's commands as functions with the CLI's options as keywords, returning
typed results with a readable repr.

    import autocast_onnx
    result = autocast_onnx.convert("model.onnx", target="rtol=0.05", inputs="batch.npz")
    report = autocast_onnx.validate("model.onnx", result.model, rtol=0.05)
    report.passed, report.outputs[0].relative_error
    autocast_onnx.explain("model.onnx", op="Softmax")   # [NodePlan, ...]
    autocast_onnx.lint("model.fp16.onnx").findings
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from .errors import AutocastError

# ---- convert ----------------------------------------------------------------------------------


def convert(
    model,
    *,
    calibration_data=None,
    target=None,
    inputs=None,
    dims: Mapping[str, int] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    batches: int = 1,
    seed: int = 0,
    device: str = "auto",
    **options,
):
    """Convert a model (path or ModelProto) to mixed precision, as `autocast-onnx convert`.

    The planning keywords are those of pipeline.convert (precision, rules, keep_io_types,
    exclude_ops, exclude_nodes, include_nodes, check, plan, loss_scale, strict, ...). With
    `calibration_data` (an .npz file or folder) the fp32 model runs on it first and nodes whose
    tensors leave the target range stay fp32; with `target` (e.g. "rtol=0.05" or
    ["cosine=0.9999", "top1=0.99"]) the accuracy search keeps the fewest nodes fp32 that meet it
    on `inputs`, or on `batches` generated from `dims`, `ranges` and `seed`. Returns a
    ConversionResult (its plan's `search` holds the search's log when there was one)."""
    from .options import PlanOptions
    from .pipeline import convert as _convert
    from .pipeline import plan_on_data
    from .validate.core import ValidateOptions

    if calibration_data is None and target is None:
        given = [name for name, value in (("inputs", inputs), ("dims", dims), ("ranges", ranges)) if value]
        if given:
            raise AutocastError(f"{given[0]}= has no effect without target=", None, "add target= or drop it")
        return _convert(model, **options)
    planning = {k: options[k] for k in ("precision", "rules", "keep_io_types", "exclude_ops", "exclude_nodes",
                                        "include_nodes", "low_precision_io", "strict") if k in options}  # fmt: skip
    plan = PlanOptions(**planning)
    validation = ValidateOptions(
        inputs=inputs, dims=dict(dims or {}), ranges=dict(ranges or {}), batches=batches, seed=seed, device=device
    )
    targets = [target] if isinstance(target, str) else list(target or ())
    with tempfile.TemporaryDirectory() as tmp:
        path = model
        if isinstance(model, onnx.ModelProto):
            path = Path(tmp) / "model.onnx"
            onnx.save(model, path)
        measured = plan_on_data(path, plan, calibration_data=calibration_data, targets=targets, validation=validation)
        result = _convert(model, calibration=measured.calibration, force_fp32=measured.force_fp32, **options)
    if measured.search_log is not None:
        result.plan.search = measured.search_log
    return result


# ---- validate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputComparison:
    """One output of a validation: the statistics of the JSON report, as attributes."""

    name: str
    passed: bool
    max_abs_error: float
    relative_error: float
    mean_abs_error: float
    cosine: float
    top1: float | None
    class_scores: str | None
    new_nan: int
    new_inf: int
    failures: tuple[str, ...]

    def __repr__(self) -> str:
        top1 = "" if self.top1 is None else f", top1 {self.top1:.4f}"
        return (
            f"<{self.name}: {'pass' if self.passed else 'FAIL'}, max abs {self.max_abs_error:.3g}, "
            f"rel {self.relative_error:.3g}, cosine {self.cosine:.6f}{top1}>"
        )


@dataclass(frozen=True)
class ValidationReport(Mapping):
    """What `validate` measured: `passed`, `outputs` (OutputComparison each), `warnings`, `speed`;
    also a read-only mapping over the JSON report (docs/validate-report.schema.json)."""

    data: dict = field(repr=False)

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    @property
    def outputs(self) -> list[OutputComparison]:
        return [
            OutputComparison(
                o["name"],
                o["passed"],
                o["max_abs_error"],
                o["relative_error"],
                o["mean_abs_error"],
                o["cosine"],
                o["top1"],
                o.get("class_scores"),
                o["new_nan"],
                o["new_inf"],
                tuple(o["failures"]),
            )
            for o in self.data["outputs"]
        ]

    @property
    def warnings(self) -> list[str]:
        return list(self.data.get("warnings", []))

    @property
    def speed(self) -> dict | None:
        return self.data.get("speed")

    @property
    def generation(self) -> dict | None:
        """Causal LMs: greedy-continuation agreement (see docs/validate-report.schema.json), else None."""
        return self.data.get("generation")

    def to_dict(self) -> dict:
        return self.data

    def text(self) -> str:
        """The report as the CLI prints it."""
        from .report.validation import validation_text

        return validation_text(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        outs = "; ".join(repr(o).strip("<>") for o in self.outputs)
        speed = self.speed
        tail = f"; speed-up {speed['speedup_p50']:.2f}x on {speed['device']}" if speed else ""
        warn = f"; {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"ValidationReport({'PASS' if self.passed else 'FAIL'}: {outs}{tail}{warn})"


def validate(
    reference,
    converted,
    *,
    inputs=None,
    dims: Mapping[str, int] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    batches: int = 1,
    seed: int = 0,
    device: str = "auto",
    numerics: str = "auto",
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    min_top1: float | None = None,
    class_outputs=(),
    speed: bool = True,
    iterations: int = 20,
    warmup: int = 3,
    strict: bool = False,
    generate: int = 16,
) -> ValidationReport:
    """Compare `converted` against `reference` (paths or ModelProtos), as `autocast-onnx validate`:
    per-output accuracy on `inputs` (an .npz file or folder) or generated batches, and speed. For a
    causal LM, `generate` tokens of greedy continuation are compared too (0: none).
    Thresholds left None take the CLI's defaults (rtol 0.01, min_cosine 0.999, min_top1 0.99)."""
    from .options import check_threshold
    from .validate.core import ValidateOptions
    from .validate.core import validate as _validate
    from .validate.metrics import Thresholds

    if inputs is not None and (dims or ranges or batches != 1 or seed != 0):
        raise AutocastError(
            "dims=, ranges=, batches= and seed= have no effect with inputs= (the arrays are used as they are)",
            None,
            "drop them, or drop inputs= to generate inputs",
        )
    if isinstance(generate, bool) or not isinstance(generate, int) or not 0 <= generate <= 1024:
        raise AutocastError(
            f"generate= must be a whole number from 0 to 1024, not {generate!r}", None, "e.g. generate=16"
        )
    thresholds = Thresholds()
    for key, value in (("atol", atol), ("rtol", rtol), ("min_cosine", min_cosine), ("min_top1", min_top1)):
        if value is not None:
            check_threshold(key, value, key + "=", "fix the threshold")
            setattr(thresholds, key, float(value))
    options = ValidateOptions(
        inputs=os.fspath(inputs) if inputs is not None else None,
        dims=dict(dims or {}),
        ranges=dict(ranges or {}),
        batches=batches,
        seed=seed,
        device=device,
        numerics=numerics,
        thresholds=thresholds,
        speed=speed,
        iterations=iterations,
        warmup=warmup,
        class_outputs=list(class_outputs),
        strict=strict,
        generate=generate,
    )
    return ValidationReport(_validate(reference, converted, options))


# ---- lint -------------------------------------------------------------------------------------


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
        from .report.lint import counts

        return counts(self.findings)

    def text(self, show_protected: bool = True) -> str:
        from .report.lint import lint_text

        return lint_text(self.results, show_protected=show_protected)

    def __repr__(self) -> str:
        c = self.counts()
        return (
            f"LintReport({len(self.results)} model(s), {len(self.findings)} finding(s): {c['error']} error, "
            f"{c['warning']} warning, {c['info']} info; {'pass' if self.passed else 'FAIL'} at fail_on={self.fail_on})"
        )


def lint(*models, select=(), ignore=(), fail_on: str = "error", precision: str | None = None, rules=(),
         exclude_ops=(), exclude_nodes=(), include_nodes=()) -> LintReport:  # fmt: skip
    """Lint models (paths or ModelProtos), as `autocast-onnx lint`: fp32 models are checked as if
    converted to `precision` (default fp16) with these rules and selections."""
    from .lint import lint as _lint
    from .options import lint_options, plan_options

    if not models:
        raise AutocastError("lint() needs at least one model", None, "pass a path or a ModelProto")
    plan = plan_options(
        precision=precision, rules=rules, exclude_ops=exclude_ops, exclude_nodes=exclude_nodes,
        include_nodes=include_nodes,
    )  # fmt: skip
    options = lint_options(
        select=select, ignore=ignore, fail_on=fail_on, plan=plan, precision_given=precision is not None
    )
    return LintReport([_lint(m, options) for m in models], options.fail_on)


# ---- explain ----------------------------------------------------------------------------------


def explain(model, node: str | None = None, *, op: str | None = None, calibration_data=None, **options) -> list:
    """The plan entries (NodePlan: precision, category, reasons) of the nodes `node` names (a
    name, "#ID", or a regex when it has regex characters) or of every node of op type `op`, as
    `autocast-onnx explain`; `entry.explain()` gives the CLI's text. Planning keywords as convert."""
    import re

    if node is None and op is None:
        raise AutocastError("say which node: node= (a name, regex or #ID) or op=", None, "pass one")
    result = convert(model, check="none", calibration_data=calibration_data, **options)
    try:
        entries = result.plan.find(node, op)
    except re.error as exc:
        raise AutocastError(f"bad regex {node!r}: {exc}", None, "fix the pattern") from None
    if not entries:
        what = " and ".join(x for x in (f"node {node!r}" if node else "", f"op {op!r}" if op else "") if x)
        raise AutocastError(f"no node matches {what}", None, "check the name; result.plan.nodes lists them")
    return entries
