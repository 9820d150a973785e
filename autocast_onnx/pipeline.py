"""The conversion pipeline: load -> index -> classify -> paint (plan) -> apply -> check -> save.
`convert` is the Python API that mirrors `autocast-onnx convert`."""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .catalog import RuleSet, load_rules
from .dtypes import FLOAT, dtype_name
from .errors import AutocastError, InternalCheckError
from .fast import in_file
from .fast.screen import WeightScreen
from .fast.splice import HeldPayloads, check_with_stand_in
from .graph import build_index
from .graph.sanity import blame_input, check_input, load_checked
from .graph.shapes import MAC_OPS, macs_of, tensor_shapes
from .graph.training import TrainingGraph, might_be_training, recognise
from .io import (
    PROTOBUF_LIMIT,
    LeftInFile,
    LoadedModel,
    PayloadSpill,
    PiecesLike,
    check_model_path,
    check_output_path,
    check_outputs,
    encoded_size,
    is_stdout,
    load_model,
    model_argument,
    output_kind,
    save_model,
    tensor_nbytes,
)
from .patterns import compile_patterns
from .plan import Precision, PrecisionPlan, check_plan_fits, classify, global_order, islands, paint
from .plan.classify import UNMATCHED, warn_cuda_fallbacks
from .plan.model import PlanWarning
from .plan.options import PLANNING, PlanOptions, plan_options_in, planning_fields
from .plan.paint import clamp_forced_constants, warn_little_conversion, warn_schema_limits
from .plan.vocab import Seed
from .rewrite import ApplyStats, apply_plan, check_result
from .rewrite.apply import PayloadSink
from .rewrite.checks import CHECK_LIMIT, blame_input_for, check_file
from .rewrite.loss_scale import (
    LossScale,
    LossScaling,
    parse_loss_scale,
    refuse_loss_scale,
    seed_loss_scale,
    unscale_gradients,
)
from .rewrite.opset import OpsetChange, default_opset, upgrade_opset

log = logging.getLogger(__name__)

# The stages of a conversion, declared once, in the order they run. Every entry point is the
# shared opening (OPENING: _opening; INDEXING: _indexed) with its own end; convert_file wraps
# convert's stages in its file stages (FILE_OPENING, then FILE_END, where `check written files`
# runs only for weights on disk and the output check runs inside `save`). _stage refuses a name
# not declared here; tests/pipeline/test_pipeline_stages.py holds each entry point's -v log to its line.
OPENING = ("resolve target", "upgrade opset", "check opset", "read options")
INDEXING = ("index", "prepare training")
ENTRY_POINTS = {
    "convert": (*OPENING, *INDEXING, "measure", "plan", "apply", "measure result", "record training", "check"),
    "plan_model": (*OPENING, *INDEXING, "plan", "record training"),
    "replay_model": (*OPENING, *INDEXING, "check plan"),
}
FILE_OPENING = ("load", "choose output")
FILE_END = ("read back kept weights", "serialize", "save", "check written files", "write plan")
_DECLARED = frozenset((*FILE_OPENING, *FILE_END, *(name for names in ENTRY_POINTS.values() for name in names)))

# Checks run on every converted model: "basic" is onnx.checker (structure, schemas, attributes);
# "full" adds ONNX shape and type inference over the whole graph (as slow as the conversion itself
# on large graphs; the test suite runs it on every model it converts).
CHECKS = ("full", "basic", "none")

# Lowest default-domain opset whose Cast accepts each target type.
MIN_OPSET = {"fp16": 6, "bf16": 13}


@dataclass(repr=False)
class ConversionResult:
    """What a conversion gives: the converted model (`model`), its plan, statistics and sizes."""

    _model: onnx.ModelProto  # read as `model`
    plan: PrecisionPlan
    stats: ApplyStats
    initializer_bytes_before: int
    initializer_bytes_after: int
    constant_bytes_before: int = 0  # tensors held by Constant nodes
    constant_bytes_after: int = 0
    seconds: dict = field(default_factory=dict)
    output_files: list = field(default_factory=list)
    training: TrainingGraph | None = None  # what kind of training graph the input was (None: inference)
    loss_scaling: LossScaling | None = None  # what the loss-scaling rewrite added
    # inferred on the input (tensor name -> (elem type, shape)); None over graph.shapes.LIMIT_NODES
    shapes: Mapping | None = None
    macs: list | None = None  # (node id, multiply-accumulates) per MatMul/Gemm/Conv
    # how many initializers of the input (any graph) are stored as external data: a save in one
    # piece has to find and inline those it did not convert; without any it skips the search
    external_tensors: int = 1
    # the GPU the summary's latency estimate is for (roofline/gpus.json; None: the table's default)
    gpu: str | None = None
    # what the latency estimate reads of the model as read (report/speed.py SpeedSource), made on
    # first use; None where no shapes were inferred
    speed_source_of: Callable | None = field(default=None, compare=False, repr=False)
    # payloads convert_file's save spliced into the file but has not yet given to their tensors
    # (fast/splice.py): given on the first read of `model`, which the command line never makes
    _held: HeldPayloads | None = field(default=None, init=False, compare=False)

    @property
    def model(self) -> onnx.ModelProto:
        """The converted model, whole: payloads still held for the save's splice are given to
        their tensors on the first read."""
        held, self._held = self._held, None
        if held is not None:
            held.inline()
        return self._model

    @model.setter
    def model(self, model: onnx.ModelProto) -> None:
        self._model = model

    @property
    def nodes(self):
        """The converted main graph's nodes, final; reading them gives no held payload to its tensor."""
        return self._model.graph.node

    @property
    def casts_added(self) -> int:
        return self.stats.casts_added

    def summary(self) -> str:
        """The summary `autocast-onnx convert` prints (docs/summary.md)."""
        from .report import conversion_summary

        return conversion_summary(self)

    def __repr__(self) -> str:
        return (
            f"ConversionResult({self.plan!r}, {self.stats.casts_added} casts added, initializer bytes "
            f"{self.initializer_bytes_before:,} -> {self.initializer_bytes_after:,})"
        )


@contextmanager
def _no_gc():
    """The index creates ~3 objects per node; the cyclic collector rescanning them all on every
    generation-0 threshold would make indexing quadratic-looking on large graphs. Disabling it
    does not stop them piling up in the youngest generation, whose first collection after
    re-enabling would then traverse all of them (0.2 s at 100k nodes): freezing and unfreezing
    moves them to the oldest generation without a scan (collected later, as any long-lived data).
    Not when the program froze objects itself (a server before forking): unfreezing would undo it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _constant_bytes(nodes) -> int:
    """Bytes of the tensors Constant nodes hold (value attribute), main graph and bodies."""
    total = 0
    for node in nodes:
        for attr in node.proto.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                total += tensor_nbytes(attr.t)
    return total


def _initializer_bytes(index, known: dict | None = None) -> int:
    """Payload bytes of every initializer. `known` (id(TensorProto) -> bytes: the payloads the
    loader left in the file, whose sizes it measured) spares working those out from dims."""
    total = 0
    known = known or {}
    for scope in index.scopes:
        for value in scope.values.values():
            tensor = value.initializer
            if tensor is not None:
                size = known.get(id(tensor))
                total += tensor_nbytes(tensor) if size is None else size
    return total


def convert(
    model: onnx.ModelProto | str | os.PathLike,
    *,
    check: str = "basic",
    copy: bool = True,
    calibration=None,
    force_fp32=None,
    plan: PrecisionPlan | str | os.PathLike | None = None,
    loss_scale: str | float | None = None,
    options: PlanOptions | None = None,
    gpu: str | None = None,
    dims: Mapping[str, int] | None = None,
    **planning,
) -> ConversionResult:
    """Convert a model to mixed precision.

    `model` is a ModelProto (copied unless copy=False) or a path. The planning options are
    PlanOptions' fields (plan/options.py), given as keywords or as one `options` object:
    `precision` is fp16 (the default) or bf16; `rules` are extra rule files, applied in order
    over the default profile; `keep_io_types`, `exclude_ops`, `exclude_nodes`, `include_nodes`;
    `low_precision_io` (a regex on whole names) gives the matching model inputs and outputs the
    low-precision type, e.g. a KV cache, and must match a float input or output; `opset` upgrades
    the default-domain opset to it before planning (rewrite/opset.py; never done unasked); with `strict`,
    a node rule, --exclude-node, --include-node or --exclude-op that matches no node is an error
    rather than a plan warning. `calibration` maps tensor names to measured ranges (see
    validate.calibrate). `plan` replays a plan written by `--plan-out` / `PrecisionPlan.save`
    (possibly edited) instead of planning: it must belong to this model, and no planning option
    may be given with it. `loss_scale` ("dynamic", "none" or a number; default dynamic for
    onnxruntime-training models) puts loss scaling into a training graph (see
    rewrite/loss_scale.py). `gpu` names the GPU of the summary's latency estimate (a key of
    autocast_onnx/data/gpus.json; None: its default; report/speed.py); `dims` sizes the model's open
    input dimensions for the summary's cast traffic and estimate (NAME=SIZE, as validate's --dims;
    None: the sizes validation generates). Returns the converted model,
    the precision plan (node -> precision and reasons) and statistics. Raises AutocastError on bad
    input.
    """
    options = _entry_options("convert", options, planning)
    if gpu is not None:
        from .roofline import gpu as known_gpu

        known_gpu(gpu)  # an unknown name is an input error before any work
    timings = {}
    t0 = time.perf_counter()
    loaded = load_argument(model, copy)
    timings["load"] = time.perf_counter() - t0
    return _convert_from(
        loaded, model, copy, timings, options, check, calibration, force_fp32, plan, loss_scale, dims, gpu
    )


def convert_checked(model: onnx.ModelProto, *, options: PlanOptions, check: str = "none", **stages) -> ConversionResult:
    """convert() of a model that its caller loaded and checked already (load_argument) and
    converts again and again, as the accuracy search does: a copy of it converted without reading
    or checking it again. `stages` are convert's calibration, force_fp32, plan, loss_scale, dims
    and gpu."""
    t0 = time.perf_counter()
    loaded = LoadedModel(model=_copy_model(model), path=None, file_bytes=0)
    timings = {"load": time.perf_counter() - t0}
    keys = ("calibration", "force_fp32", "plan", "loss_scale", "dims", "gpu")
    return _convert_from(loaded, model, True, timings, options, check, *(stages.get(k) for k in keys))


def _convert_from(loaded, model, copy, timings, options, check, calibration, force_fp32, plan, loss_scale, dims, gpu):
    """The conversion of a loaded model (convert's, after the load): the result, its GPU named; an
    internal failure first blames the input as given (`model`, when the conversion did not edit it)."""
    try:
        result = _convert_loaded(
            loaded,
            options=options,
            check=check,
            timings=timings,
            calibration=calibration,
            force_fp32=force_fp32,
            plan=plan,
            loss_scale=loss_scale,
            dims=dims,
        )
        result.gpu = gpu
        return result
    except InternalCheckError as exc:  # the input as given, when the conversion did not edit it
        source = model if (copy or not isinstance(model, onnx.ModelProto)) else None
        blame_input_for(exc, source, str(loaded.path) if loaded.path else "<model>")
        raise


def _entry_options(call: str, options: PlanOptions | None, planning: dict) -> PlanOptions:
    """The planning options of a call as one PlanOptions, made once at its entry: `options`, or
    the planning keywords through the builder (flags and keywords are read alike); an unknown
    keyword is a TypeError naming the call, as Python's own."""
    unknown = sorted(set(planning) - set(PLANNING))
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
    return plan_options_in({**planning, "options": options}, call)[0]


@dataclass
class PlannedModel:
    """A model planned but not converted (plan_model): the plan convert would apply, the index it
    was made on, and the training graph the model is (None: inference)."""

    plan: PrecisionPlan
    index: object
    training: TrainingGraph | None = None


def plan_model(
    model: onnx.ModelProto | str | os.PathLike,
    *,
    copy: bool = True,
    calibration=None,
    force_fp32=None,
    loss_scale: str | float | None = None,
    options: PlanOptions | None = None,
    **planning,
) -> PlannedModel:
    """Plan a model without converting it: the stages of convert up to the plan (load, index,
    classify, paint), then no rewrite of the weights, no apply, no check. For callers that read
    only the plan (lint's protected findings, diagnose's reasons, explain): the plan is the one
    convert gives with the same options, at a fraction of the cost. The planning options are
    convert's (keywords, or one `options` object). Raises AutocastError on bad input, as convert
    does."""
    options = _entry_options("plan_model", options, planning)
    loaded = load_argument(model, copy)
    where = str(loaded.path) if loaded.path else "<model>"
    opening = _opening(loaded.model, where, None, options, calibration, force_fp32, None)
    target, keep_io_types, upgrade, selection = (
        opening.target,
        opening.keep_io_types,
        opening.upgrade,
        opening.selection,
    )
    assert selection is not None
    with _no_gc():
        index, training, scale = _indexed(loaded, where, loss_scale, keep_io_types)
        with _stage("plan"):
            low_io = _low_precision_io(index, selection.low_precision_io, training, where)
            shapes = tensor_shapes(loaded.model)
            work = _work(index, shapes)
            plan = _fresh_plan(index, selection, target, keep_io_types, training, work, low_io, None, where, shapes)
    with _stage("record training"):
        # the loss scaling's record names what its rewrite adds: made on this copy, after the plan
        scaling = unscale_gradients(loaded.model, training, scale) if scale is not None and training else None
        _record_training(plan, training, scaling)
        _record_load(plan, upgrade, loaded)
    return PlannedModel(plan=plan, index=index, training=training)


def replay_model(
    model: onnx.ModelProto | str | os.PathLike, plan, *, options: PlanOptions | None = None
) -> PlannedModel:
    """A plan file (or PrecisionPlan) checked against a model as `convert --plan` checks it, without
    converting: for `explain --plan`. The planning options that a replayed plan refuses are refused
    here too; each node keeps the reasons the file gives it, and an edited one (its precision
    differs from the one planning gave) gets a last reason `plan-edit` naming the file."""
    options = _entry_options("replay_model", options, {})
    loaded = load_argument(model, True)
    where = str(loaded.path) if loaded.path else "<model>"
    opening = _opening(loaded.model, where, plan, options, None, None, None)
    plan, keep_io_types = opening.plan, opening.keep_io_types
    assert plan is not None
    with _no_gc():
        index, training, _ = _indexed(loaded, where, opening.loss_scale, keep_io_types)
        with _stage("check plan"):
            check_plan_fits(plan, index)
    return PlannedModel(plan=plan, index=index, training=training)


def load_argument(model, copy: bool = True, name: str = "model") -> LoadedModel:
    """The model a public call was given as `name` (a path or an onnx.ModelProto; anything else
    refused naming it, io.model_argument), to work on: read and checked from a path, or an
    in-memory one checked (a copy unless copy=False)."""
    model = model_argument(model, name)
    if isinstance(model, (str, os.PathLike)):
        return load_checked(model)
    if encoded_size(model) > PROTOBUF_LIMIT:
        raise AutocastError(
            "the model is over 2 GiB in memory, more than protobuf encodes, so it can be neither copied nor "
            "checked (onnx.checker encodes it)",
            "<model>",
            "save it with its weights as external data (onnx.save_model(model, PATH, save_as_external_data=True)) "
            "and convert PATH, which converts a model of any size; autocast_onnx.compat.convert_float_to_float16 "
            "takes such a ModelProto itself",
        )
    proto = _copy_model(model) if copy else model
    typed = check_input(proto)
    return LoadedModel(model=proto, path=None, file_bytes=0, typed_outputs=typed)


def _copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of an in-memory model, so that converting never edits the caller's. Protobuf copies
    by encoding and reading back, which fails for a model that no file could hold (bodies nested
    beyond its 100 message levels): bad input, said as such."""
    from google.protobuf.message import DecodeError

    try:
        return onnx.ModelProto.FromString(model.SerializeToString())
    except DecodeError as exc:
        raise AutocastError(
            f"protobuf cannot read the model back ({exc}): subgraphs nested too deep?",
            "<model>",
            "a model must be one that can be saved and loaded again; flatten deeply nested If/Loop bodies",
        ) from None


# What a replayed plan refuses beside it, since it decides every node: the planning options that
# PlanOptions declares `refused` (plan/options.py), then what was measured on data
_PLANNING_FLAGS = {f.name: f.metadata["flag"] for f in planning_fields() if f.metadata["replay"] == "refused"}
_PLANNING_FLAGS |= {"calibration": "--calibration-data", "force_fp32": "--target"}


def _replayed_plan(plan, options: PlanOptions, measured: dict) -> PrecisionPlan:
    """The plan to replay, after refusing options that would have no effect with it (`measured`:
    calibration and force_fp32, what planning on data gave)."""
    if not isinstance(plan, PrecisionPlan):
        plan = PrecisionPlan.load(plan)
    where = plan.source or "<plan>"
    values = {name: getattr(options, name) for name in PLANNING} | measured
    given = [flag for name, flag in _PLANNING_FLAGS.items() if values.get(name)]
    precision, keep_io_types = options.precision, options.keep_io_types
    if given:
        raise AutocastError(
            f"{', '.join(given)} cannot be combined with --plan: the plan already decides every node",
            where,
            "edit the plan's node precisions instead, or plan afresh without --plan",
        )
    if precision is not None and precision != plan.target:
        raise AutocastError(
            f"--precision {precision.value} contradicts the plan's target {plan.target}",
            where,
            "drop --precision; the plan decides it",
        )
    if keep_io_types is not None and keep_io_types != plan.keep_io_types:
        raise AutocastError(
            f"--{'' if keep_io_types else 'no-'}keep-io-types contradicts the plan "
            f"(keep_io_types = {str(plan.keep_io_types).lower()})",
            where,
            "drop the flag; the plan decides it",
        )
    return plan


class StageError(InternalCheckError):
    """An unexpected exception inside a stage of the conversion (a bug, not bad input), named by
    the stage it happened in: the command line's one-line internal error then says where."""

    def __init__(self, stage: str, exc: BaseException):
        detail = " ".join(str(exc).split())
        kind = "" if isinstance(exc, InternalCheckError) else type(exc).__name__
        said = f"{kind}: {detail}" if kind and detail else (kind or detail)
        super().__init__(f"in stage {stage}: {said}")
        self.stage = stage


# what a stage lets through unchanged: bad input (exit 2), the machine's limit (run_guarded says
# "out of memory"), and a failure already named by an inner stage
_PASS_THROUGH = (AutocastError, MemoryError, StageError)


@contextmanager
def _stage(name: str, timings: dict | None = None, key: str | None = None):
    """Run one named stage of a conversion: logs its start and end (-v), adds its seconds to
    `timings[key]` (the summary's stage times; several stages may share a key), and turns an
    unexpected exception into a StageError that names it. `name` is one the stage lists declare."""
    assert name in _DECLARED, f"stage {name!r} is not declared (pipeline.ENTRY_POINTS, FILE_OPENING, FILE_END)"
    log.debug("stage %s: start", name)
    start = time.perf_counter()
    try:
        yield
    except _PASS_THROUGH:
        raise
    except Exception as exc:
        raise StageError(name, exc) from exc
    seconds = time.perf_counter() - start
    if timings is not None and key is not None:
        timings[key] = timings.get(key, 0.0) + seconds
    log.debug("stage %s: done in %.3f s", name, seconds)


@dataclass
class _Selection:
    """A fresh plan's planning options, read and compiled before any work on the model."""

    rule_set: RuleSet
    exclude_ops: tuple
    include_ops: tuple
    exclude_nodes: list
    include_nodes: list
    calibration: Mapping | None
    force_fp32: object
    strict: bool
    low_precision_io: str | None
    runtime: str | None = None  # --runtime: keep fp32 what that runtime has no low-precision kernel for
    precise: bool = False  # --precise: no fast plan (plan/kernel_io.py)


@dataclass
class _Sizes:
    """Initializer and Constant-node bytes, before and after the rewrite."""

    initializers_before: int
    constants: list
    constants_before: int
    initializers_after: int = 0
    constants_after: int = 0


@dataclass
class _Weights:
    """Where a conversion's converted weights go (convert_file's fast path; all optional).

    `sink` takes each converted payload (io.PayloadSpill: written to the output's external-data
    file as produced; fast.splice.HeldPayloads: held for the save's splice); `screen` is the
    weight screen's worker (fast/screen.py), used when the conversion screens fp16 payloads in
    memory and stopped in any case; `in_memory` says whether converted weights may stay in memory
    until the rewrite stores them (not with a spill, whose point is that they do not)."""

    sink: PayloadSink | None = None
    screen: WeightScreen | None = None
    in_memory: bool = True


def _convert_loaded(
    loaded: LoadedModel,
    *,
    options: PlanOptions,
    check,
    timings,
    calibration=None,
    force_fp32=None,
    plan=None,
    loss_scale=None,
    weights: _Weights | None = None,
    dims: Mapping[str, int] | None = None,
) -> ConversionResult:
    """Convert a loaded model, stage by stage (each logged with -v and named in an unexpected
    error). `weights` says where the converted weights go (convert_file's fast path)."""
    where, model = (str(loaded.path) if loaded.path else "<model>"), loaded.model
    opening = _opening(model, where, plan, options, calibration, force_fp32, loss_scale)
    plan, target, keep_io_types, upgrade = opening.plan, opening.target, opening.keep_io_types, opening.upgrade
    selection, loss_scale = opening.selection, opening.loss_scale
    weights = weights or _Weights()
    screen = weights.screen
    # fp16 payloads converted once, by the data rules' screen, for the rewrite to store; only
    # when the converted weights stay in memory anyway (no spill to an external-data file). The
    # screen runs in a worker on the second core while this process indexes (fast/screen.py).
    converted: dict | None = {} if weights.in_memory and target is Precision.FP16 else None
    if converted is None or plan is not None:
        screen = _stopped(screen)
    try:
        with _no_gc():
            index, training, scale = _indexed(loaded, where, loss_scale, keep_io_types, timings)
            if scale is not None:
                screen = _stopped(screen)  # it screened the model as it was before the scale
            with _stage("measure", timings, "index"):
                low_io = _low_precision_io(index, selection.low_precision_io, training, where) if selection else None
                sizes = _sizes_before(index, loaded, scale)
            with _stage("plan", timings, "plan"):
                shapes = tensor_shapes(model, dims)  # one inference: the output-head rule and the cost report
                work = _work(index, shapes)
                if selection is not None:
                    _screened(screen, loaded, index, converted)
                    planned = (
                        index,
                        selection,
                        target,
                        keep_io_types,
                        training,
                        work,
                        low_io,
                        converted,
                        where,
                        shapes,
                    )
                    plan = _fresh_plan(*planned)
                else:
                    check_plan_fits(plan, index)
                    clamp_forced_constants(index, plan)  # an edited plan may force a node low
            with _stage("apply", timings, "apply"):
                stats = apply_plan(index, plan, sink=weights.sink, converted=converted)
                converted = None
                scaling = (
                    unscale_gradients(model, training, scale) if scale is not None and training is not None else None
                )
            with _stage("measure result"):
                sizes.initializers_after = sizes.initializers_before + stats.initializer_bytes_delta
                sizes.constants_after = _constant_bytes(sizes.constants)
    finally:
        _stopped(screen)
    with _stage("record training"):
        _record_training(plan, training, scaling)
        _record_load(plan, upgrade, loaded)
    with _stage("check", timings, "check" if check != "none" else None):
        _check(model, check)
    return ConversionResult(
        model,
        plan=plan,
        stats=stats,
        initializer_bytes_before=sizes.initializers_before,
        initializer_bytes_after=sizes.initializers_after,
        constant_bytes_before=sizes.constants_before,
        constant_bytes_after=sizes.constants_after,
        seconds=timings,
        training=training,
        loss_scaling=scaling,
        shapes=shapes,
        macs=_typed_work(index, work),
        external_tensors=index.external_tensors,
        speed_source_of=_speed_source_of(index, plan) if shapes is not None else None,
    )


@dataclass
class _Opened:
    """What the opening stages decided (_opening): the plan to replay (None: plan afresh), the
    target precision, keep_io_types, the opset upgrade made, the selections read (None with a
    plan to replay) and the loss scale in force."""

    plan: PrecisionPlan | None
    target: Precision
    keep_io_types: bool
    upgrade: OpsetChange | None
    selection: _Selection | None
    loss_scale: str | float | None


def _opening(model, where: str, plan, options: PlanOptions, calibration, force_fp32, loss_scale) -> _Opened:
    """The stages every entry point (convert, plan_model, replay_model) opens with, declared once
    and in this order: resolve the target (and the plan to replay), upgrade the opset, check it,
    read the selections (a replayed training plan gives its loss scale). Each entry point goes on
    from here to its own end: the plan (plan_model), the plan checked against the index
    (replay_model), or the rewrite and the check (convert)."""
    with _stage("resolve target"):
        measured = {"calibration": calibration, "force_fp32": force_fp32}
        plan, target, keep_io_types = _resolve_target(plan, options, measured)
    with _stage("upgrade opset"):
        upgrade = _upgrade_opset(model, plan, options, where)
    with _stage("check opset"):
        _check_opset(model, target, where)
    with _stage("read options"):
        selection = None if plan is not None else _read_selection(options, calibration, force_fp32)
        if plan is not None and plan.training is not None:
            loss_scale = _replayed_loss_scale(plan, loss_scale)
    return _Opened(plan, target, keep_io_types, upgrade, selection, loss_scale)


def _indexed(loaded: LoadedModel, where: str, loss_scale, keep_io_types: bool, timings: dict | None = None) -> tuple:
    """The stages every entry point goes on with after the opening (INDEXING): index the model,
    then recognise a training graph and set up its loss scale; when the backward seed became the
    scale, the graph is indexed again as it is now. Returns (the index, the training graph or None,
    the scale or None)."""
    with _stage("index", timings, "index"):
        index = _index(loaded, where)
    with _stage("prepare training", timings, "index"):
        training, scale = _training_setup(loaded.model, index, loss_scale, keep_io_types, where)
        if scale is not None:
            index = _index(loaded, where)
    return index, training, scale


def _speed_source_of(index, plan: PrecisionPlan) -> Callable:
    """What the latency estimate reads of the model as read, made on first use (report/speed.py)."""
    made: list = []

    def source():
        if not made:
            from .report.speed import speed_source

            made.append(speed_source(index, plan.precisions))
        return made[0]

    return source


def _resolve_target(plan, options: PlanOptions, measured: dict) -> tuple[PrecisionPlan | None, Precision, bool]:
    """(the plan to replay or None, the target precision, keep_io_types): a replayed plan decides
    the last two, after refusing options that contradict it or would have no effect with it;
    else the options do (fp16 and keep when not given)."""
    if plan is None:
        return None, options.target, True if options.keep_io_types is None else options.keep_io_types
    plan = _replayed_plan(plan, options, measured)
    return plan, plan.target, plan.keep_io_types


def _upgrade_opset(model: onnx.ModelProto, plan, options: PlanOptions, where: str) -> OpsetChange | None:
    """--opset: the model's default-domain opset upgraded in place before anything reads it
    (rewrite/opset.py); None when no upgrade is asked. A replayed plan repeats the upgrade it
    records (its fingerprint is the upgraded model's), and an --opset that differs contradicts it.
    The upgrade compares the upgraded fp32 model with the original and says which upgraded nodes
    the runtime planned for (--runtime; none: ONNX Runtime's CPU provider) cannot run at the target
    precision: its warnings go into the plan (_record_opset)."""
    wanted = options.opset
    target = plan.target if plan is not None else options.target
    runtime = plan.runtime if plan is not None else options.runtime
    if plan is not None:
        recorded = plan.opset["to"] if plan.opset is not None else None
        if wanted is not None and wanted != (recorded if recorded is not None else default_opset(model)):
            made = f"after an upgrade to opset {recorded}" if recorded is not None else "at the model's own opset"
            raise AutocastError(
                f"--opset {wanted} contradicts the plan, which was made {made}",
                plan.source or "<plan>",
                "drop --opset; the plan decides it",
            )
        wanted = recorded
    if wanted is None:
        return None
    folder = Path(where).parent if where != "<model>" else None  # where external data is read from
    return upgrade_opset(model, wanted, where, runtime=runtime, low_type=target.elem_type, base_dir=folder)


def _record_opset(plan: PrecisionPlan, upgrade: OpsetChange | None) -> None:
    """Record the upgrade in a fresh plan (its file and the summary say it); an --opset the model
    already has is said as a plan warning, since it did nothing."""
    if upgrade is None or plan.replayed:
        return
    if upgrade.after > upgrade.before:
        plan.opset = upgrade.to_dict()
        flag = f"--opset {upgrade.after}"
        plan.warnings.extend(PlanWarning("opset", f"{flag}: {w.message}", w.node) for w in upgrade.warnings)
    else:
        said = f"--opset {upgrade.after}: the model is already at opset {upgrade.after}; nothing upgraded"
        plan.warnings.append(PlanWarning("opset", said))


def _record_load(plan: PrecisionPlan, upgrade: OpsetChange | None, loaded: LoadedModel) -> None:
    """Say in a fresh plan what the load changed: the opset upgrade (_record_opset) and the graph
    outputs it typed (graph/sanity.type_untyped_outputs)."""
    _record_opset(plan, upgrade)
    if not plan.replayed:
        plan.warnings.extend(PlanWarning("untyped-output", note) for note in loaded.typed_outputs)


def _check_opset(model: onnx.ModelProto, target: Precision, where: str) -> None:
    """Refuse a model whose default-domain opset has no Cast to the target type."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset < MIN_OPSET[target]:
        raise AutocastError(
            f"default-domain opset {opset} cannot express {target} casts (needs opset >= {MIN_OPSET[target]})",
            where,
            f"pass --opset {MIN_OPSET[target]} (or higher) to upgrade it first; "
            "autocast-onnx never changes the opset unasked",
        )


def _read_selection(options: PlanOptions, calibration, force_fp32) -> _Selection:
    """A fresh plan's options, read and compiled: the rule files, the node patterns (the op types
    and patterns were checked when the PlanOptions was made)."""
    return _Selection(
        rule_set=load_rules(list(options.rules)),
        exclude_ops=options.exclude_ops,
        include_ops=options.include_ops,
        exclude_nodes=compile_patterns(options.exclude_nodes, "--exclude-node"),
        include_nodes=compile_patterns(options.include_nodes, "--include-node"),
        calibration=calibration,
        force_fp32=force_fp32,
        strict=options.strict,
        low_precision_io=options.low_precision_io,
        runtime=options.runtime,
        precise=bool(options.precise),
    )


def _stopped(screen: WeightScreen | None) -> WeightScreen | None:
    """Stop the weight screen if it runs: returns None (no screen), for `screen = _stopped(screen)`."""
    if screen is not None:
        screen.close()
    return None


def _index(loaded: LoadedModel, where: str):
    return build_index(loaded.model, where, loaded.path.parent if loaded.path else None, loaded.external_checked)


def _sizes_before(index, loaded: LoadedModel, scale) -> _Sizes:
    """Initializer and Constant bytes of the input (the payloads left in the file measured by the
    loader, unless the loss scaling changed the model)."""
    left = loaded.left_in_file
    constants = [n for n in index.nodes if n.op == "Constant" and n.domain == ""]
    return _Sizes(
        initializers_before=_initializer_bytes(index, left.sizes() if left is not None and scale is None else None),
        constants=constants,
        constants_before=_constant_bytes(constants),
    )


def _work(index, shapes) -> list | None:
    """(node id, multiply-accumulates) per MatMul/Gemm/Conv of the main graph; None without shapes."""
    if shapes is None:
        return None
    return [(n.id, macs_of(n.proto, shapes)) for n in index.main.nodes if n.op in MAC_OPS and n.outputs]


def _typed_work(index, work) -> list | None:
    """The cost report's work: (node id, multiply-accumulates, the element type the node computed
    in before the conversion, its first output's), so that a node the plan leaves unchanged in
    fp16 counts as low precision."""
    if work is None:
        return None
    nodes = index.nodes
    return [(i, m, nodes[i].outputs[0].dtype if nodes[i].outputs[0] is not None else None) for i, m in work]


def _screened(screen: WeightScreen | None, loaded: LoadedModel, index, converted: dict | None) -> None:
    """Put into `converted` (classify's cache) the main graph's initializers the weight screen
    converted and found to lose nothing; those that lost range are left to classification's data
    rules, which convert and judge them again."""
    if screen is None or converted is None:
        return
    screened = screen.results(loaded.model, index.main.initializer_names, left_in_file=loaded.left_in_file)
    if screened is None:
        return
    values = index.main.values
    for name, (payload, lost) in screened.items():
        if not lost:
            converted[id(values[name].initializer)] = payload


def _fresh_plan(index, selection: _Selection, target, keep_io_types, training, work, low_io, converted, where, shapes):
    """Classify every node and paint the precision plan (with --strict, a selector that matches
    no node is an error); `shapes` (graph/shapes.py, None when not inferred) sizes the reasons."""
    head = training is None or not training.has_backward
    macs = {index.nodes[i].outputs[0].name: m for i, m in work} if work is not None else None
    classification = classify(
        index,
        selection.rule_set,
        target,
        exclude_ops=selection.exclude_ops,
        exclude_nodes=selection.exclude_nodes,
        include_nodes=selection.include_nodes,
        include_ops=selection.include_ops,
        ranges=selection.calibration,
        force_fp32=selection.force_fp32,
        output_head=head,
        macs=macs,
        converted=converted,
        runtime=selection.runtime,
    )
    unmatched = [m for c, m, _ in classification.warnings if c == UNMATCHED]
    if selection.strict and unmatched:
        more = f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1 else ""
        raise AutocastError(unmatched[0] + more, where, "fix the selector or drop it; without --strict it is a warning")
    low_names, low_notes = low_io
    plan = paint(
        index,
        classification,
        target,
        keep_io_types,
        selection.rule_set.files,
        order=global_order(index),
        low_precision_io=low_names,
        runtime=selection.runtime,
        shapes=shapes,
        fast=not selection.precise and head,  # a training graph's backward reads the forward's tensors: precise
    )
    plan.rule_sha256 = list(selection.rule_set.digests)  # the provenance record names them (rewrite/provenance.py)
    plan.warnings.extend(PlanWarning("low-precision-io", note) for note in low_notes)
    plan.runtime = selection.runtime if selection.runtime not in (None, "any") else None
    plan.kernels = selection.runtime or "cuda"  # whose kernels pass 6 counted on (None: the design's)
    context = islands.context_of(plan.kernels, not selection.precise and head, plan.target.elem_type or 0)
    plan.set_islands(lambda: islands.find(index, plan, context, shapes))
    if Seed.ALLOW in classification.seeds:  # a node forced low may read an out-of-range constant
        clamp_forced_constants(index, plan, direct=False)
    warn_little_conversion(index, plan, work)  # most of the MatMul/Gemm/Conv work left fp32
    warn_schema_limits(index, selection.rule_set, plan)  # other ops a later opset would let convert
    if plan.runtime is None:
        warn_cuda_fallbacks(index, plan)  # nodes planned low that the commonest GPU runtime would run on its CPU
    return plan


def _record_training(plan: PrecisionPlan, training, scaling) -> None:
    """Record in the plan what kind of training graph was converted and its loss scaling."""
    if training is None:
        return
    plan.training = {"kind": training.kind, "graph": training.describe(), "losses": list(training.losses)}
    plan.training["parameters"] = list(training.parameters)
    plan.training["loss_scaling"] = scaling.to_dict() if scaling else {"mode": training.loss_scale or "none"}


def _check(model: onnx.ModelProto, check: str) -> None:
    """The output check at the level asked (CHECKS)."""
    if check not in CHECKS:
        raise AutocastError(f"unknown check level {check!r}", "--check", "use full, basic or none")
    if check != "none":
        check_result(model, full=check == "full")


def _low_precision_io(index, pattern: str | None, training, where: str) -> tuple[list[str], list[str]]:
    """The model inputs and outputs whose whole name matches `pattern` (--low-precision-io), in
    graph order, float32 ones only; and a note per other match, which is left as it is. A pattern
    that matches no float32 input or output is an error."""
    if pattern is None:
        return [], []
    (regex,) = compile_patterns([pattern], "--low-precision-io")
    main = index.main
    ports = [("input", v) for v in main.inputs if v.initializer is None] + [("output", v) for v in main.outputs]
    matched = [(kind, v) for kind, v in ports if v is not None and regex.fullmatch(v.name)]
    if training is not None and matched:
        raise AutocastError(
            "--low-precision-io would give the inputs or outputs of this training graph a low-precision type; "
            "its parameters and gradients stay fp32 (master weights)",
            where,
            "drop --low-precision-io",
        )
    floats = [v.name for _, v in matched if v.dtype == FLOAT]
    if not floats:
        others = ", ".join(f"{kind} '{v.name}' ({dtype_name(v.dtype)})" for kind, v in matched[:3])
        names = ", ".join(v.name for _, v in ports if v is not None)
        raise AutocastError(
            f"--low-precision-io {pattern!r} matches no float32 model input or output"
            + (f" (only {others})" if others else f" (the model's are: {_clip(names)})"),
            where,
            "fix the regex; it must match whole names",
        )
    notes = [
        f"--low-precision-io matches {kind} '{v.name}', which is {dtype_name(v.dtype)}, not float32: left as it is"
        for kind, v in matched
        if v.dtype != FLOAT
    ]
    return list(dict.fromkeys(floats)), notes


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _replayed_loss_scale(plan: PrecisionPlan, loss_scale):
    """The loss scaling a replayed plan was made with (the plan's model fingerprint covers it)."""
    training = plan.training or {}
    scaling = training.get("loss_scaling", {})
    if training.get("kind") != "ort-training" or (scaling.get("mode", "none") != "none" and "output" not in scaling):
        return loss_scale  # no backward seed, or the scaling was already in the model
    made = scaling.get("mode", "none")
    if loss_scale is not None and str(parse_loss_scale(loss_scale)) != made:
        raise AutocastError(
            f"--loss-scale {loss_scale} contradicts the plan's loss scaling ({made})",
            plan.source or "<plan>",
            "drop --loss-scale; the plan decides it",
        )
    return made


def _training_setup(model, index, loss_scale, keep_io_types, where: str):
    """Recognise a training graph and prepare its loss scaling: returns the TrainingGraph (None
    for an inference graph) and the LossScale to finish after the plan is applied (None: none;
    otherwise the model was changed and must be indexed again)."""
    training = recognise(model) if might_be_training(index, model) else None
    scale = parse_loss_scale(loss_scale) if loss_scale is not None else None
    if scale is not None:
        refuse_loss_scale(training, scale, where)
    if training is None or not training.has_backward:
        return training, None
    if keep_io_types is False:
        raise AutocastError(
            "--no-keep-io-types would make the parameters of this training graph low-precision graph inputs; "
            "training keeps fp32 master weights (the checkpoint and the optimizer hold fp32)",
            where,
            "drop --no-keep-io-types",
        )
    if training.loss_scale is not None:  # converted before (refuse_loss_scale refused an explicit scale)
        return training, None
    if training.kind != "ort-training" or training.seed is None:
        return training, None
    scale = scale or LossScale("dynamic")
    if scale.mode == "none":
        return training, None
    seed_loss_scale(model, training, scale)
    return training, scale


def default_output_path(in_path: Path, precision: str) -> Path:
    return in_path.with_name(f"{in_path.stem}.{precision}{in_path.suffix or '.onnx'}")


def convert_file(
    in_path, out_path=None, *, plan_out=None, external_data=None, search_log=None, **options
) -> ConversionResult:
    """Convert the model at `in_path` and write it atomically to `out_path` (default: beside the
    input as NAME.fp16.onnx). Never writes over the input. `search_log` (from plan_on_data's
    --target search) is recorded in the plan. The other keywords are convert's: the planning
    options as keywords or one `options` object, turned into a PlanOptions here, once. `in_path`
    is a path (str or pathlib.Path): this reads the model's file, and copies its external data
    file to file; convert() converts a ModelProto."""
    in_path = Path(model_argument(in_path, "in_path", in_memory=False))
    options = _api_options(options)
    precision = options["options"].target.value
    if options.get("plan") is not None and options["options"].precision is None:
        plan = options["plan"]
        options["plan"] = plan = plan if isinstance(plan, PrecisionPlan) else PrecisionPlan.load(plan)
        precision = plan.target.value
    check_model_path(in_path)  # not found, a directory, a device or FIFO: refused before anything reads it
    # checked as given: Path() drops the separator of 'out/', a file output spelled as a folder
    given = out_path if out_path else default_output_path(in_path, precision)
    check_outputs([("-o", given), ("--plan-out", plan_out)], [in_path], models=["-o"])
    check_output_path(given, in_path)
    out_path = Path(given)
    start = time.perf_counter()
    # the data rules' weight screen, in a worker that parses the file beside this process
    # (not with --opset: an upgraded model is a new one, and the screen's payloads are the file's)
    plain = options.get("plan") is None and options["options"].opset is None
    screen = WeightScreen.start(in_path) if plain and str(precision) == "fp16" and external_data is not True else None
    try:
        return _convert_file(in_path, out_path, plan_out, external_data, search_log, screen, start, options)
    except Exception as exc:
        if not isinstance(exc, AutocastError):
            blame_input(in_path)  # a malformed input is the input's fault (exit 2), not a bug
            blame_input_for(exc, in_path, str(in_path))  # so is a checker refusal the input shares
        raise
    finally:
        if screen is not None:
            screen.close()


@dataclass
class _Output:
    """How the converted model is written: decided from the loaded input before converting."""

    external_data: bool | None  # None: as the size decides (save_model)
    big: bool  # checked by reading the written file back, not in memory
    stream: bool  # a FIFO or device, written in place
    in_memory: bool  # serialized once, for the check and the file
    left: LeftInFile | None  # payloads still in the input file, read back before the save
    spill: PayloadSpill | None  # the external-data file the rewrite writes converted payloads to
    held: HeldPayloads | None  # converted payloads the save splices into the file's bytes


def _convert_file(in_path, out_path, plan_out, external_data, search_log, screen, start, options) -> ConversionResult:
    """convert_file's work, stage by stage: load, choose how to write, convert, read back the
    weights kept in the input, serialize, save, check the written files, write the plan."""
    timings: dict = {}
    with _stage("load", timings, "load"):
        loaded = _load_checked(in_path, screen, onnx_checker=options.get("check") == "none")
    check = options.pop("check", "basic")
    with _stage("choose output"):
        _refuse_overwriting_inputs(in_path, loaded.external_files, out_path, plan_out)
        output = _choose_output(loaded, in_path, out_path, external_data, check)
    try:
        result = _convert_loaded(
            loaded, check="none" if (output.big or output.in_memory or output.spill) else check, timings=timings,
            weights=_Weights(output.spill or output.held, screen, in_memory=output.spill is None),
            **_api_options(options),
        )  # fmt: skip
    except BaseException:
        if output.spill is not None:
            output.spill.discard()
        raise
    with _stage("read back kept weights"):
        _read_back(result, output)
    serialized: dict = {}  # the payload is handed over, not kept here: save_model lets go of it
    t_save = time.perf_counter()  # the serialization is part of the save
    with _stage("serialize"):
        verify = _serialize(result, output, check, timings, serialized) if output.in_memory else None
    with _stage("save"):
        _save(result, in_path, out_path, output, serialized, verify)
    # a model in one piece was checked inside the save: its time is counted once, as check
    timings["save"] = time.perf_counter() - t_save - timings.get("check", 0.0)
    if check != "none" and (output.big or output.spill is not None):  # the weights are on disk
        with _stage("check written files", timings, "check"):
            check_file(out_path, full=check == "full")
    with _stage("write plan"):
        _write_plan(result, search_log, plan_out)
    timings["total"] = time.perf_counter() - start
    return result


def _load_checked(in_path: Path, screen: WeightScreen | None, onnx_checker: bool) -> LoadedModel:
    """Load the model and refuse a malformed one before any work (graph/sanity.py)."""
    # External data stays on disk until a tensor is needed (and unchanged tensors are copied
    # across file to file), so memory follows the weights that are converted, not the model.
    # With the weight screen running (a model in memory, fp16), the main graph's fp32 payloads are
    # left in the input file: the screen's worker converts them from it, so the rewrite never needs
    # them in memory, and those kept fp32 are read back before the save.
    with _no_gc():  # the walk of a large file makes an object per initializer: no full collections meanwhile
        # the worker's walk of the file, when the screen has one
        leaving = in_file.parser(screen.encoding) if screen is not None else None
        loaded = load_model(in_path, load_external=False, parse=leaving)
        # onnx.checker's look at the nodes is the output check's, unless there is none (convert_file
        # blames the input then)
        loaded.typed_outputs = check_input(
            loaded.model,
            str(in_path),
            in_path.parent,
            onnx_checker=onnx_checker,
            left_in_file=loaded.left_in_file,  # checked by the loader against its parse: not twice
        )
    return loaded


def _choose_output(loaded: LoadedModel, in_path: Path, out_path: Path, external_data, check: str) -> _Output:
    """How to write the converted model: in one piece or with external data, checked in memory or
    from the written file; refuses what a FIFO or device output cannot give."""
    # A converted model is at most 1.5x its input (fp16 copies of fp32 weights), so the file size
    # tells whether the checker can take it in memory without serializing it to find out.
    big = loaded.external_data or loaded.file_bytes * 1.5 > CHECK_LIMIT
    stream = output_kind(out_path) == "stream"
    if stream:
        _refuse_stream_output(loaded, out_path, external_data, big, check)
    if external_data is None:
        external_data = True if loaded.external_data else (None if big else False)
    # Serialize once for the check and the file when the model is written in one piece.
    in_memory = not big and not external_data
    left = loaded.left_in_file
    if left is not None and not in_memory:  # payloads left in the file are for a model written in one piece
        left.inline()
        left = None
    # an external-data output receives the converted weights as they are produced (memory does not
    # grow with them); the file stays a temporary until save_model renames it
    spill = None
    if external_data and not stream:
        check_output_path(out_path, in_path)  # the folder exists and is writable before the spill opens there
        spill = PayloadSpill(out_path)
    # a model written in one piece: the payloads converted in place stay where they were converted
    # until the save splices them into the file's bytes (splice.py)
    held = HeldPayloads() if in_memory else None
    return _Output(external_data, big, stream, in_memory, left, spill, held)


def _refuse_stream_output(loaded: LoadedModel, out_path: Path, external_data, big: bool, check: str) -> None:
    """A FIFO or device is written in place: no data file beside it, nothing to read back."""
    if external_data or (external_data is None and loaded.external_data):
        raise AutocastError(
            "cannot write external data beside a FIFO or device",
            str(out_path),
            "write the model to a regular file, or pass --no-external-data",
        )
    if big and check != "none":
        raise AutocastError(
            "a model this large is checked by reading the written file back, which a FIFO or device cannot give",
            str(out_path),
            "write it to a regular file, or pass --check none",
        )


def _read_back(result: ConversionResult, output: _Output) -> None:
    """Give their tensors the fp32 payloads the conversion kept in the input file, and the held
    payloads too when the save has external tensors to read in (it serializes the model itself)."""
    if output.left is not None:  # the fp32 payloads the conversion kept, read back from the input file
        result.external_tensors -= len(output.left)  # the index counted them as external
        output.left.inline()
    if output.held is not None and result.external_tensors > 0:
        output.held.inline()  # the save reads external tensors in and serializes the model itself


def _serialize(result: ConversionResult, output: _Output, check: str, timings: dict, serialized: dict):
    """Serialize a model written in one piece once, for the file and the check, into
    `serialized["payload"]`; returns the check for save_model to run while the bytes are written
    (None: no check, or a FIFO or device, checked here before writing since it cannot be read back)."""
    held = output.held
    # the splice makes an object per held tensor: no collector
    with _no_gc():
        if held:  # with the stand-in the check reads: the weights as inputs (splice.py)
            serialized["payload"], stand_in = held.serialize_with_stand_in(result.model)
        else:
            serialized["payload"], stand_in = result.model.SerializeToString(), None
    if check == "none":
        return None
    checker = functools.partial(check_result, full=check == "full")
    if output.stream:
        with _stage("check", timings, "check"):
            check_with_stand_in(checker, serialized["payload"], stand_in)
        return None

    # while a thread writes the bytes: a write slowed by the page cache hides behind the check
    # (docs/benchmarks.md). The checker reads the stand-in when there is one: the same bytes with
    # the large converted weights as inputs, so it copies no weight again
    def verify(payload: bytes | PiecesLike) -> None:
        with _stage("check", timings, "check"):
            check_with_stand_in(checker, payload, stand_in)

    return verify


def _save(result: ConversionResult, in_path: Path, out_path: Path, output: _Output, serialized: dict, verify) -> None:
    """Write the converted model (and its data file) atomically; a spill the save did not take is
    removed. Payloads still held are given to their tensors when the caller reads result.model."""
    try:
        result.output_files = save_model(
            result.model,
            out_path,
            external_data=output.external_data,
            in_path=in_path,
            payload=serialized.pop("payload", None),
            source_dir=in_path.parent,
            restore=not output.external_data,
            spill=output.spill,
            find_external=result.external_tensors > 0,
            verify=verify,
        )
    finally:
        if output.spill is not None and output.spill.path.exists():  # save failed before renaming it
            output.spill.discard()
    if output.held:
        result._held = output.held  # given to the tensors if the caller reads result.model


def _write_plan(result: ConversionResult, search_log, plan_out) -> None:
    """Record the --target search in the plan and write it (--plan-out); a plan that cannot be
    written removes the model files this call wrote (all or nothing)."""
    if search_log is not None:
        result.plan.search = {k: v for k, v in search_log.items() if k != "attribution"} | {
            "attribution": {k: (v if math.isfinite(v) else None) for k, v in search_log.get("attribution", {}).items()}
        }
    if plan_out is not None:
        try:
            result.plan.save(plan_out)
        except AutocastError:
            for written in result.output_files:  # all or nothing (only files this call created)
                if Path(written).is_file():
                    Path(written).unlink(missing_ok=True)
            raise


def _refuse_overwriting_inputs(in_path: Path, external_files, out_path: Path, plan_out=None) -> None:
    """The output model, its data file and the plan must not be any file the input consists of."""
    inputs = {(in_path.parent / f).resolve() for f in external_files} | {in_path.resolve()}
    targets = [out_path, out_path.with_name(out_path.name + ".data")]
    if plan_out is not None and not is_stdout(plan_out):
        targets.append(Path(plan_out))
    for target in targets:
        if target.resolve() in inputs:
            raise AutocastError(
                f"writing {target.name} would overwrite a file of the input model",
                str(target),
                "choose another -o; autocast-onnx never modifies its input",
            )


def _api_options(options: dict) -> dict:
    """convert_file's keywords as _convert_loaded takes them: the planning options (PlanOptions'
    fields as keywords, or a PlanOptions as `options`) made into one PlanOptions, the others as
    given. Made once: a dict this returned comes back unchanged. An unknown keyword is a
    TypeError, as in a call."""
    unknown = set(options) - _CONVERT_KEYWORDS - set(PLANNING)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    planning, rest = plan_options_in(options, "convert_file")
    return rest | {"options": planning}


# convert's keywords besides the planning options (those of convert_file's **options)
_CONVERT_KEYWORDS = {"options", "check", "calibration", "force_fp32", "plan", "loss_scale", "dims"}
