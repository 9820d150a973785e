"""Stage: validate / maps. Probability-map outputs (a text detector's or a segmenter's sigmoid
map) and the metric their users read: the map thresholded into a mask, compared as masks.

The raw error of a map says little: a few pixels near the threshold move by 0.3 and the maximum
absolute error is 0.3, while the masks the post-processing cuts out of both maps are the same
but for those pixels. So beside the raw errors a map gets the intersection over union of the two
masks (pixels above the threshold) and the fraction of pixels that flip, and `min_iou` decides its
verdict in place of rtol, atol and min-cosine (an output's own --rtol NAME=X still applies).

An output is taken for a map when its reference values lie in [0, 1] and either its shape is a
one-channel spatial map (`[N, 1, H, W]` or `[N, H, W]` with H, W >= 2), or its name says so
(prob, mask, map, heat, seg). Class scores (--class-output, softmax rows) are not maps; a name
that reads as class scores (logits, probs, scores at rank <= 3) yields to the shape rule only."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MAP_NAME = re.compile(r"prob|mask|map|heat|seg", re.I)
MIN_SIDE = 2  # a spatial map is at least 2 x 2


def spatial_map(ref: np.ndarray) -> bool:
    """Whether the shape is a one-channel spatial map: [N, 1, H, W] or [N, H, W], H and W >= 2."""
    if ref.ndim == 4:
        return ref.shape[1] == 1 and min(ref.shape[2:]) >= MIN_SIDE
    return ref.ndim == 3 and min(ref.shape[1:]) >= MIN_SIDE


def in_unit_range(ref: np.ndarray) -> bool:
    """Whether every reference value is a finite number in [0, 1]."""
    if ref.dtype.kind != "f" or ref.size == 0:
        return False
    values = ref.astype(np.float64)
    return bool(np.isfinite(values).all() and values.min() >= 0.0 and values.max() <= 1.0)


def map_kind(name: str, ref: np.ndarray, by_name: bool) -> str | None:
    """Why an output counts as a probability map: "shape" (values in [0, 1], one-channel spatial
    shape) or "name" (values in [0, 1], a name like prob/mask/map/heat/seg; only when `by_name`,
    i.e. the output is not taken for class scores by its name), or None."""
    if not in_unit_range(ref):
        return None
    if spatial_map(ref):
        return "shape"
    if by_name and MAP_NAME.search(name):
        return "name"
    return None


@dataclass
class MapStats:
    """The masks of a map at `threshold` (value > threshold), pooled over batches."""

    threshold: float
    why: str
    intersection: int = 0
    union: int = 0
    flipped: int = 0
    pixels: int = 0

    def add(self, ref: np.ndarray, out: np.ndarray) -> None:
        r = ref.astype(np.float64) > self.threshold
        o = np.nan_to_num(out.astype(np.float64), nan=-np.inf) > self.threshold  # a NaN is no detection
        self.intersection += int(np.count_nonzero(r & o))
        self.union += int(np.count_nonzero(r | o))
        self.flipped += int(np.count_nonzero(r ^ o))
        self.pixels += int(r.size)

    @property
    def iou(self) -> float:
        """|R and C| / |R or C|; 1.0 when neither mask has a pixel (nothing to disagree on)."""
        return self.intersection / self.union if self.union else 1.0

    def summary(self) -> dict:
        return {
            "kind": self.why,
            "threshold": self.threshold,
            "iou": self.iou,
            "flipped_fraction": self.flipped / self.pixels if self.pixels else 0.0,
            "flipped": self.flipped,
            "union": self.union,
            "pixels": self.pixels,
        }
