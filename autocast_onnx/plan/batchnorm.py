"""Stage: classify, pass 2 (port roles), its BatchNormalization part. An inference
BatchNormalization's scale, bias, mean and variance follow its data into the low-precision type
when their values survive the cast; otherwise the rule files' pins keep them fp32.

ONNX Runtime's CUDA kernel takes its parameters in the data's type only (one type for T, T1 and
T2), and converts fp16 parameters to float before it computes (onnxruntime/core/providers/cuda/
nn/batch_norm.cc). So fp32 parameters beside fp16 data send the node to the CPU provider, and fp16
parameters cost no more than their own rounding: the kernel computes

    y = (x - mean) * scale / sqrt(var + eps) + bias

in float from the rounded values. That rounding is what is judged here, per channel, as the node
applies it: the multiplier a = scale / sqrt(var + eps) and the offset b = bias - mean * a.

- a: its relative change. A variance that flushes to zero or to a subnormal in the low type (fp16
  normals start at 6.1e-5) changes sqrt(var + eps) by far more than a rounding when eps is small;
  a scale that does the same changes a.
- b: its change, measured against what the channel's output is made of (|bias| + |mean * a| +
  |scale|: the offset, the mean's part of it, and one standard deviation of the output). The
  data's own rounding in the low type is of that size already, so a bias or mean that merely
  rounds passes; one that flushes or overflows does not.

Both must stay within TOLERANCE units of the low type's rounding (2**-11 for fp16, 2**-8 for
bf16). Any non-finite value, a parameter that is not a constant, or a training-mode node keeps
the pins."""

from __future__ import annotations

import numpy as np

from ..dtypes import BFLOAT16, FLOAT16, round_trip

UNIT_ROUNDOFF: dict[int, float] = {FLOAT16: 2.0**-11, BFLOAT16: 2.0**-8}
# the largest rounding error below the normal range
HALF_SUBNORMAL: dict[int, float] = {FLOAT16: 2.0**-25, BFLOAT16: 2.0**-134}
TOLERANCE = 2.0  # units of the low type's rounding: the per-channel change allowed in a and in b
PARAMETERS = ("scale", "bias", "mean", "variance")


def judge(params: list, epsilon: float, elem_type: int) -> tuple[bool, float, str]:
    """Whether BatchNormalization parameters `params` (scale, bias, mean, variance: fp32 arrays
    of one shape) survive `elem_type`: (they do, the larger relative change of a and b, a
    sentence that says so with the channel and the numbers)."""
    unit = UNIT_ROUNDOFF[elem_type]
    exact = [np.asarray(p, np.float64).ravel() for p in params]
    shapes = {p.shape for p in exact}
    if len(shapes) != 1:
        return False, float("inf"), "its parameters are of different sizes"
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = [round_trip(np.asarray(p, np.float32).ravel(), elem_type).astype(np.float64) for p in params]
    for name, before, after in zip(PARAMETERS, exact, rounded):
        if not np.all(np.isfinite(after)) or not np.all(np.isfinite(before)):
            return False, float("inf"), f"its {name} has values that are not finite in the low type"
    a, b = _affine(exact[0], exact[1], exact[2], exact[3], epsilon)
    a2, b2 = _affine(rounded[0], rounded[1], rounded[2], rounded[3], epsilon)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(a2))):
        return False, float("inf"), "its variance plus epsilon is not positive in some channel"
    scale = np.abs(exact[0])
    rel_a = np.where(scale > 0, np.abs(a2 - a) / np.maximum(np.abs(a), np.finfo(np.float64).tiny), 0.0)
    size = np.abs(exact[1]) + np.abs(exact[2] * a) + scale
    rel_b = np.where(size > 0, np.abs(b2 - b) / np.maximum(size, np.finfo(np.float64).tiny), 0.0)
    worst_a, worst_b = int(np.argmax(rel_a)), int(np.argmax(rel_b))
    change = max(float(rel_a[worst_a]), float(rel_b[worst_b]))
    limit = TOLERANCE * unit
    if rel_a[worst_a] > limit:
        channel = worst_a
        what = (
            f"scale/sqrt(var+eps) changes by {rel_a[channel]:.2g} in channel {channel} (scale {exact[0][channel]:.3g}, "
            f"variance {exact[3][channel]:.3g}, eps {epsilon:.3g})"
        )
        return False, change, f"{what}, more than {limit:.2g}"
    if rel_b[worst_b] > limit:
        channel = worst_b
        what = (
            f"the offset bias - mean*scale/sqrt(var+eps) changes by {rel_b[channel]:.2g} of the channel's size in "
            f"channel {channel} (bias {exact[1][channel]:.3g}, mean {exact[2][channel]:.3g})"
        )
        return False, change, f"{what}, more than {limit:.2g}"
    return (
        True,
        change,
        (
            f"per channel, scale/sqrt(var+eps) changes by at most {rel_a[worst_a]:.2g} and the offset by "
            f"{rel_b[worst_b]:.2g} of the channel's size (limit {limit:.2g})"
        ),
    )


def _affine(scale, bias, mean, var, epsilon: float):
    with np.errstate(divide="ignore", invalid="ignore"):
        a = scale / np.sqrt(var + np.float64(np.float32(epsilon)))
    return a, bias - mean * a


def stored_change(params: list, epsilon: float, elem_type: int) -> float:
    """For parameters already stored in `elem_type` (a converted model, as lint sees it): the
    largest relative change of a channel's scale/sqrt(var+eps) or offset that their rounding can
    have caused (each value off by at most half its spacing), on the scale `judge` measures."""
    unit, floor = UNIT_ROUNDOFF[elem_type], HALF_SUBNORMAL[elem_type]
    scale, bias, mean, var = (np.asarray(p, np.float64).ravel() for p in params)
    if len({scale.shape, bias.shape, mean.shape, var.shape}) != 1:
        return float("inf")
    if not all(np.all(np.isfinite(p)) for p in (scale, bias, mean, var)):
        return float("inf")
    off = [np.maximum(np.abs(p) * unit, floor) for p in (scale, bias, mean, var)]
    denom = var + np.float64(np.float32(epsilon))
    if np.any(denom <= 0):
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_a = np.where(scale != 0, off[0] / np.abs(scale) + 0.5 * off[3] / denom, 0.0)
        a = np.abs(scale) / np.sqrt(denom)
        size = np.abs(bias) + np.abs(mean) * a + np.abs(scale)
        change_b = off[1] + off[2] * a + np.abs(mean) * a * rel_a
        rel_b = np.where(size > 0, change_b / size, 0.0)
    return float(max(rel_a.max(initial=0.0), rel_b.max(initial=0.0)))
