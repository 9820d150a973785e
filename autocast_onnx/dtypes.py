"""Float types the converter works with, their ranges, and array conversion.

Only FLOAT, FLOAT16 and BFLOAT16 tensors take part in mixed precision; every other type
(double, integers, bool, strings, fp8) is left exactly as it is.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
BFLOAT16 = TensorProto.BFLOAT16
MIXABLE: frozenset[int] = frozenset({FLOAT, FLOAT16, BFLOAT16})

PRECISION_OF: dict[str, int] = {"fp32": FLOAT, "fp16": FLOAT16, "bf16": BFLOAT16}
NAME_OF: dict[int, str] = {FLOAT: "fp32", FLOAT16: "fp16", BFLOAT16: "bf16"}
TYPE_STR: dict[int, str] = {FLOAT: "tensor(float)", FLOAT16: "tensor(float16)", BFLOAT16: "tensor(bfloat16)"}

# Bytes per element of the fixed-size types (what a tensor of that type holds per value).
ITEMSIZE: dict[int, int] = {
    FLOAT: 4,
    FLOAT16: 2,
    BFLOAT16: 2,
    TensorProto.DOUBLE: 8,
    TensorProto.INT64: 8,
    TensorProto.UINT64: 8,
    TensorProto.INT32: 4,
    TensorProto.UINT32: 4,
    TensorProto.INT16: 2,
    TensorProto.UINT16: 2,
    TensorProto.INT8: 1,
    TensorProto.UINT8: 1,
    TensorProto.BOOL: 1,
}

# Largest finite value and smallest positive subnormal of each low-precision type.
LIMITS: dict[int, tuple[float, float]] = {
    FLOAT16: (65504.0, 2.0**-24),
    BFLOAT16: (3.3895313892515355e38, 2.0**-133),
}


def dtype_name(elem_type: int | None) -> str:
    if elem_type is None:
        return "unknown"
    if elem_type in NAME_OF:
        return NAME_OF[elem_type]
    return TensorProto.DataType.Name(elem_type).lower()


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round fp32 values to bfloat16 (round to nearest even) and return the raw uint16 bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    nan = np.isnan(values)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_trip(values: np.ndarray, elem_type: int) -> np.ndarray:
    """fp32 values as they read back after a round trip through `elem_type`."""
    values = np.asarray(values, dtype=np.float32)
    if elem_type == FLOAT16:
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if elem_type == BFLOAT16:
        return bf16_bits_to_float(float_to_bf16_bits(values))
    return values


PARALLEL_MIN = 8 * 2**20  # elements: below this one thread converts faster than two start


def to_half(flat: np.ndarray) -> np.ndarray:
    """fp32 -> fp16 (IEEE rounding; overflow becomes inf, as astype), on two threads for large
    arrays: numpy releases the GIL while it casts, so the second core halves the time."""
    out = np.empty(flat.size, dtype="<f2")

    def cast(a: int, b: int) -> None:
        with np.errstate(over="ignore"):  # numpy's error state is per thread
            np.copyto(out[a:b], flat[a:b], casting="unsafe")

    if flat.size < PARALLEL_MIN:
        cast(0, flat.size)
        return out
    from concurrent.futures import ThreadPoolExecutor

    mid = flat.size // 2
    with ThreadPoolExecutor(2) as pool:
        for job in [pool.submit(cast, 0, mid), pool.submit(cast, mid, flat.size)]:
            job.result()
    return out
