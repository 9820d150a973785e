"""What an fp32 constant loses when it is stored in a low-precision type: the one judgement that
the converter's data rules (plan/classify.py) and the linter's constant checks (AC201, AC203 in
lint/checks.py) share, so that `check` never fails a model that `convert` produced.

The facts, per target type (fp16: largest finite 65504, smallest subnormal 2^-24):

- **overflow**: a finite value that becomes ±inf (|x| >= 65520 in fp16; float32's lowest,
  -3.4028235e38, in both fp16 and bf16).
- **edge**: a finite value that lands on the largest finite magnitude (65504 in fp16). It is
  exact, but it has no headroom: the next sum of the same sign overflows. A -65504 mask added
  to a negative score, or added to a second mask, is -inf in fp16 where fp32 stays finite.
- **flush**: a nonzero value that becomes zero (below half the smallest subnormal).
- Infinities and NaN convert exactly: an fp32 `-inf` mask is the same `-inf` in fp16, so it is
  no hazard of the conversion (a fully masked row is NaN in fp32 already).

`overflow` and `edge` together are the constant's *range* hazard. The converter keeps the
consumers of such a constant fp32 ("data-range"), and the linter reports the constant only
when it reaches low-precision arithmetic, so a default conversion is never reported."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import BFLOAT16, FLOAT16, LIMITS

# Half a unit in the last place at the largest finite value: fp16 65504 = (2 - 2^-10) * 2^15 has
# units of 2^5, bf16's largest (2 - 2^-7) * 2^127 has units of 2^120. Both largest values have an
# odd significand, so a tie above rounds up to inf and a tie below rounds down, off the edge.
_HALF_UNIT: dict[int, float] = {FLOAT16: 2.0**4, BFLOAT16: 2.0**119}


@dataclass(frozen=True)
class RangeFacts:
    """What converting fp32 `values` to a low-precision type does to them."""

    overflow: int  # finite values that become ±inf
    edge: int  # finite values that land on the largest finite magnitude
    largest: float  # the largest finite |x| (0.0 when none)
    lowest: float  # the most negative finite value (0.0 when none)
    flush: int  # nonzero values that become zero
    nonzero: int  # nonzero values (NaN counts as nonzero)

    @property
    def out_of_range(self) -> int:
        """Values without headroom in the target type: overflowing or on its edge."""
        return self.overflow + self.edge


# Ops that pass a constant's values on to their output (moved, selected, broadcast, or summed
# with small values): an out-of-range mask read through them is still out of range. The linter's
# AC203 follows a mask through them, and the converter keeps their low-precision readers fp32.
PASS_ON_OPS = frozenset(
    {"Cast", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Where", "Mul", "Sub", "Add", "Identity", "Concat",
     "Tile", "Slice", "Transpose"}
)  # fmt: skip


def thresholds(elem_type: int) -> tuple[float, float]:
    """(edge_at, overflow_at): finite |x| above the first lands on the largest finite value of
    `elem_type`, at or above the second becomes inf."""
    largest, half = LIMITS[elem_type][0], _HALF_UNIT[elem_type]
    return largest - half, largest + half  # fp16: 65488 (exclusive), 65520


def range_facts(values: np.ndarray, elem_type: int) -> RangeFacts:
    """The facts of fp32 `values` in `elem_type`. One pass for the max when all values are well
    inside the range (the usual weights), then counts only where needed."""
    values = np.asarray(values)
    if values.size == 0:
        return RangeFacts(0, 0, 0.0, 0.0, 0, 0)
    values = values.astype(np.float32, copy=False)
    mag = np.abs(values)
    edge_at, overflow_at = thresholds(elem_type)
    tiny = LIMITS[elem_type][1]
    top = float(mag.max())
    finite = None
    if np.isfinite(top):
        largest = top
    else:  # NaN or inf among them: they are neither the largest finite value nor out of range
        finite = np.isfinite(mag)
        largest = float(mag[finite].max()) if finite.any() else 0.0
    overflow = edge = 0
    if largest > edge_at:
        real = mag if finite is None else np.where(finite, mag, 0.0)
        overflow = int(np.count_nonzero(real >= overflow_at))
        edge = int(np.count_nonzero(real > edge_at)) - overflow
    if finite is None:
        lowest = float(values.min())
    else:
        lowest = float(values[finite].min()) if finite.any() else 0.0
    nonzero = int(np.count_nonzero(mag))  # NaN counts as nonzero
    flush = int(np.count_nonzero(mag < tiny / 2)) - (mag.size - nonzero)  # zeros excluded; NaN compares false
    return RangeFacts(overflow, edge, largest, lowest, flush, nonzero)


def fp16_lost(flat: np.ndarray, half: np.ndarray) -> np.ndarray:
    """The positions where converting fp32 `flat` to fp16 `half` lost something: a value now inf
    or NaN (overflow, or not finite before), on the largest finite value (the edge), or zero
    where it was not (flush). The screen that picks the constants range_facts then judges
    exactly; most weights have no such position, so it is bit tests on the fp16 values alone."""
    bits = half.view(np.uint16) & np.uint16(0x7FFF)
    bits -= np.uint16(1)  # zero wraps to 0xFFFF: one comparison finds zero, 65504, inf and NaN
    lost = np.flatnonzero(bits >= np.uint16(0x7BFE))
    del bits
    if lost.size:
        zero = half.view(np.uint16)[lost] & np.uint16(0x7FFF) == 0
        lost = lost[~zero | (flat[lost] != 0)]  # an exact zero stays exact
    return lost


def range_sentence(name: str, facts: RangeFacts, tname: str) -> str:
    """The data-range reason of a constant, in the words both the plan and the lint use."""
    if facts.overflow:
        return (
            f"constant '{name}' holds {facts.overflow} value(s) beyond the {tname} range "
            f"(largest |x| = {facts.largest:.4g})"
        )
    return (
        f"constant '{name}' holds {facts.edge} value(s) that land on the largest finite {tname} value "
        f"(largest |x| = {facts.largest:.4g}): the next sum with them overflows"
    )


def is_mask(facts: RangeFacts, elem_type: int) -> bool:
    """A masking constant whose low-precision copy has lost its headroom: its most negative finite
    value overflows to -inf or lands on the lowest finite value of `elem_type`."""
    return facts.lowest < 0 and -facts.lowest > thresholds(elem_type)[0]
