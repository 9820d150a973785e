"""Stage: validate. Runs the reference and the converted model on the same batches, compares
every output, measures speed, and returns the report as a plain dict (see
docs/validate-report.schema.json)."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any

import onnx

from .._version import __version__
from ..dtypes import MIXABLE, dtype_name
from ..errors import AutocastError
from ..graph import build_index
from ..graph.sanity import load_checked
from ..io import PROTOBUF_LIMIT, LoadedModel, encoded_size
from . import generation, runner
from .emulate import emulation_model, session_as_is
from .fusion import has_qdq, output_step_notes, quantized_report
from .inputs import (
    describe_batch,
    describe_inputs,
    generate,
    load_batches,
    plan_inputs,
    refuse_saving_sequences,
    save_batches,
)
from .masks import Padding
from .metrics import RELATIVE_FLOOR, OutputStats, Thresholds, verdict
from .options import ValidateOptions
from .polygraphy_json import is_json

SCHEMA_VERSION = 1
CPU_SPEED_NOTE = (
    "measured on CPU: ONNX Runtime's CPU provider has few fp16 kernels and adds casts around the "
    "rest, so fp16 speed on CPU says nothing about speed on a GPU"
)


@dataclass(frozen=True)
class _Loaded:
    """One model of the comparison: the parsed model, its path (None for an in-memory model) and size."""

    model: onnx.ModelProto
    path: str | None
    bytes: int


@dataclass(frozen=True)
class _Sessions:
    """The ONNX Runtime sessions of one comparison."""

    reference: Any
    converted: Any  # the numbers come from this one: the emulation, or the converted model as is
    timed: Any  # the converted model as is, for the speed measurement (None: not timed)
    not_loaded: str | None  # why the converted model as is has no session, or None
    reference_timed: Any = None  # the reference as ONNX Runtime optimizes it, when `reference` is not (timed)


def _load(model) -> _Loaded:
    """The model to validate: a path read and checked; a ModelProto checked on a copy (never edited),
    as convert checks one (pipeline.load_argument), so that a malformed one is refused in one line."""
    if isinstance(model, onnx.ModelProto):
        from ..pipeline import load_argument

        return _Loaded(load_argument(model, True).model, None, encoded_size(model))
    loaded = model if isinstance(model, LoadedModel) else load_checked(model)  # a command's, read once
    assert loaded.path is not None
    size = loaded.file_bytes + sum(os.path.getsize(loaded.path.parent / f) for f in loaded.external_files)
    return _Loaded(loaded.model, str(model) if not isinstance(model, LoadedModel) else loaded.shown, size)


def _bar(progress, label: str, total: int):
    """A progress bar for a long step, or None without `progress`."""
    return progress(label, total) if progress else None


def _tick(bar, finish: bool = False) -> None:
    if bar:
        bar.update(1)
        if finish:
            bar.finish()


def precision_by_op(model: onnx.ModelProto, where: str = "<model>") -> dict:
    """op type -> {compute type: node count} of a model, read from its tensor types."""
    index = build_index(model, where)
    out: dict = {}
    for node in index.nodes:
        kind = "none"
        for value in list(node.outputs) + list(node.inputs):
            if value is not None and value.dtype in MIXABLE:
                kind = dtype_name(value.dtype)
                break
        out.setdefault(node.op, {}).setdefault(kind, 0)
        out[node.op][kind] += 1
    return dict(sorted(out.items()))


def validate(reference, converted, options: ValidateOptions | None = None, progress=None) -> dict:
    """Compare `converted` against `reference` (paths or ModelProtos). `progress(label, n)` is
    called to report long loops (it returns an iterable wrapper), or None.

    The stages, in order: load both models, resolve the device and the numerics, plan the input
    batches, open the sessions, compare every output batch by batch, compare a greedy
    continuation (causal LMs), judge each output, measure speed, and assemble the report."""
    options = options or ValidateOptions()
    ref, conv = _load(reference), _load(converted)
    device, device_note = runner.resolve_device(options.device)
    numerics = _resolve_numerics(options.numerics, device)
    specs, plan = _input_plan(ref, conv, options)
    lm = generation.recognise(ref.model)
    cached = lm is not None and lm.has_cache and not lm.fixed_cache and not options.inputs
    batches = [] if cached else _given_batches(specs, plan, options)
    sessions = _sessions(ref, conv, device, numerics, timed(options, device), progress)
    if cached and lm is not None:
        batches = _cached_batches(lm, sessions.reference, plan, options)
    names = _output_names(sessions, conv, options)
    by_op = precision_by_op(conv.model, conv.path or "<converted>")
    quantized = _quantized(ref, conv, numerics)
    padding = Padding(ref.model, options.compare_padded)
    stats = _compare(sessions, batches, names, options, progress, padding, relative_floor(by_op))
    continuation, continuation_skipped = _continuation(lm, sessions, options, progress)
    outputs = _verdicts(stats, options.thresholds)
    if quantized is not None:
        quantized["notes"].extend(output_step_notes(ref.model, outputs))
    warnings = _hollow_comparison(ref.model, ref.path, conv.model, conv.path, by_op, batches, specs, outputs)
    speed, speed_skipped = _speed(sessions, batches, device, options, progress)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "autocast-onnx", "version": __version__},
        "reference": {"path": ref.path, "bytes": ref.bytes},
        "converted": {"path": conv.path, "bytes": conv.bytes},
        "size_ratio": conv.bytes / ref.bytes if ref.bytes else None,
        "device": device,
        "device_note": device_note,
        "numerics": numerics,
        "inputs": _inputs_report(plan, batches, specs),
        "thresholds": options.thresholds.as_dict(),
        "compare_padded": options.compare_padded,
        "outputs": outputs,
        "warnings": warnings,
        "strict": options.strict,
        "passed": all(o["passed"] for o in outputs) and not (options.strict and warnings),
        "generation": continuation,
        "generation_skipped": continuation_skipped,
        "speed": speed,
        "speed_skipped": speed_skipped,
        "precision_by_op": by_op,
        "quantized": quantized,
    }


def _resolve_numerics(requested: str, device: str) -> str:
    """auto -> plain on CUDA (the GPU rounds as it will in use), emulate elsewhere."""
    numerics = requested
    if numerics == "auto":
        numerics = "plain" if device == "cuda" else "emulate"
    if numerics not in ("emulate", "plain"):
        raise AutocastError(f"unknown numerics {numerics!r}", "--numerics", "use auto, emulate or plain")
    return numerics


def _input_plan(ref: _Loaded, conv: _Loaded, options: ValidateOptions):
    """(the reference's input specs, the plan of generated inputs), after checking that the
    converted model takes every input the reference takes."""
    specs = describe_inputs(ref.model)
    conv_specs = {s.name: s for s in describe_inputs(conv.model)}
    missing = [s.name for s in specs if s.name not in conv_specs]
    if missing:
        raise AutocastError(
            f"the converted model lacks input(s) {', '.join(missing)} of the reference",
            conv.path or "<converted>",
            "compare a model with its own conversion",
        )
    check_save_inputs(specs, options)
    return specs, plan_inputs(specs, options.dims, options.ranges)


def check_save_inputs(specs: list, options: ValidateOptions) -> None:
    """--save-inputs writes the generated batches, every one to a Polygraphy .json file or one to an
    .npz: refused with --inputs (nothing is generated), with several batches for an .npz (one
    archive is one batch for --inputs) and for a model with a sequence input (either file holds
    arrays only)."""
    if not options.save_inputs:
        return
    if options.inputs:
        raise AutocastError(
            "--save-inputs has no effect with --inputs (nothing is generated)", "--save-inputs", "drop one of them"
        )
    json_file = is_json(options.save_inputs)
    if options.batches > 1 and not json_file:
        raise AutocastError(
            f"--save-inputs writes one batch, and --batches is {options.batches}: an .npz holds one",
            "--save-inputs",
            "save every batch to a Polygraphy input file, --save-inputs FILE.json, or one at a time: batch k of "
            "--seed S is --batches 1 --seed S+k",
        )
    refuse_saving_sequences([s.name for s in specs if s.sequence], options.save_inputs)


def _given_batches(specs, plan, options: ValidateOptions) -> list:
    """The batches of --inputs, or generated ones from the plan and the seed."""
    if not options.inputs:
        return _saved([generate(plan, seed=options.seed + k) for k in range(max(1, options.batches))], options)
    batches = load_batches(options.inputs, specs)
    plan.source = str(options.inputs)
    plan.dims, plan.dim_defaults = {}, []  # the arrays' own shapes apply (see inputs.specs)
    return batches


def _cached_batches(lm, ref_sess, plan, options: ValidateOptions) -> list:
    """A causal LM with a KV cache: a cache is realistic only when a model wrote it, so the
    reference reads a prompt with an empty cache, and its cache comes back with new tokens (in
    the converted model's types)."""
    batches = [
        generation.cached_batch(
            lm,
            ref_sess,
            lm.batch or generation.BATCH,
            generation.PROMPT_LENGTH,
            generation.NEW_TOKENS,
            options.seed + k,
        )
        for k in range(max(1, options.batches))
    ]
    plan.source = (
        f"generated for a causal LM with a KV cache: the reference's cache of a {generation.PROMPT_LENGTH}-token "
        f"prompt, then {generation.NEW_TOKENS} new tokens"
    )
    plan.dims, plan.dim_defaults = {}, []
    return _saved(batches, options)


def _saved(batches: list, options: ValidateOptions) -> list:
    """`batches`, after writing them to --save-inputs when asked (before any model runs on them,
    so that a run that fails can be replayed with --inputs); precheck holds an .npz to one batch."""
    if options.save_inputs:
        save_batches(options.save_inputs, batches)
    return batches


def _fed(feeds: dict, options: ValidateOptions) -> str:
    """What a batch held, for the error line of a run that fails: its shapes and value ranges."""
    source = f"the batch of {options.inputs}" if options.inputs else "generated inputs"
    saved = f" (saved to {options.save_inputs})" if options.save_inputs else " (--save-inputs FILE.npz keeps them)"
    return f"{source}{'' if options.inputs else saved}: {describe_batch(feeds)}"


def _sessions(ref: _Loaded, conv: _Loaded, device: str, numerics: str, speed: bool, progress) -> _Sessions:
    """Both models in ONNX Runtime, from the file when there is one (serializing a large parsed
    model again costs seconds); with emulated numerics, the converted model's fp32 emulation
    gives the numbers and the model as is must still load."""
    loading = _bar(progress, "loading both models into ONNX Runtime", 1)
    ref_source = ref.path if ref.path else ref.model.SerializeToString()
    unfused = _unfused_reference(ref, numerics)
    ref_sess = runner.session(ref_source, device, optimize=not unfused, label=_REF_LABEL, where=ref.path)
    if numerics == "emulate":
        sessions = _emulated_sessions(ref_sess, conv, device, speed)
        if unfused and speed:  # timed as it runs in use
            timed_ref = runner.session(ref_source, device, label=_REF_LABEL, where=ref.path)
            sessions = dataclasses.replace(sessions, reference_timed=timed_ref)
    else:
        conv_sess = runner.session(
            conv.path if conv.path else conv.model.SerializeToString(), device, label=_CONV_LABEL, where=conv.path
        )
        sessions = _Sessions(ref_sess, conv_sess, conv_sess, None)
    _tick(loading, finish=True)
    return sessions


_REF_LABEL, _CONV_LABEL = "the reference model", "the converted model"


def _unfused_reference(ref: _Loaded, numerics: str) -> bool:
    """Whether the reference runs without ONNX Runtime's graph optimizations: a Q/DQ model
    compared with an emulation. The emulation computes each DequantizeLinear, op and
    QuantizeLinear as ONNX defines them (fp32 arithmetic, exact on the int8 values); the CPU
    provider's fused int8 kernels (QLinearConv, ...) requantize with a rounding of their own, a
    quantization step away at places, which would show as error of the conversion."""
    return numerics == "emulate" and has_qdq(ref.model)


def _quantized(ref: _Loaded, conv: _Loaded, numerics: str) -> dict | None:
    """The report's `quantized` section (validate/fusion.py) when either model holds Q/DQ
    nodes, else None; it says how the reference ran when that differs from a plain session."""
    if not (has_qdq(ref.model) or has_qdq(conv.model)):
        return None
    report = quantized_report(
        ref.model, ref.path or ref.model, conv.model, conv.path or conv.model, conv.path or "<converted>"
    )
    if _unfused_reference(ref, numerics):
        report["notes"].append(
            "the reference ran without ONNX Runtime's graph optimizations, as the emulation does: its fused int8 "
            "kernels round differently from the Q/DQ arithmetic ONNX defines"
        )
    return report


def _emulated_sessions(ref_sess, conv: _Loaded, device: str, speed: bool) -> _Sessions:
    try:
        emulated = emulation_model(conv.model, conv.path or "<converted>")
    except (ValueError, TypeError) as exc:  # a malformed tensor (e.g. data shorter than its dims)
        raise AutocastError(
            f"cannot build the fp32 emulation of the converted model: {exc}",
            conv.path,
            "check the converted model with onnx.checker; convert it again",
        ) from None
    conv_sess = runner.session(
        emulated.SerializeToString(), "cpu", optimize=False, label=f"the emulation of {_CONV_LABEL}", where=conv.path
    )
    # the numbers come from the emulation, but the model itself must load: one ONNX Runtime
    # refuses fails here as in a plain comparison, never PASSes
    real_conv, not_loaded = session_as_is(conv.model, conv.path, device, _CONV_LABEL)
    return _Sessions(ref_sess, conv_sess, real_conv if speed else None, not_loaded)


def _output_names(sessions: _Sessions, conv: _Loaded, options: ValidateOptions) -> list:
    """The outputs both models share (the same names, in the same order), after checking
    --class-output against them."""
    ref_names = [o.name for o in sessions.reference.get_outputs()]
    conv_names = [o.name for o in sessions.converted.get_outputs()]
    if ref_names != conv_names:
        raise AutocastError(
            "the models' outputs differ: " + ", ".join(ref_names) + " vs " + ", ".join(conv_names),
            conv.path or "<converted>",
            "compare a model with its own conversion",
        )
    check_output_names(options, ref_names, None)
    return ref_names


def check_output_names(options: ValidateOptions, outputs: list, where: str | None) -> None:
    """Refuse a --class-output, or an output's own threshold (--rtol NAME=X, ...), that names no
    output of the model."""
    unknown = set(options.class_outputs) - set(outputs)
    if unknown:
        raise AutocastError(
            f"--class-output names unknown output(s): {', '.join(sorted(unknown))}",
            where,
            "outputs are: " + ", ".join(outputs),
        )
    for name, own in options.thresholds.per_output.items():
        if name not in outputs:
            flag = "--" + next(iter(own)).replace("_", "-")
            raise AutocastError(
                f"{flag} {name}=... (or [outputs.{name}] in the configuration) names no output of the model",
                where,
                "outputs are: " + ", ".join(outputs),
            )


def relative_floor(by_op: dict) -> float:
    """The scale a relative error is measured against at least (metrics.RELATIVE_FLOOR): bf16's
    resolution when the converted model computes in bf16 and not fp16, else fp16's."""
    kinds = {kind for counts in by_op.values() for kind in counts}
    return RELATIVE_FLOOR["bf16" if "bf16" in kinds and "fp16" not in kinds else "fp16"]


def _compare(
    sessions: _Sessions, batches: list, names: list, options: ValidateOptions, progress, padding, floor: float
) -> list:
    """Each output's statistics over every batch, the converted output in the reference's type,
    over the positions `padding` (masks.Padding) leaves compared."""
    stats = [
        OutputStats(
            name,
            class_scores=True if name in options.class_outputs else None,
            relative_floor=floor,
            map_threshold=options.thresholds.for_output(name).map_threshold,
        )
        for name in names
    ]
    loop = _bar(progress, f"comparing outputs on {len(batches)} batch(es)", len(batches))
    for feeds in batches:
        conv_feeds = runner.feeds_for(sessions.converted, feeds)
        fed = functools.partial(_fed, feeds, options)  # described only when a run fails
        ref_out = runner.run(sessions.reference, feeds, fed)
        conv_out = runner.run(sessions.converted, conv_feeds, fed)
        for s, r, o in zip(stats, ref_out, conv_out):
            keep = padding.keep(feeds, s.name, r)
            s.add(r, o.astype(r.dtype) if o.dtype != r.dtype and r.dtype.kind == "f" else o, keep)
        _tick(loop)
    if loop:
        loop.finish()
    return stats


def _continuation(lm, sessions: _Sessions, options: ValidateOptions, progress) -> tuple[dict | None, str | None]:
    """Causal LMs: (agreement of both models' greedy continuations, or None otherwise or with
    --generate 0; why a causal LM's continuation was not compared, or None). Prompts fit a fixed
    batch and sequence length (generation.fit); a model whose shapes take none is skipped."""
    if lm is None or options.generate <= 0:
        return None, None
    fitted = generation.fit(lm, options.generate)
    if isinstance(fitted, str):
        return None, fitted
    batch, length, tokens = fitted
    work = _bar(progress, f"greedy continuation ({tokens} tokens)", 1)
    continuation = generation.agreement(lm, sessions.reference, sessions.converted, tokens, batch, options.seed, length)
    _tick(work, finish=True)
    return continuation, None


def _verdicts(stats: list, thresholds: Thresholds) -> list:
    """Each output's summary with its verdict against the thresholds."""
    outputs = []
    for s in stats:
        summary = s.summary()
        summary["passed"], summary["failures"] = verdict(summary, thresholds)
        outputs.append(summary)
    return outputs


SPEED_LEFT_OUT = "speed not measured: on CPU it says nothing about a GPU (--speed measures it anyway)"


def timed(options: ValidateOptions, device: str) -> bool:
    """Whether validation times the models: --speed/--no-speed (or the configuration's `speed`)
    when given, else only on CUDA, where the speed-up means something."""
    return options.speed if options.speed is not None else device == "cuda"


def _speed(sessions: _Sessions, batches: list, device: str, options: ValidateOptions, progress):
    """(the latency of both models on the first batch and the speed-up, or None; why speed was
    not measured, or None)."""
    if not timed(options, device):
        return None, (SPEED_LEFT_OUT if options.speed is None else None)
    # e.g. bf16 models on the CPU provider, which has no bf16 MatMul/Gemm kernels
    skipped = f"speed not measured: {sessions.not_loaded}" if sessions.not_loaded else None
    real_conv = sessions.timed
    if real_conv is None:
        return None, skipped
    feeds = batches[0]
    runs = options.iterations + options.warmup
    timing = _bar(progress, f"timing both models ({runs} runs each)", 2)
    ref_timed = sessions.reference_timed or sessions.reference
    ref_lat = runner.latency(ref_timed, feeds, device, options.iterations, options.warmup)
    _tick(timing)
    conv_lat = runner.latency(real_conv, runner.feeds_for(real_conv, feeds), device, options.iterations, options.warmup)
    _tick(timing, finish=True)
    batch = _batch_size(feeds)
    speed = {
        "device": device,
        "batch_size": batch,
        "reference": ref_lat | {"throughput_per_s": batch / (ref_lat["p50_ms"] / 1e3)},
        "converted": conv_lat | {"throughput_per_s": batch / (conv_lat["p50_ms"] / 1e3)},
        "speedup_p50": ref_lat["p50_ms"] / conv_lat["p50_ms"],
        "peak_gpu_memory_bytes": None,
        "note": CPU_SPEED_NOTE if device == "cpu" else None,
    }
    return speed, skipped


def _inputs_report(plan, batches: list, specs: list) -> dict:
    """Where the inputs came from and what they looked like (the report's `inputs`)."""
    return {
        "source": plan.source,
        "batches": len(batches),
        "dims": plan.dims,
        "dim_defaults": plan.dim_defaults,
        "ranges": {k: list(v) for k, v in plan.ranges.items()},
        "specs": [
            {"name": s.name, "dtype": dtype_name(s.elem_type), "shape": list(batches[0][s.name].shape)} for s in specs
        ],
    }


def _low_nodes(by_op: dict) -> int:
    return sum(n for kinds in by_op.values() for kind, n in kinds.items() if kind in ("fp16", "bf16"))


def _hollow_comparison(ref_model, ref_path, conv_model, conv_path, conv_by_op, batches, specs, outputs) -> list[str]:
    """Why this comparison may compare nothing, one line each: a batch without rows, an output
    whose every position is padding, a reference output that is not finite, the same model
    twice, or the lower-precision model given as the reference (arguments swapped)."""
    out = []
    for k, feeds in enumerate(batches):
        empty = [s.name for s in specs if s.name in feeds and feeds[s.name].size == 0]
        if empty:
            out.append(f"batch {k + 1} has no elements in {', '.join(empty)}: nothing of it is compared")
    for o in outputs:
        padding = o.get("padding")
        if padding and not o["elements"] and padding["positions"]:
            out.append(
                f"output {o['name']}: every position is padding ({padding['mask']}): nothing is compared "
                "(--compare-padded compares them)"
            )
        if o["elements"] and o["reference_nonfinite"] == o["elements"]:
            out.append(f"output {o['name']}: every reference value is NaN or inf: nothing is compared")
        elif o["reference_nonfinite"]:
            out.append(
                f"output {o['name']}: {o['reference_nonfinite']} of {o['elements']} reference values are NaN or "
                "inf and are not compared (check the inputs)"
            )
    same_file = ref_path and conv_path and os.path.realpath(ref_path) == os.path.realpath(conv_path)
    if same_file or (
        encoded_size(ref_model) == encoded_size(conv_model) <= PROTOBUF_LIMIT
        and ref_model.SerializeToString() == conv_model.SerializeToString()
    ):
        out.append("the reference and the converted model are the same model: nothing was converted")
    else:
        ref_low = _low_nodes(precision_by_op(ref_model, ref_path or "<reference>"))
        conv_low = _low_nodes(conv_by_op)
        if ref_low > conv_low:
            out.append(
                f"the reference has more fp16/bf16 nodes ({ref_low}) than the converted model ({conv_low}): "
                "are the arguments swapped? (validate REFERENCE CONVERTED)"
            )
    return out


def _batch_size(feeds: dict) -> int:
    for value in feeds.values():
        if value.ndim:
            return int(value.shape[0])
    return 1


def precheck(model_path, options: ValidateOptions) -> None:
    """Everything validation would refuse about its options, checked before a conversion so that
    `convert --validate` and `check` refuse bad options before writing anything: --dim and
    --input-range names and values, the size of generated inputs, --inputs archives (headers
    only), --save-inputs, --class-output names and the outputs given thresholds of their own."""
    from .inputs import check_batches, check_generated_size

    if isinstance(model_path, LoadedModel):  # read and checked by the command already
        source, model_path = model_path.model, model_path.path
    else:
        source = load_checked(model_path, load_external=False).model
    specs = describe_inputs(source)
    plan = plan_inputs(specs, options.dims, options.ranges)
    check_save_inputs(specs, options)
    if options.inputs:
        check_batches(options.inputs, specs)
    else:
        check_generated_size(plan)
    check_output_names(options, [o.name for o in source.graph.output], str(model_path))
