"""Stage: validate. Runs the reference and the converted model on the same batches, compares
every output, measures speed, and returns the report as a plain dict (see
docs/validate-report.schema.json)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .._version import __version__
from ..dtypes import MIXABLE, dtype_name
from ..errors import AutocastError
from ..graph import build_index
from ..graph.sanity import load_checked
from . import generation, runner
from .emulate import emulation_model, session_as_is
from .inputs import describe_inputs, generate, load_batches, plan_inputs
from .metrics import OutputStats, Thresholds, verdict

SCHEMA_VERSION = 1
CPU_SPEED_NOTE = (
    "measured on CPU: ONNX Runtime's CPU provider has few fp16 kernels and adds casts around the "
    "rest, so fp16 speed on CPU says nothing about speed on a GPU"
)


@dataclass(frozen=True)
class ValidateOptions:
    inputs: str | None = None  # .npz file or folder of .npz files
    dims: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    batches: int = 1  # generated batches when no inputs are given
    seed: int = 0
    device: str = "auto"  # auto, cpu, cuda
    numerics: str = "auto"  # auto, emulate, plain
    thresholds: Thresholds = field(default_factory=Thresholds)
    speed: bool = True
    iterations: int = 20
    warmup: int = 3
    class_outputs: list = field(default_factory=list)  # outputs to score top-1/top-k on, by name
    strict: bool = False  # a comparison that compares nothing (see `warnings`) fails
    generate: int = 16  # causal LMs: tokens of greedy continuation to compare (0: none)


def _load(model, label):
    if isinstance(model, onnx.ModelProto):
        return model, None, model.ByteSize()
    loaded = load_checked(model)
    size = loaded.file_bytes + sum(os.path.getsize(Path(model).parent / f) for f in loaded.external_files)
    return loaded.model, str(model), size


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
    called to report long loops (it returns an iterable wrapper), or None."""
    options = options or ValidateOptions()
    ref_model, ref_path, ref_bytes = _load(reference, "reference")
    conv_model, conv_path, conv_bytes = _load(converted, "converted")
    device, device_note = runner.resolve_device(options.device)
    numerics = options.numerics
    if numerics == "auto":
        numerics = "plain" if device == "cuda" else "emulate"
    if numerics not in ("emulate", "plain"):
        raise AutocastError(f"unknown numerics {numerics!r}", "--numerics", "use auto, emulate or plain")

    specs = describe_inputs(ref_model)
    conv_specs = {s.name: s for s in describe_inputs(conv_model)}
    missing = [s.name for s in specs if s.name not in conv_specs]
    if missing:
        raise AutocastError(
            f"the converted model lacks input(s) {', '.join(missing)} of the reference",
            conv_path or "<converted>",
            "compare a model with its own conversion",
        )
    plan = plan_inputs(specs, options.dims, options.ranges)
    lm = generation.recognise(ref_model)
    cached = lm is not None and lm.has_cache and not options.inputs
    if options.inputs:
        batches = load_batches(options.inputs, specs)
        plan.source = str(options.inputs)
        plan.dims, plan.dim_defaults = {}, []  # the arrays' own shapes apply (see inputs.specs)
    elif not cached:
        batches = [generate(plan, seed=options.seed + k) for k in range(max(1, options.batches))]

    # From the file when there is one: serializing a large parsed model again costs seconds.
    ref_label, conv_label = "the reference model", "the converted model"
    loading = progress("loading both models into ONNX Runtime", 1) if progress else None
    ref_sess = runner.session(
        ref_path if ref_path else ref_model.SerializeToString(), device, label=ref_label, where=ref_path
    )
    if numerics == "emulate":
        try:
            emulated = emulation_model(conv_model, conv_path or "<converted>")
        except (ValueError, TypeError) as exc:  # a malformed tensor (e.g. data shorter than its dims)
            raise AutocastError(
                f"cannot build the fp32 emulation of the converted model: {exc}",
                conv_path,
                "check the converted model with onnx.checker; convert it again",
            ) from None
        conv_sess = runner.session(
            emulated.SerializeToString(), "cpu", optimize=False, label=f"the emulation of {conv_label}", where=conv_path
        )
        # the numbers come from the emulation, but the model itself must load: one ONNX Runtime
        # refuses fails here as in a plain comparison, never PASSes
        real_conv, not_loaded = session_as_is(conv_model, conv_path, device, conv_label)
        if not options.speed:
            real_conv = None
    else:
        conv_sess = runner.session(
            conv_path if conv_path else conv_model.SerializeToString(), device, label=conv_label, where=conv_path
        )
        real_conv, not_loaded = conv_sess, None
    if loading:
        loading.update(1)
        loading.finish()
    if cached and lm is not None:
        # a KV cache is realistic only when a model wrote it: the reference reads a prompt with an
        # empty cache, and its cache comes back with new tokens (in the converted model's types)
        batches = [
            generation.cached_batch(
                lm, ref_sess, generation.BATCH, generation.PROMPT_LENGTH, generation.NEW_TOKENS, options.seed + k
            )
            for k in range(max(1, options.batches))
        ]
        plan.source = (
            f"generated for a causal LM with a KV cache: the reference's cache of a {generation.PROMPT_LENGTH}-token "
            f"prompt, then {generation.NEW_TOKENS} new tokens"
        )
        plan.dims, plan.dim_defaults = {}, []
    ref_names = [o.name for o in ref_sess.get_outputs()]
    conv_names = [o.name for o in conv_sess.get_outputs()]
    if ref_names != conv_names:
        raise AutocastError(
            "the models' outputs differ: " + ", ".join(ref_names) + " vs " + ", ".join(conv_names),
            conv_path or "<converted>",
            "compare a model with its own conversion",
        )
    unknown = set(options.class_outputs) - set(ref_names)
    if unknown:
        raise AutocastError(
            f"--class-output names unknown output(s): {', '.join(sorted(unknown))}",
            None,
            "outputs are: " + ", ".join(ref_names),
        )
    stats = [OutputStats(name, class_scores=True if name in options.class_outputs else None) for name in ref_names]
    loop = progress(f"comparing outputs on {len(batches)} batch(es)", len(batches)) if progress else None
    for feeds in batches:
        conv_feeds = runner.feeds_for(conv_sess, feeds)
        ref_out = runner.run(ref_sess, feeds)
        conv_out = runner.run(conv_sess, conv_feeds)
        for s, r, o in zip(stats, ref_out, conv_out):
            s.add(r, o.astype(r.dtype) if o.dtype != r.dtype and r.dtype.kind == "f" else o)
        if loop:
            loop.update(1)
    if loop:
        loop.finish()

    continuation = None
    if lm is not None and options.generate > 0:
        work = progress(f"greedy continuation ({options.generate} tokens)", 1) if progress else None
        continuation = generation.agreement(lm, ref_sess, conv_sess, options.generate, generation.BATCH, options.seed)
        if work:
            work.update(1)
            work.finish()

    outputs = []
    for s in stats:
        summary = s.summary()
        summary["passed"], summary["failures"] = verdict(summary, options.thresholds)
        outputs.append(summary)
    by_op = precision_by_op(conv_model, conv_path or "<converted>")
    warnings = _hollow_comparison(ref_model, ref_path, conv_model, conv_path, by_op, batches, specs, outputs)

    speed = None
    # e.g. bf16 models on the CPU provider, which has no bf16 MatMul/Gemm kernels
    speed_skipped = f"speed not measured: {not_loaded}" if options.speed and not_loaded else None
    if options.speed and real_conv is not None:
        feeds = batches[0]
        runs = options.iterations + options.warmup
        timing = progress(f"timing both models ({runs} runs each)", 2) if progress else None
        ref_lat = runner.latency(ref_sess, feeds, device, options.iterations, options.warmup)
        if timing:
            timing.update(1)
        conv_lat = runner.latency(
            real_conv, runner.feeds_for(real_conv, feeds), device, options.iterations, options.warmup
        )
        if timing:
            timing.update(1)
            timing.finish()
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

    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "autocast-onnx", "version": __version__},
        "reference": {"path": ref_path, "bytes": ref_bytes},
        "converted": {"path": conv_path, "bytes": conv_bytes},
        "size_ratio": conv_bytes / ref_bytes if ref_bytes else None,
        "device": device,
        "device_note": device_note,
        "numerics": numerics,
        "inputs": {
            "source": plan.source,
            "batches": len(batches),
            "dims": plan.dims,
            "dim_defaults": plan.dim_defaults,
            "ranges": {k: list(v) for k, v in plan.ranges.items()},
            "specs": [
                {"name": s.name, "dtype": dtype_name(s.elem_type), "shape": list(batches[0][s.name].shape)}
                for s in specs
            ],
        },
        "thresholds": options.thresholds.as_dict(),
        "outputs": outputs,
        "warnings": warnings,
        "strict": options.strict,
        "passed": all(o["passed"] for o in outputs) and not (options.strict and warnings),
        "generation": continuation,
        "speed": speed,
        "speed_skipped": speed_skipped,
        "precision_by_op": by_op,
    }


def _low_nodes(by_op: dict) -> int:
    return sum(n for kinds in by_op.values() for kind, n in kinds.items() if kind in ("fp16", "bf16"))


def _hollow_comparison(ref_model, ref_path, conv_model, conv_path, conv_by_op, batches, specs, outputs) -> list[str]:
    """Why this comparison may compare nothing, one line each: a batch without rows, a reference
    output that is not finite, the same model twice, or the lower-precision model given as the
    reference (arguments swapped)."""
    out = []
    for k, feeds in enumerate(batches):
        empty = [s.name for s in specs if s.name in feeds and feeds[s.name].size == 0]
        if empty:
            out.append(f"batch {k + 1} has no elements in {', '.join(empty)}: nothing of it is compared")
    for o in outputs:
        if o["elements"] and o["reference_nonfinite"] == o["elements"]:
            out.append(f"output {o['name']}: every reference value is NaN or inf: nothing is compared")
        elif o["reference_nonfinite"]:
            out.append(
                f"output {o['name']}: {o['reference_nonfinite']} of {o['elements']} reference values are NaN or "
                "inf and are not compared (check the inputs)"
            )
    same_file = ref_path and conv_path and os.path.realpath(ref_path) == os.path.realpath(conv_path)
    if same_file or (
        ref_model.ByteSize() == conv_model.ByteSize()
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
    only), --class-output names."""
    from .inputs import check_batches, check_generated_size

    source = load_checked(model_path, load_external=False).model
    specs = describe_inputs(source)
    plan = plan_inputs(specs, options.dims, options.ranges)
    if options.inputs:
        check_batches(options.inputs, specs)
    else:
        check_generated_size(plan)
    outputs = [o.name for o in source.graph.output]
    unknown = set(options.class_outputs) - set(outputs)
    if unknown:
        raise AutocastError(
            f"--class-output names unknown output(s): {', '.join(sorted(unknown))}",
            str(model_path),
            "outputs are: " + ", ".join(outputs),
        )
