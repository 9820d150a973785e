"""Stage: final checks on the rewritten model. A failure here is a bug in autocast-onnx, not
bad input, so it raises InternalCheckError and is never hidden."""

from __future__ import annotations

import onnx

from ..errors import InternalCheckError

CHECK_LIMIT = 2**31 - 64 * 2**20


def check_result(model: onnx.ModelProto | bytes, full: bool = True) -> None:
    """onnx.checker (with shape/type inference when `full`) on the converted model or its bytes."""
    if isinstance(model, onnx.ModelProto) and model.ByteSize() > CHECK_LIMIT:
        return  # checked from the saved file instead (see convert_file)
    try:
        onnx.checker.check_model(model, full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InternalCheckError(f"the converted model fails onnx.checker: {first}") from exc


def check_file(path, full: bool = True) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InternalCheckError(f"the converted model fails onnx.checker: {exc}") from exc
