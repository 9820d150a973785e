"""The Python API: the CLI's commands as functions with the CLI's options as keywords, returning
typed results with a readable repr.

    import autocast_onnx
    result = autocast_onnx.convert("model.onnx", target="rtol=0.05", inputs="batch.npz")
    report = autocast_onnx.validate("model.onnx", result.model, rtol=0.05)
    report.passed, report.outputs[0].relative_error
    autocast_onnx.explain("model.onnx", op="Softmax")   # [NodePlan, ...]
    autocast_onnx.lint("model.fp16.onnx").findings
    autocast_onnx.check("model.onnx", precision="bf16", rtol=0.05, speed=False)   # CheckResult

Each call takes the keywords of its command's options, and builds its options objects through
the builders the command line uses (plan/options.py, validate/options.py, lint/engine.py):
tests/contracts/test_api_options.py holds the two to the same set of options.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx

from .errors import AutocastError
from .lint.api import LintReport, lint
from .validate.api import OutputComparison, ValidationReport, validate

__all__ = ["LintReport", "OutputComparison", "ValidationReport", "check", "convert", "explain", "lint", "validate"]

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
    map_threshold=None,
    compare_padded: bool = False,
    verdict=None,
    **options,
):
    """Convert a model (path or ModelProto) to mixed precision, as `autocast-onnx convert`.

    The other keywords are those of pipeline.convert: the planning options (PlanOptions' fields:
    precision, rules, keep_io_types, exclude_ops, include_ops, exclude_nodes, include_nodes,
    low_precision_io, strict; or one PlanOptions as options=), check, plan, loss_scale, ... With
    `calibration_data` (an .npz or Polygraphy .json file, or a folder) the fp32 model runs on it first and nodes whose
    tensors leave the target range stay fp32; with `target` (e.g. "rtol=0.05" or
    ["cosine=0.9999", "top1=0.99"]) the accuracy search keeps the fewest nodes fp32 that meet it
    on `inputs`, or on `batches` generated from `dims`, `ranges` and `seed`, measured as validate
    measures (`map_threshold` cuts a probability map's masks for target "iou=..."; padded positions
    are left out unless `compare_padded`). Returns a ConversionResult (its plan's `search` holds
    the search's log when there was one). `verdict(reference, converted) -> bool`, a callable
    given the two lists of output arrays of one batch, is the caller's own judgement: the search
    keeps the fewest nodes fp32 for it to hold, beside `target` or alone."""
    from .pipeline import convert as _convert
    from .plan.options import plan_options_in
    from .validate.options import ValidateOptions, thresholds_from

    planning, rest = plan_options_in(options, "convert")
    if verdict is not None and not callable(verdict):
        raise AutocastError(
            f"verdict={verdict!r} is not callable", "verdict", "pass a function (reference, converted) -> bool"
        )
    if calibration_data is None and target is None and verdict is None:
        unused = (("inputs", inputs), ("ranges", ranges), ("compare_padded", compare_padded))
        given = [name for name, value in unused if value] + (["map_threshold"] if map_threshold is not None else [])
        if given:
            raise AutocastError(f"{given[0]}= has no effect without target=", None, "add target= or drop it")
        return _convert(model, options=planning, dims=dict(dims) if dims else None, **rest)
    validation = ValidateOptions(
        inputs=inputs,
        dims=dict(dims or {}),
        ranges=dict(ranges or {}),
        batches=batches,
        seed=seed,
        device=device,
        thresholds=thresholds_from({}, {"map_threshold": map_threshold}, keywords=True),
        compare_padded=bool(compare_padded),
    )
    targets = [target] if isinstance(target, str) else list(target or ())
    measured = _measured(model, planning, calibration_data, targets, validation, rest.get("gpu"), verdict)
    result = _convert(
        model,
        calibration=measured.calibration,
        force_fp32=measured.force_fp32,
        options=planning,
        dims=dict(dims) if dims else None,
        **rest,
    )
    if measured.search_log is not None:
        result.plan.search = measured.search_log
    return result


def _measured(model, planning, calibration_data, targets: list, validation, gpu: str | None = None, verdict=None):
    """What running the fp32 model on data decides (validate/on_data.py): measured ranges with
    `calibration_data`, nodes kept fp32 by the accuracy search with `targets` (priced on `gpu`).
    `planning` is the call's PlanOptions; `model` a path or a ModelProto, as plan_on_data takes it."""
    from .validate.on_data import plan_on_data

    return plan_on_data(
        model,
        planning,
        calibration_data=calibration_data,
        targets=targets,
        validation=validation,
        gpu=gpu,
        verdict=verdict,
    )


# ---- explain ----------------------------------------------------------------------------------


def explain(
    model,
    node: str | None = None,
    *,
    op: str | None = None,
    calibration_data=None,
    islands: bool = False,
    frontier: bool = False,
    **options,
) -> list:
    """The plan entries (NodePlan: precision, category, reasons) of the nodes `node` names (a
    name, "#ID", or a regex when it has regex characters) or of every node of op type `op`, as
    `autocast-onnx explain`; `entry.explain()` gives the CLI's text. Planning keywords as convert.
    With `islands=True` and no node or op: the fp32 islands of the conversion (plan/islands.Island,
    each with its `causes` and its estimated `cost` on `gpu`), as `autocast-onnx explain --islands`.
    `model` is a path or an onnx.ModelProto (never edited)."""
    import re

    from .io import model_argument

    model = model_argument(model, "model")
    if node is None and op is None and not islands:
        raise AutocastError("say which node: node= (a name, regex or #ID), op= or islands=True", None, "pass one")
    if frontier and not islands:
        raise AutocastError("frontier= needs islands=True", "frontier", "pass islands=True")
    if islands and node is None and op is None:
        return _priced_islands(model, calibration_data, options, frontier)
    if options.get("gpu") is not None:
        raise AutocastError("gpu= has no effect without islands=True", "gpu", "pass islands=True or drop gpu")
    plan = _explained_plan(model, calibration_data, options)
    try:
        entries = plan.find(node, op)
    except re.error as exc:
        raise AutocastError(f"bad regex {node!r}: {exc}", None, "fix the pattern") from None
    if not entries:
        what = " and ".join(x for x in (f"node {node!r}" if node else "", f"op {op!r}" if op else "") if x)
        raise AutocastError(f"no node matches {what}", None, "check the name; result.plan.nodes lists them")
    return entries


def _priced_islands(model, calibration_data, options: dict, frontier: bool = False) -> list:
    """The fp32 islands of the conversion, each with its estimated `cost` on `gpu` (report/speed.py);
    with `frontier`, the rows of validate/frontier.py instead: cheapest first, each with the error it buys."""
    from .plan.options import plan_options_in
    from .report.speed import island_costs

    result = convert(model, calibration_data=calibration_data, check="none", **options)
    if frontier:
        from .validate.frontier import frontier as islands_frontier

        planning, _ = plan_options_in({k: v for k, v in options.items() if k != "gpu"}, "explain")
        with tempfile.TemporaryDirectory() as tmp:
            path = model
            if isinstance(model, onnx.ModelProto):
                path = Path(tmp) / "model.onnx"
                onnx.save(model, path)
            return islands_frontier(str(path), result, planning, options.get("gpu"))
    costs = island_costs(result, options.get("gpu"))
    for island in result.plan.islands:
        island.cost = costs.get(island.number)
    return result.plan.islands


def _explained_plan(model, calibration_data, options: dict):
    """The plan explain reads: planned without converting (pipeline.plan_model); a keyword only
    the whole conversion takes (a plan to replay, the check level) keeps the conversion."""
    from .pipeline import plan_model
    from .plan.options import plan_options_in
    from .validate.options import ValidateOptions

    planning, rest = plan_options_in(options, "explain")
    if not set(rest) <= set(plan_model.__kwdefaults__ or ()):
        return convert(model, check="none", calibration_data=calibration_data, options=planning, **rest).plan
    if calibration_data is None:
        return plan_model(model, options=planning, **rest).plan
    measured = _measured(model, planning, calibration_data, [], ValidateOptions())
    return plan_model(
        model, calibration=measured.calibration, force_fp32=measured.force_fp32, options=planning, **rest
    ).plan


# ---- check ------------------------------------------------------------------------------------


def check(
    model,
    *,
    output=None,
    select=(),
    ignore=(),
    fail_on: str | None = None,
    baseline=None,
    skip_validate: bool = False,
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
    min_iou: float | None = None,
    map_threshold: float | None = None,
    compare_padded: bool = False,
    class_outputs=(),
    generate: int = 16,
    speed: bool | None = None,
    iterations: int = 20,
    warmup: int = 3,
    save_inputs=None,
    strict: bool = False,
    **planning,
):
    """The CI gate on `model` (a path or an onnx.ModelProto, never edited), as `autocast-onnx check`:
    lint it, convert it, lint the result, validate it; returns a CheckResult (`passed`, `report`
    as --report-json writes it, `diagnostics`, `text()`). The keywords are the command's
    options: the planning options as convert's (precision, rules, exclude_ops, ...), the lint
    options (select, ignore, fail_on), the validation options as validate's, `skip_validate`
    (--no-validate), `output` (keep the converted model there) and `baseline`, the path of an
    earlier report (--report-json): then only new findings and regressions fail. They go through
    the command line's builders, so a bad value is the AutocastError the command line gives."""
    from .gate import check as run_gate
    from .gate import load_baseline
    from .io import model_argument, model_file
    from .lint.engine import lint_options
    from .plan.options import PLANNING, plan_options
    from .validate.options import validate_options

    model = model_argument(model, "model")
    unknown = sorted(set(planning) - set(PLANNING))
    if unknown:
        raise TypeError(f"check() got an unexpected keyword argument {unknown[0]!r}")
    validation = {
        "inputs": inputs, "dims": dims, "ranges": ranges, "batches": batches, "seed": seed, "device": device,
        "numerics": numerics, "atol": atol, "rtol": rtol, "min_cosine": min_cosine, "min_top1": min_top1,
        "min_iou": min_iou, "map_threshold": map_threshold, "compare_padded": compare_padded,
        "class_outputs": class_outputs, "generate": generate, "speed": speed, "iterations": iterations,
        "warmup": warmup, "save_inputs": save_inputs,
    }  # fmt: skip
    _refuse_without_effect(validation, skip_validate)
    plan = plan_options(strict=strict, **planning)
    lint = lint_options(select=select, ignore=ignore, fail_on=fail_on, plan=plan)
    given = {k: v for k, v in validation.items() if v is not None}
    vopts = validate_options(None, strict=strict, **given)
    prior = load_baseline(baseline) if baseline is not None else None
    with model_file(model) as path:  # the gate works on files: a ModelProto is written to a temporary one
        return run_gate(
            path, output=output, plan_options=plan, lint_options=lint, validation=vopts, skip_validate=skip_validate,
            baseline=prior, shown=None if path is model else "<model>",
        )  # fmt: skip


def _refuse_without_effect(validation: dict, skip_validate: bool) -> None:
    """Nothing silent, as on the command line: with skip_validate=True every validation keyword
    would do nothing, and with inputs= so would those that shape generated inputs."""
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(check).parameters.items()}
    given = [name for name, value in validation.items() if not _same(value, defaults[name])]
    if skip_validate and given:
        raise AutocastError(
            f"{'=, '.join(given)}= {'has' if len(given) == 1 else 'have'} no effect with skip_validate=True",
            None,
            "drop them or run the validation",
        )
    from .validate.options import GENERATING, refuse_generating_with_inputs

    if validation["inputs"] is not None:
        refuse_generating_with_inputs([f"{name}=" for name in GENERATING if name in given], "inputs=")


def _same(value, default) -> bool:
    """Whether a keyword was left as its default (an empty mapping or list counts as not given)."""
    if value is None or (isinstance(value, (Mapping, tuple, list)) and not value):
        return default is None or (isinstance(default, tuple) and not default)
    return value is default or (type(value) is type(default) and value == default)
