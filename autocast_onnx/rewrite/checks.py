"""Stage: final checks on the rewritten model. A failure here is a bug in autocast-onnx, not
bad input, so it raises InternalCheckError and is never hidden.

onnxruntime-training writes a few of its own ops into the default domain (MaxPoolGrad,
AveragePoolGrad, SparseSoftmaxCrossEntropy(Grad)), which onnx.checker rejects even in the input.
Such a model is checked with those nodes moved to a domain the checker leaves alone, so that
everything else is still checked."""

from __future__ import annotations

import onnx

from ..errors import InternalCheckError
from ..io import Pieces, all_graphs

CHECK_LIMIT = 2**31 - 64 * 2**20
_ORT_DOMAIN = "com.microsoft"


def check_result(model: onnx.ModelProto | bytes | Pieces, full: bool = True, stand_in: bytes | None = None) -> None:
    """onnx.checker (with shape/type inference when `full`) on the converted model or its bytes
    (joined first when they come as io.Pieces). `stand_in` (splice.py: the same bytes with the
    large converted weights as graph inputs, whose sizes were compared with their dims already)
    is checked instead; a failure there is checked again on `model`, whose verdict and message
    are the ones that count."""
    if stand_in is not None:
        try:
            check_result(stand_in, full)
            return
        except InternalCheckError:
            pass
    if isinstance(model, Pieces):
        model = bytes(model)
    if isinstance(model, onnx.ModelProto) and model.ByteSize() > CHECK_LIMIT:
        return  # checked from the saved file instead (see convert_file)
    try:
        onnx.checker.check_model(model, full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        patched = _ort_default_domain_ops_moved(model) or _sparse_made_dense(model)
        if patched is not None:
            return check_result(patched, full)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InternalCheckError(f"the converted model fails onnx.checker: {first}") from exc


def check_file(path, full: bool = True) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        loaded = onnx.load(str(path), load_external_data=False)
        patched = _ort_default_domain_ops_moved(loaded) or _sparse_made_dense(loaded)
        if patched is not None:
            return check_result(patched, full)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InternalCheckError(f"the converted model fails onnx.checker: {first}") from exc


def _sparse_made_dense(model) -> onnx.ModelProto | None:
    """A copy with every sparse initializer made a dense one, or None when the model has none.
    ONNX's shape inference does not read sparse initializers (it fails on a model that has one,
    as given), so the full check runs on this copy: the same graph, weights stored densely."""
    import numpy as np
    from onnx import numpy_helper

    if isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    if not any(len(g.sparse_initializer) for g in all_graphs(model.graph)):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in all_graphs(copy.graph):
        for sparse in graph.sparse_initializer:
            values, indices = numpy_helper.to_array(sparse.values), numpy_helper.to_array(sparse.indices)
            shape = tuple(sparse.dims)
            dense = np.zeros(int(np.prod(shape)), values.dtype)
            dense[indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)] = values
            graph.initializer.append(numpy_helper.from_array(dense.reshape(shape), sparse.values.name))
        del graph.sparse_initializer[:]
    return copy


def _ort_default_domain_ops_moved(model) -> onnx.ModelProto | None:
    """A copy with ONNX Runtime's default-domain ops (unknown to onnx) moved to com.microsoft,
    or None when the model has none (the failure is real)."""
    from ..graph.signatures import _ort_table

    if isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    table = _ort_table()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    moved = 0
    for node in (n for g in all_graphs(copy.graph) for n in g.node):
        if node.domain in ("", "ai.onnx") and node.op_type in table and not onnx.defs.has(node.op_type):
            node.domain = _ORT_DOMAIN
            moved += 1
    if not moved or opset is None:
        return None
    if not any(o.domain == _ORT_DOMAIN for o in copy.opset_import):
        copy.opset_import.add(domain=_ORT_DOMAIN, version=1)
    return copy
