"""Stage: classify, pass 5 (data rules), its mask part. Attention-mask sentinels that the low
type cannot hold are retargeted instead of keeping their readers fp32.

Exporters mask attention scores with a constant far beyond fp16's range: float32's lowest
(-3.4e38, what `torch.finfo(torch.float32).min` gives transformers' masks), or -1e9. Converted as
it is, it becomes -inf in fp16 (and float32's lowest is -inf in bf16 too), and a fully masked row
of the softmax is NaN where fp32 gives a finite answer; so the data rules kept every reader of
such a constant fp32, and with it the mask Add, the Softmax and the Casts around them. A value
that only masks needs no more than to be far below every score: a constant is a *mask
sentinel* when its values beyond the range are all negative and every path from it leads, through
ops that move, select or combine values (Where, Expand, Reshape, Unsqueeze, Add, Mul, ...), to a
Softmax or LogSoftmax input and to nothing else. Its values below SENTINEL (those beyond the range,
and the edge of the range itself) then take SENTINEL, the most negative value that still cannot
overflow when added to the scores:

- fp16: -49152 (1.5 * 2**15). Its neighbours in fp16 are 32 apart, so a score s with |s| < 16
  added to it rounds back to -49152 exactly: a fully masked row is uniform, as in fp32, where
  -3.4e38 + s is -3.4e38. No score above -16352 takes it past fp16's -65504 (not -65504 itself:
  -65504 plus a score of -16 rounds to -inf). Where k sentinel masks can be summed on the way to
  one softmax (a causal and a padding mask), it is divided by the power of two at or above k, so
  that their sum stays finite.
- bf16: -2**126, whose neighbours are 2**119 apart (bf16 has float32's exponent range; only
  float32's lowest itself overflows), so every score is absorbed.

Partly masked rows are unchanged either way: exp(sentinel + s - max) underflows to 0 in the
softmax's float arithmetic. -inf masks are no hazard (they convert exactly) and are left alone."""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import BFLOAT16, FLOAT16
from ..hazards import thresholds

SENTINEL: dict[int, float] = {FLOAT16: -49152.0, BFLOAT16: -(2.0**126)}
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})
# ops through which a mask travels to the softmax: moved, broadcast, selected, or combined with the
# scores or another mask (Mul: the 0/1 mask times the sentinel, as torch.onnx's exports build it)
MASK_OPS = frozenset(
    {"Where", "Add", "Mul", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Concat", "Slice",
     "Transpose", "Tile", "Flatten"}
)  # fmt: skip
MASK_DEPTH = 12  # ops followed from the constant to the softmax


def sentinels(candidates, array_of, elem_type: int) -> dict[str, tuple[float, list]]:
    """The mask sentinels among `candidates` (constant Values whose data rules found beyond the
    range of `elem_type`): name -> (the value their beyond-range entries take, the Softmax nodes
    they reach). `array_of(value)` reads a constant's fp32 values. Each softmax counts the paths
    by which sentinel values reach it (a mask added twice, two masks added, count 2), and a
    sentinel is divided by the largest count among the softmaxes it reaches, rounded up to a power
    of two, so that the sum stays finite."""
    reach: dict[str, tuple[object, dict]] = {}
    for value in candidates:
        if value.name in reach or not _negative_beyond(array_of(value), elem_type):
            continue
        paths = _paths_to_softmax(value, {}, 0)
        if paths:
            reach[value.name] = (value, paths)
    per_softmax: dict[int, int] = {}
    for _, paths in reach.values():
        for node_id, count in paths.items():
            per_softmax[node_id] = per_softmax.get(node_id, 0) + count
    out = {}
    for name, (_, paths) in reach.items():
        k = max(per_softmax[i] for i in paths)
        out[name] = (SENTINEL[elem_type] / 2 ** math.ceil(math.log2(k)), sorted(paths))
    return out


def _negative_beyond(array, elem_type: int) -> bool:
    """Whether `array` has finite values beyond the range of `elem_type` and all of them are
    negative."""
    if array is None:
        return False
    values = np.asarray(array, dtype=np.float32)
    edge_at = thresholds(elem_type)[0]
    finite = values[np.isfinite(values)]
    beyond = finite[np.abs(finite) > edge_at]
    return beyond.size > 0 and bool((beyond < 0).all())


MAX_PATHS = 1 << 10  # more ways to a softmax than this is no mask (and the count stops growing)


def _paths_to_softmax(value, memo: dict, depth: int) -> dict[int, int]:
    """Softmax node id -> the number of paths from `value` to its input, or an empty dict when a
    path from it leads anywhere else (a graph output, another op, a subgraph, a Where's condition,
    past MASK_DEPTH ops)."""
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = {}  # a cycle (no valid graph has one) reads as no mask
    if value.graph_outputs or depth > MASK_DEPTH or not value.consumers:
        return {}
    found: dict[int, int] = {}
    for consumer, port in value.consumers:
        if consumer.domain != "" or consumer.subscopes:
            return {}
        if consumer.op in SOFTMAX_OPS and port == 0:
            found[consumer.id] = found.get(consumer.id, 0) + 1
            continue
        if consumer.op not in MASK_OPS or (consumer.op == "Where" and port == 0):
            return {}
        for out in consumer.outputs:
            if out is None:
                continue
            below = _paths_to_softmax(out, memo, depth + 1)
            if not below:
                return {}
            for node_id, count in below.items():
                found[node_id] = min(MAX_PATHS, found.get(node_id, 0) + count)
    memo[id(value)] = found
    return found
