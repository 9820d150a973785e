"""Stage: validate / runner. ONNX Runtime sessions on the chosen device, inference over
batches, and latency measurement (I/O binding on CUDA so host copies are not timed)."""

from __future__ import annotations

import time

import numpy as np

from ..errors import AutocastError

RUNTIME_HINT = 'install a runtime: pip install "autocast-onnx[cpu]" (or "[gpu]" for CUDA)'


QUIET_SEVERITY = 4  # ONNX Runtime's FATAL: its error lines would come before ours, which say the same


def ort():
    try:
        import onnxruntime
    except ImportError:
        raise AutocastError("this command needs ONNX Runtime, which is not installed", None, RUNTIME_HINT) from None
    onnxruntime.set_default_logger_severity(QUIET_SEVERITY)
    return onnxruntime


def resolve_device(requested: str) -> tuple[str, str | None]:
    """('cuda' or 'cpu', a note when 'auto' fell back or a request cannot be met)."""
    rt = ort()
    has_cuda = "CUDAExecutionProvider" in rt.get_available_providers()
    if requested == "cuda":
        if not has_cuda:
            raise AutocastError(
                "--device cuda: ONNX Runtime has no CUDA execution provider here",
                None,
                'install onnxruntime-gpu ("autocast-onnx[gpu]") on a machine with an NVIDIA GPU',
            )
        return "cuda", None
    if requested == "cpu":
        return "cpu", None
    if has_cuda:
        return "cuda", None
    return "cpu", "no CUDA execution provider available: ran on CPU"


def with_outputs(model, names, types: dict) -> bytes:
    """`model` serialized with exactly `names` (of element types `types[name]`) as its outputs:
    how calibration and attribution read intermediate tensors, a group at a time."""
    import onnx
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_tensor_value_info(name, types[name], None) for name in names)
    return probe.SerializeToString()


def session(model_bytes: bytes | str, device: str, optimize: bool = True, label: str = "the model", where=None):
    """An inference session for serialized model bytes or a model path. `label` ("the reference
    model", "the converted model") and `where` (its path) name it in errors, here and in run()."""
    rt = ort()
    options = rt.SessionOptions()
    options.log_severity_level = QUIET_SEVERITY
    if not optimize:
        options.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    try:
        sess = rt.InferenceSession(model_bytes, options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for unsupported models
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutocastError(
            f"ONNX Runtime cannot load {label}: {first[:300]}",
            where,
            "check that the model runs in ONNX Runtime on its own",
        ) from None
    sess._autocast_label, sess._autocast_where = label, where
    return sess


_NUMPY_OF = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def feeds_for(sess, feeds: dict) -> dict:
    """`feeds` cast to the element types the session declares for its inputs (each tensor of a
    sequence input, which inputs.SequenceFeed casts)."""
    return feeds_for_some(sess, feeds, {spec.name for spec in sess.get_inputs()})


def feeds_for_some(sess, feeds: dict, names: set) -> dict:
    """feeds_for, for the session's inputs in `names` only (those that take a value from `feeds`)."""
    out = {}
    for spec in sess.get_inputs():
        if spec.name not in names:
            continue
        value = feeds[spec.name]
        want = _NUMPY_OF.get(_element_type(spec.type))
        out[spec.name] = value.astype(want) if want is not None and value.dtype != want else value
    return out


def _element_type(type_text: str) -> str:
    """The tensor type of an input type as ONNX Runtime writes it: seq(tensor(float)) ->
    tensor(float); a tensor type as it is."""
    return type_text[len("seq(") : -1] if type_text.startswith("seq(") else type_text


def run(sess, feeds: dict, inputs=None, hint: str | None = None) -> list[np.ndarray]:
    """The session's outputs on `feeds`; a failure is an AutocastError naming the model, what ONNX
    Runtime said and `inputs` (a description of the batch, its shapes and value ranges, or a
    callable that gives one: called only on a failure)."""
    try:
        return sess.run(None, feeds)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        described = inputs() if callable(inputs) else inputs
        fed = f"; it was fed {described}" if described else ""
        raise AutocastError(
            f"ONNX Runtime failed to run {getattr(sess, '_autocast_label', 'the model')}: {first[:300]}{fed}",
            getattr(sess, "_autocast_where", None),
            hint or "check the input shapes (--dim) and values (--input-range)",
        ) from None


def latency(sess, feeds: dict, device: str, iterations: int, warmup: int) -> dict:
    """Seconds per run over `iterations` runs after `warmup` runs."""
    if device == "cuda" and all(isinstance(value, np.ndarray) for value in feeds.values()):
        # (a sequence input, a list, cannot be bound: such a model is timed with plain runs)
        binding = sess.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort().OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for out in sess.get_outputs():
            binding.bind_output(out.name, "cuda")

        def once():
            binding.synchronize_inputs()
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
    else:

        def once():
            sess.run(None, feeds)

    for _ in range(warmup):
        once()
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    arr = np.array(times)
    return {
        "iterations": iterations,
        "warmup": warmup,
        "p50_ms": float(np.percentile(arr, 50) * 1e3),
        "p90_ms": float(np.percentile(arr, 90) * 1e3),
        "min_ms": float(arr.min() * 1e3),
        "mean_ms": float(arr.mean() * 1e3),
    }
