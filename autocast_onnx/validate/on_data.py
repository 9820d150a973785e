"""Planning on data: run the fp32 model before planning, to record tensor ranges (calibration)
and to search for the fewest nodes to keep fp32 for an accuracy target. Its results go to
`convert(..., calibration=, force_fp32=)`; `autocast_onnx.plan_on_data` is this module's."""

from __future__ import annotations

from dataclasses import dataclass

from ..io import LoadedModel, ModelArgument, model_argument
from .thresholds import Thresholds


@dataclass
class DataPlanning:
    """What measuring on data adds to a plan: calibration ranges and the nodes the accuracy
    search keeps fp32, with the search's log."""

    calibration: dict | None = None  # tensor name -> TensorRange
    force_fp32: dict | None = None  # node id -> Reason
    search_log: dict | None = None


def plan_on_data(
    model: ModelArgument,
    plan_options=None,
    *,
    calibration_data=None,
    targets=(),
    validation=None,
    progress=None,
    note=None,
    gpu: str | None = None,
    verdict=None,
) -> DataPlanning:
    """Run the fp32 model (a path or an onnx.ModelProto, never edited) on data before planning
    (`gpu`: the GPU the search's cost model prices on): `calibration_data` (an .npz or Polygraphy .json file, or a
    folder of either) records tensor ranges; `targets` (e.g. ["cosine=0.9999"]) searches for the fewest
    nodes to keep fp32 on the validation inputs (`validation`, a ValidateOptions: its --inputs,
    or batches generated from its dims, ranges, seed and batch count), measured as validation
    measures them (its map thresholds; padded positions left out unless compare_padded). `plan_options` (a
    PlanOptions) decides the plans the search tries. The result's fields go to
    `convert(..., calibration=, force_fp32=)`. `verdict(reference, converted) -> bool` (API
    only: a Python callable) judges each batch of the search beside the targets, or alone. A
    command that has read and checked the model already passes its io.LoadedModel as `model`, and
    the Thresholds it parsed from --target as `targets`: neither is read twice."""
    from ..pipeline import load_argument
    from ..plan.options import plan_options as _plan_options
    from . import runner
    from .inputs import check_batches, describe_inputs, generate, load_batches, plan_inputs
    from .options import ValidateOptions

    loaded = model if isinstance(model, LoadedModel) else None  # read and checked by the caller: used as it is
    model = loaded.model if loaded is not None else model_argument(model, "model")  # refused now if neither
    out = DataPlanning()
    if calibration_data is None and not isinstance(targets, Thresholds) and not targets and verdict is None:
        return out
    plan_options = plan_options or _plan_options()
    validation = validation or ValidateOptions()
    # read and checked as convert reads it (a ModelProto on a copy), unless the caller has done so
    source = loaded.model if loaded is not None else load_argument(model, True).model
    specs = describe_inputs(source)
    device, _ = runner.resolve_device(validation.device)
    goal = None
    if isinstance(targets, Thresholds):  # parsed by the caller already
        goal = targets.measured_as(validation.thresholds)
    elif targets:
        from .options import parse_targets

        goal = parse_targets(targets).measured_as(validation.thresholds)
    elif verdict is not None:
        goal = Thresholds.unset().measured_as(validation.thresholds)
    # every input is checked (headers only) before any long run starts
    if calibration_data is not None:
        check_batches(calibration_data, specs)
    if goal is not None and validation.inputs:
        check_batches(validation.inputs, specs)
    if calibration_data is not None:
        from .calibrate import calibrate

        out.calibration = calibrate(source, load_batches(calibration_data, specs), device, progress)
    if goal is not None:
        from .search import search

        if validation.inputs:
            batches = load_batches(validation.inputs, specs)
        else:
            in_plan = plan_inputs(specs, validation.dims, validation.ranges)
            batches = [generate(in_plan, seed=validation.seed + k) for k in range(validation.batches)]
        out.force_fp32, out.search_log = search(
            source,
            batches,
            {"options": plan_options, "calibration": out.calibration, "gpu": gpu},  # pipeline.convert's keywords
            goal,
            device,
            progress,
            note,
            compare_padded=validation.compare_padded,
            callback=verdict,
        )
    return out
