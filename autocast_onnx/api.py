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

import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx

from .errors import AutocastError
from .lint.api import LintReport, lint
from .validate.api import OutputComparison, ValidationReport, validate

__all__ = ["LintReport", "OutputComparison", "ValidationReport", "convert", "explain", "lint", "validate"]

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
    from .pipeline import convert as _convert
    from .validate.core import ValidateOptions

    if calibration_data is None and target is None:
        given = [name for name, value in (("inputs", inputs), ("dims", dims), ("ranges", ranges)) if value]
        if given:
            raise AutocastError(f"{given[0]}= has no effect without target=", None, "add target= or drop it")
        return _convert(model, **options)
    validation = ValidateOptions(
        inputs=inputs, dims=dict(dims or {}), ranges=dict(ranges or {}), batches=batches, seed=seed, device=device
    )
    targets = [target] if isinstance(target, str) else list(target or ())
    measured = _measured(model, options, calibration_data, targets, validation)
    result = _convert(model, calibration=measured.calibration, force_fp32=measured.force_fp32, **options)
    if measured.search_log is not None:
        result.plan.search = measured.search_log
    return result


def _measured(model, options: dict, calibration_data, targets: list, validation):
    """What running the fp32 model on data decides (validate/on_data.py): measured ranges with
    `calibration_data`, nodes kept fp32 by the accuracy search with `targets`."""
    from .options import PlanOptions
    from .validate.on_data import plan_on_data

    planning = {k: options[k] for k in ("precision", "rules", "keep_io_types", "exclude_ops", "exclude_nodes",
                                        "include_nodes", "low_precision_io", "strict") if k in options}  # fmt: skip
    plan = PlanOptions(**planning)
    with tempfile.TemporaryDirectory() as tmp:
        path = model
        if isinstance(model, onnx.ModelProto):
            path = Path(tmp) / "model.onnx"
            onnx.save(model, path)
        return plan_on_data(path, plan, calibration_data=calibration_data, targets=targets, validation=validation)


# ---- explain ----------------------------------------------------------------------------------


def explain(model, node: str | None = None, *, op: str | None = None, calibration_data=None, **options) -> list:
    """The plan entries (NodePlan: precision, category, reasons) of the nodes `node` names (a
    name, "#ID", or a regex when it has regex characters) or of every node of op type `op`, as
    `autocast-onnx explain`; `entry.explain()` gives the CLI's text. Planning keywords as convert."""
    import re

    if node is None and op is None:
        raise AutocastError("say which node: node= (a name, regex or #ID) or op=", None, "pass one")
    plan = _explained_plan(model, calibration_data, options)
    try:
        entries = plan.find(node, op)
    except re.error as exc:
        raise AutocastError(f"bad regex {node!r}: {exc}", None, "fix the pattern") from None
    if not entries:
        what = " and ".join(x for x in (f"node {node!r}" if node else "", f"op {op!r}" if op else "") if x)
        raise AutocastError(f"no node matches {what}", None, "check the name; result.plan.nodes lists them")
    return entries


def _explained_plan(model, calibration_data, options: dict):
    """The plan explain reads: planned without converting (pipeline.plan_model); a keyword only
    the whole conversion takes (a plan to replay, the accuracy search's) keeps the conversion."""
    from .pipeline import plan_model
    from .validate.core import ValidateOptions

    if not set(options) <= set(plan_model.__kwdefaults__ or ()):
        return convert(model, check="none", calibration_data=calibration_data, **options).plan
    if calibration_data is None:
        return plan_model(model, **options).plan
    measured = _measured(model, options, calibration_data, [], ValidateOptions())
    return plan_model(model, calibration=measured.calibration, force_fp32=measured.force_fp32, **options).plan
