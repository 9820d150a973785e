"""Helpers for the tests of quantized (Q/DQ) models: quantize a float model with ONNX Runtime's
static QDQ quantizer, read the Q/DQ units' wiring, and count the int8 operators ONNX Runtime's
CPU optimizer fuses."""

from __future__ import annotations

import collections
import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx

from autocast_onnx.validate.fusion import fused_int8_ops

ROOT = Path(__file__).resolve().parent.parent
_CACHE = Path(tempfile.mkdtemp(prefix="autocast-qdq-"))


def _feeds(path: str, n: int, seed: int) -> list[dict]:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feed = {}
        for i in session.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if "int64" in i.type:  # token ids, token types, masks: 0 and 1 are valid everywhere
                feed[i.name] = rng.integers(0, 2, size=shape).astype(np.int64)
            else:
                feed[i.name] = rng.standard_normal(shape).astype(np.float32)
        out.append(feed)
    return out


@functools.cache
def quantized(source: str, opset: int | None = None) -> str:
    """The path of `source` (a float model file) quantized by onnxruntime.quantization's
    quantize_static in QDQ format (int8 activations and weights, 4 random calibration batches),
    upgraded to `opset` afterwards with onnx.version_converter when given. Cached per session."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(_feeds(source, 4, 0))

        def get_next(self):
            return next(self.items, None)

    stem = Path(source).stem
    out = _CACHE / f"{stem}_qdq.onnx"
    if not out.exists():
        quantize_static(
            source,
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
    if opset is None:
        return str(out)
    upgraded = _CACHE / f"{stem}_qdq_opset{opset}.onnx"
    from onnx import version_converter

    onnx.save(version_converter.convert_version(onnx.load(str(out)), opset), str(upgraded))
    return str(upgraded)


def save(m: onnx.ModelProto, name: str) -> str:
    """Write `m` into the session's folder and return its path."""
    path = _CACHE / name
    onnx.save(m, str(path))
    return str(path)


def wiring(m: onnx.ModelProto) -> tuple[set, set]:
    """The unit edges of `m`: (DequantizeLinear name, consumer name) for every node that reads a
    DequantizeLinear's output, and (producer name, QuantizeLinear name) for every QuantizeLinear
    input x written by a node."""
    producer = {o: n for n in m.graph.node for o in n.output}
    dq_edges, q_edges = set(), set()
    for node in m.graph.node:
        for k, name in enumerate(node.input):
            source = producer.get(name)
            if source is not None and source.op_type == "DequantizeLinear":
                dq_edges.add((source.name, node.name))
            if node.op_type == "QuantizeLinear" and k == 0 and source is not None:
                q_edges.add((source.name, node.name))
    return dq_edges, q_edges


def split_units(m: onnx.ModelProto) -> list[str]:
    """Every node that sits inside a Q/DQ unit: fed by a DequantizeLinear or feeding a
    QuantizeLinear while being a Cast or CastLike."""
    dq_edges, q_edges = wiring(m)
    ops = {n.name: n.op_type for n in m.graph.node}
    return sorted(
        {b for _, b in dq_edges if ops[b] in ("Cast", "CastLike")}
        | {a for a, _ in q_edges if ops[a] in ("Cast", "CastLike")}
    )


def elem_types(m: onnx.ModelProto) -> dict[str, int]:
    """Element type of every initializer and typed value of `m` (after shape inference)."""
    inferred = onnx.shape_inference.infer_shapes(m)
    out = {t.name: t.data_type for t in m.graph.initializer}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        out[v.name] = v.type.tensor_type.elem_type
    return out


def fused_ops(path: str) -> collections.Counter:
    """The fused int8 operators in ONNX Runtime's CPU-optimized graph of the model at `path` (the
    validation report's own count, validate/fusion.py); the model must load."""
    fusion = fused_int8_ops(path, "extended")
    assert fusion.ops is not None, fusion.note
    return collections.Counter(fusion.ops)


def run(path: str) -> list:
    """The outputs of the model at `path` in ONNX Runtime (CPU) on one random batch."""
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, _feeds(path, 1, 7)[0])
