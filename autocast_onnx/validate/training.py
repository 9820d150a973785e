"""Stage: validate (training graphs). One training step of the fp32 reference and of the converted
training model on the same batch, compared gradient by gradient.

The converted model runs as its emulation (validate/emulate.py): on ONNX Runtime's CPU provider
the fp16 casts of a training graph are removed by ONNX Runtime itself, so only the emulation
shows what fp16 does to the gradients. Each gradient is read where it reaches its accumulator:
fp32 in both models, and unscaled in the converted one. Per parameter the report gives cosine
similarity, relative error, the fraction of nonzero reference entries that are zero in the
converted step (underflow), and non-finite entries; and the step's `all_finite`.

Needs onnxruntime-training (the plain onnxruntime wheel has no gradient kernels); the parameter
values come from the `checkpoint` beside the reference model when there is one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import AutocastError, printable_lines
from ..graph.sanity import load_checked
from ..graph.training import ALL_FINITE_OUTPUT, LOSS_SCALE_INPUT, TrainingGraph, recognise

# A step passes when every gradient is finite, points the same way as fp32's and keeps its entries.
MIN_COSINE = 0.99
MAX_UNDERFLOW = 0.01
HINT = (
    "install onnxruntime-training in its own environment: pip install torch==2.13.0 "
    "'autocast-onnx[training]' (see docs/training.md)"
)


def has_training_runtime() -> bool:
    """Whether the installed onnxruntime is onnxruntime-training (it has the gradient kernels)."""
    try:
        import onnxruntime
    except ImportError:
        return False
    return (Path(onnxruntime.__file__).parent / "training").is_dir()


def _probe(model: onnx.ModelProto, training: TrainingGraph) -> tuple[onnx.ModelProto, dict]:
    """A copy whose outputs also give each gradient where it reaches its accumulator."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = {}
    by_buffer = {a.buffer: a for a in training.accumulations}
    for node in probe.graph.node:
        if node.op_type.startswith("InPlaceAccumulator") and node.input and node.input[0] in by_buffer:
            acc = by_buffer[node.input[0]]
            key = acc.parameter or acc.gradient
            names[key] = node.input[1]
    existing = {o.name for o in probe.graph.output}
    for tensor in names.values():
        if tensor not in existing:
            probe.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    return probe, names


def _checkpoint_parameters(path: Path) -> dict | None:
    checkpoint = path.parent / "checkpoint"
    if not checkpoint.is_file():
        return None
    from onnxruntime.training.api import CheckpointState

    state = CheckpointState.load_checkpoint(str(checkpoint))
    return {name: np.asarray(parameter.data) for name, parameter in state.parameters}


def _feeds(model: onnx.ModelProto, training: TrainingGraph, batch: dict, params: dict) -> dict:
    feeds = {}
    buffers = {a.buffer: a.parameter for a in training.accumulations}
    for vi in model.graph.input:
        name = vi.name
        if name in batch:
            feeds[name] = batch[name]
        elif name in params:
            feeds[name] = params[name]
        elif name in buffers:
            feeds[name] = np.zeros_like(params[buffers[name]])
        elif name == "lazy_reset_grad":
            feeds[name] = np.ones([max(d.dim_value, 1) for d in vi.type.tensor_type.shape.dim], dtype=bool)
        elif name == LOSS_SCALE_INPUT:
            continue  # set by the caller
        else:
            raise AutocastError(
                f"no value for the training model's input {name!r}",
                "--inputs",
                "pass an .npz holding the model's data inputs (e.g. input, labels)",
            )
    return feeds


def _generated_batch(model: onnx.ModelProto, training: TrainingGraph, seed: int, size: int) -> dict:
    """Data inputs in [0, 1) and class labels in range, for the inputs that are neither
    parameters, buffers nor flags."""
    rng = np.random.default_rng(seed)
    trained = set(training.parameters) | {a.buffer for a in training.accumulations} | {"lazy_reset_grad"}
    classes = _classes(model)
    batch: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in trained or vi.name == LOSS_SCALE_INPUT:
            continue
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else size for d in t.shape.dim]
        if t.elem_type in (TensorProto.INT64, TensorProto.INT32):
            if classes is None:
                raise AutocastError(
                    f"cannot tell the class count for the labels input {vi.name!r}",
                    "validate",
                    "pass --inputs with a batch of the model's inputs",
                )
            dtype = np.int64 if t.elem_type == TensorProto.INT64 else np.int32
            batch[vi.name] = rng.integers(0, classes, size=dims).astype(dtype)
        elif t.elem_type == TensorProto.FLOAT:
            batch[vi.name] = rng.random(dims, dtype=np.float32)
        else:
            raise AutocastError(
                f"cannot generate the input {vi.name!r} (type {t.elem_type})", "validate", "pass --inputs"
            )
    return batch


def _classes(model: onnx.ModelProto) -> int | None:
    """The class count of the loss: the last dim of its scores, where the graph states it."""
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[-1].HasField("dim_value"):
            shapes[vi.name] = dims[-1].dim_value
    for node in model.graph.node:
        if node.op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss") and node.input[0] in shapes:
            return shapes[node.input[0]]
    return None


def _compare(ref: np.ndarray, got: np.ndarray) -> dict:
    ref = ref.astype(np.float64).ravel()
    got = got.astype(np.float64).ravel()
    finite = np.isfinite(got)
    nonfinite = int(got.size - finite.sum())
    nonzero = ref != 0
    underflow = float(((got == 0) & nonzero).sum() / max(int(nonzero.sum()), 1))
    if nonfinite:
        return {"cosine": None, "relative_error": None, "underflow": underflow, "nonfinite": nonfinite}
    norm = float(np.linalg.norm(ref) * np.linalg.norm(got))
    cosine = float(ref @ got / norm) if norm else (1.0 if not ref.any() and not got.any() else 0.0)
    ref_norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(got - ref) / ref_norm) if ref_norm else float(np.linalg.norm(got))
    return {"cosine": cosine, "relative_error": rel, "underflow": underflow, "nonfinite": 0}


def validate_training_step(reference, converted, *, inputs=None, loss_scale: float = 2.0**16, seed: int = 0,
                           batch_size: int = 32, parameters: dict | None = None) -> dict:  # fmt: skip
    """One step of both training models on the same batch; see the module docstring. `inputs` is
    an .npz file, a Polygraphy JSON file of one feed dict (or a dict of arrays) holding the data
    inputs (e.g. input and labels), else a
    batch is generated. `loss_scale` feeds the converted model's loss_scale input (when it has
    one). `parameters` (name -> array) replaces the checkpoint's values."""
    if not has_training_runtime():
        raise AutocastError("validating a training step needs onnxruntime-training", str(reference), HINT)
    import onnxruntime as ort

    from .emulate import emulation_model

    ref_loaded, conv_loaded = load_checked(reference), load_checked(converted)
    ref_training, conv_training = recognise(ref_loaded.model), recognise(conv_loaded.model)
    for training, path in ((ref_training, reference), (conv_training, converted)):
        if training is None or not training.accumulations:
            raise AutocastError(
                "not an onnxruntime-training training model (no gradient accumulators)",
                str(path),
                "pass training_model.onnx of an artifacts folder and its conversion",
            )
    assert ref_training is not None and conv_training is not None
    if set(ref_training.parameters) != set(conv_training.parameters):
        raise AutocastError(
            "the two training models train different parameters",
            str(converted),
            "pass the conversion of REFERENCE",
        )
    params = parameters if parameters is not None else _checkpoint_parameters(Path(reference))
    params_from = (
        ("given" if parameters is not None else "checkpoint") if params is not None else f"generated (seed {seed})"
    )
    if params is None:
        rng = np.random.default_rng(seed + 1)
        params = {}
        for vi in ref_loaded.model.graph.input:
            if vi.name in ref_training.parameters:
                dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                params[vi.name] = (rng.standard_normal(dims) * 0.1).astype(np.float32)
    if isinstance(inputs, dict):
        batch = dict(inputs)
    elif inputs is not None:
        from .inputs import load_arrays

        batch = load_arrays(inputs)  # an .npz or a Polygraphy JSON file; sizes checked before loading
    else:
        batch = _generated_batch(ref_loaded.model, ref_training, seed, batch_size)

    def run(model, training, scale):
        probe, names = _probe(model, training)
        feeds = _feeds(probe, training, batch, params)
        if any(vi.name == LOSS_SCALE_INPUT for vi in probe.graph.input):
            feeds[LOSS_SCALE_INPUT] = np.array(scale, dtype=np.float32)
        options = ort.SessionOptions()
        options.log_severity_level = 4  # errors reach the user as our one line
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        wanted = [o.name for o in session.get_outputs()]
        values = dict(zip(wanted, session.run(None, feeds)))
        grads = {key: values[tensor] for key, tensor in names.items()}
        loss = float(np.asarray(values[training.losses[0]]).reshape(-1)[0]) if training.losses else None
        flag = values.get(ALL_FINITE_OUTPUT)
        return grads, loss, (None if flag is None else bool(np.asarray(flag).reshape(())))

    ref_grads, ref_loss, _ = run(ref_loaded.model, ref_training, 1.0)
    emulated = emulation_model(conv_loaded.model, str(converted))
    conv_grads, conv_loss, all_finite = run(emulated, conv_training, loss_scale)
    gradients = {}
    for name in ref_training.parameters:
        gradients[name] = _compare(ref_grads[name], conv_grads[name])
    cosines = [g["cosine"] for g in gradients.values() if g["cosine"] is not None]
    finite = all_finite if all_finite is not None else not any(g["nonfinite"] for g in gradients.values())
    passed = (
        finite
        and len(cosines) == len(gradients)
        and min(cosines, default=1.0) >= MIN_COSINE
        and max((g["underflow"] for g in gradients.values()), default=0.0) <= MAX_UNDERFLOW
    )
    return {
        "kind": "training-step",
        "reference": str(reference),
        "converted": str(converted),
        "parameters_from": params_from,
        "inputs": (
            "given"
            if isinstance(inputs, dict)
            else str(inputs)
            if inputs is not None
            else f"generated (seed {seed}, batch {batch_size})"
        ),
        "loss_scale": conv_training.loss_scale,
        "loss_scale_fed": loss_scale if any(v.name == LOSS_SCALE_INPUT for v in emulated.graph.input) else None,
        "loss": {"reference": ref_loss, "converted": conv_loss},
        "all_finite": all_finite,
        "gradients": gradients,
        "thresholds": {"min_cosine": MIN_COSINE, "max_underflow": MAX_UNDERFLOW},
        "passed": bool(passed),
    }


def training_step_text(report: dict) -> str:
    lines = [
        f"training step: {report['converted']} (emulated fp16 numerics) against {report['reference']}",
        f"parameters: {report['parameters_from']}; inputs: {report['inputs']}; "
        f"loss scaling: {report['loss_scale'] or 'none'}"
        + (f" (scale fed: {report['loss_scale_fed']:g})" if report["loss_scale_fed"] else ""),
        f"loss: reference {report['loss']['reference']:.6g}, converted {report['loss']['converted']:.6g}",
        f"all_finite: {report['all_finite']}",
    ]
    width = max([len(n) for n in report["gradients"]] + [9])
    lines.append(f"  {'parameter'.ljust(width)}  {'cosine':>9}  {'rel err':>9}  {'underflow':>9}  {'non-finite':>10}")
    for name, g in report["gradients"].items():
        cos = f"{g['cosine']:.6f}" if g["cosine"] is not None else "-"
        rel = f"{g['relative_error']:.2e}" if g["relative_error"] is not None else "-"
        lines.append(f"  {name.ljust(width)}  {cos:>9}  {rel:>9}  {g['underflow'] * 100:>8.2f}%  {g['nonfinite']:>10}")
    t = report["thresholds"]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append(
        f"{verdict}: every gradient finite, cosine >= {t['min_cosine']}, underflow <= {t['max_underflow'] * 100:g}%"
    )
    return printable_lines(lines)
