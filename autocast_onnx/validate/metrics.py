"""Stage: validate / metrics. Per-output error statistics between reference and converted
outputs, accumulated over batches, and the pass/fail verdict against thresholds.

What is compared is what a user reads: the positions an attention mask marks as padding are left
out (masks.py), a probability map is judged by the masks its post-processing cuts (maps.py), and
the relative error of an output far smaller than the low-precision type's resolution at 1 is
measured against that resolution (RELATIVE_FLOOR)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .maps import MapStats, map_kind
from .thresholds import Thresholds

TOPK = 5
CLASS_NAME = re.compile(r"logit|prob|score|class|pred|label", re.I)
MAX_NAMED_RANK = 3  # [batch, classes] or [batch, sequence, classes]; a rank-4 map's last axis is spatial

# The smallest scale a relative error is measured against: the low-precision type's machine
# epsilon, its resolution at 1 (2^-10 for fp16, 2^-7 for bf16). Networks keep their activations
# near unit scale, and a value computed from them carries an absolute error of about this much
# times their scale whatever its own size: a sigmoid deep in its tail (1e-5) inherits the
# rounding of its input logit, and relative to its own tiny maximum that is 10 %, though no
# user could see it. Below this scale the relative error measures the format's resolution, not
# the conversion; rtol then bounds the absolute error at rtol x RELATIVE_FLOOR.
RELATIVE_FLOOR = {"fp16": 2.0**-10, "bf16": 2.0**-7}


def class_score_kind(name: str, ref: np.ndarray) -> str | None:
    """Why an output counts as class scores (its last axis the classes), or None.

    "probabilities": non-negative rows summing to 1 along the last axis (a softmax, whatever its
    name); "name": a name like logits/probs/scores/label at rank <= 3 (so a [1, 1, H, W]
    probability map is not taken for classes)."""
    if ref.dtype.kind != "f" or ref.ndim < 1 or ref.shape[-1] < 2 or ref.size == 0:
        return None
    rows = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    if np.isfinite(rows).all() and rows.min() >= 0.0 and np.allclose(rows.sum(-1), 1.0, atol=1e-3):
        return "probabilities"
    if CLASS_NAME.search(name) and ref.ndim <= MAX_NAMED_RANK:
        return "name"
    return None


@dataclass
class OutputStats:
    name: str
    shape: list = field(default_factory=list)
    elements: int = 0
    max_abs: float = 0.0
    sum_abs: float = 0.0
    sum_sq: float = 0.0  # sum of (converted - reference)^2: the relative L2 error the search reduces
    max_ref: float = 0.0
    dot: float = 0.0
    norm_ref: float = 0.0
    norm_out: float = 0.0
    new_nan: int = 0
    new_inf: int = 0
    ref_nonfinite: int = 0
    class_scores: bool | None = None  # None: decide from the first batch (class_score_kind)
    class_scores_why: str | None = None  # "--class-output", "name" or "probabilities"
    rows: int = 0
    k: int = 0
    top1_agree: int = 0
    topk_overlap: float = 0.0
    floating: bool = False
    relative_floor: float = RELATIVE_FLOOR["fp16"]
    map_threshold: float = 0.5
    map: MapStats | None = None
    mask_input: str | None = None  # the attention mask whose padded positions are left out
    padded_positions: int = 0
    padded_elements: int = 0
    _kind_decided: bool = False

    def add(self, ref: np.ndarray, out: np.ndarray, keep: tuple[str, np.ndarray] | None = None) -> None:
        """Pool one batch. `keep`: (mask input, bool array of the output's leading shape), True
        where a position is compared (masks.Padding.keep); the others are counted, not compared."""
        self.shape = list(ref.shape)
        if not self._kind_decided:
            self._decide_kind(ref)
        full_ref, full_out = ref, out
        if keep is not None:
            ref, out = self._unpadded(ref, out, keep)
        if ref.dtype.kind not in "fc":
            same = int(np.count_nonzero(ref != out))
            self.elements += ref.size
            self.max_abs = max(self.max_abs, float(same > 0))
            return
        self.floating = True
        self._add_errors(ref.astype(np.float64).ravel(), out.astype(np.float64).ravel())
        if self.map is not None:
            self.map.add(ref, out)
        if self.class_scores:
            self._add_class_rows(full_ref, full_out, ref, out, keep)

    def _decide_kind(self, ref: np.ndarray) -> None:
        """On the first batch (all positions): class scores, a probability map, or neither."""
        self._kind_decided = True
        if ref.dtype.kind != "f":
            return
        if self.class_scores is None:
            self.class_scores_why = class_score_kind(self.name, ref)
            if self.class_scores_why == "name" and map_kind(self.name, ref, by_name=False):
                self.class_scores_why = None  # a one-channel map in [0, 1] named like "prob" is a map
            self.class_scores = self.class_scores_why is not None
        elif self.class_scores and self.class_scores_why is None:
            self.class_scores_why = "--class-output"
        if not self.class_scores:
            why = map_kind(self.name, ref, by_name=True)
            self.map = MapStats(self.map_threshold, why) if why else None

    def _unpadded(self, ref: np.ndarray, out: np.ndarray, keep: tuple[str, np.ndarray]):
        """The compared positions of both outputs, [n, *trailing], and the padding counted."""
        self.mask_input, visible = keep
        hidden = int(visible.size - np.count_nonzero(visible))
        self.padded_positions += hidden
        self.padded_elements += hidden * int(np.prod(ref.shape[visible.ndim :], dtype=np.int64))
        return ref[visible], out[visible]

    def _add_errors(self, r: np.ndarray, o: np.ndarray) -> None:
        self.elements += r.size
        ref_finite = np.isfinite(r)
        self.ref_nonfinite += int((~ref_finite).sum())
        self.new_nan += int((np.isnan(o) & ~np.isnan(r)).sum())
        self.new_inf += int((np.isinf(o) & ref_finite).sum())
        both = ref_finite & np.isfinite(o)
        if both.any():
            diff = np.abs(o[both] - r[both])
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.sum_abs += float(diff.sum())
            self.sum_sq += float(np.dot(diff, diff))
            self.max_ref = max(self.max_ref, float(np.abs(r[both]).max()))
            self.dot += float(np.dot(o[both], r[both]))
            self.norm_ref += float(np.dot(r[both], r[both]))
            self.norm_out += float(np.dot(o[both], o[both]))

    def _add_class_rows(self, full_ref, full_out, ref, out, keep) -> None:
        """Top-1 and top-k over the rows of the last axis: the unpadded rows when the mask covers
        leading axes only; when it covers the last axis too (token scores [batch, seq]), every
        row, with the padded positions out of the running (-inf in both)."""
        if keep is not None and keep[1].ndim == full_ref.ndim:
            visible = keep[1]
            ref = np.where(visible, full_ref.astype(np.float64), -np.inf)
            out = np.where(visible, full_out.astype(np.float64), -np.inf)
        elif keep is None:
            ref, out = full_ref, full_out
        if ref.ndim < 1 or ref.shape[-1] < 2:
            return
        rr = ref.reshape(-1, ref.shape[-1])
        oo = np.nan_to_num(out.reshape(-1, ref.shape[-1]).astype(np.float64), nan=-np.inf)
        self.rows += rr.shape[0]
        self.top1_agree += int((rr.argmax(-1) == oo.argmax(-1)).sum())
        k = min(TOPK, rr.shape[-1])
        self.k = k
        top_r = np.argpartition(-rr, k - 1, axis=-1)[:, :k]
        top_o = np.argpartition(-oo, k - 1, axis=-1)[:, :k]
        self.topk_overlap += sum(len(set(a) & set(b)) / k for a, b in zip(top_r, top_o))

    def summary(self) -> dict:
        cosine = (
            self.dot / np.sqrt(self.norm_ref * self.norm_out)
            if self.norm_ref > 0 and self.norm_out > 0
            else (1.0 if self.norm_ref == self.norm_out else 0.0)
        )
        scale = max(self.max_ref, self.relative_floor) if self.floating else self.max_ref
        out = {
            "name": self.name,
            "shape": self.shape,
            "elements": self.elements,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.sum_abs / self.elements if self.elements else 0.0,
            "max_abs_reference": self.max_ref,
            "relative_scale": scale,
            "relative_error": self.max_abs / scale if scale > 0 else self.max_abs,
            "cosine": float(cosine),
            "new_nan": self.new_nan,
            "new_inf": self.new_inf,
            "reference_nonfinite": self.ref_nonfinite,
            "top1": None,
            "topk": None,
            "k": None,
            "class_scores": self.class_scores_why if self.class_scores and self.rows else None,
            "padding": None,
            "map": self.map.summary() if self.map is not None else None,
        }
        if self.mask_input is not None:
            out["padding"] = {
                "mask": self.mask_input,
                "positions": self.padded_positions,
                "elements": self.padded_elements,
            }
        if self.class_scores and self.rows:
            out["top1"] = self.top1_agree / self.rows
            out["topk"] = self.topk_overlap / self.rows
            out["k"] = self.k
        return out

    def relative_l2(self) -> float:
        """||converted - reference|| / ||reference|| over the compared positions (inf with a new
        NaN or inf): the error the accuracy search drives down for an output judged by its errors."""
        if self.new_nan or self.new_inf:
            return float("inf")
        norm = float(np.sqrt(self.norm_ref))
        err = float(np.sqrt(self.sum_sq))
        return err / norm if norm > 0 else err


def judged_as_map(stats: dict, thresholds: Thresholds) -> bool:
    """Whether an output's verdict is the IoU of its masks (a probability map, min_iou set)."""
    return stats.get("map") is not None and thresholds.for_output(stats.get("name", "")).min_iou is not None


def search_error(stats: OutputStats, thresholds: Thresholds) -> float:
    """The error of one output that the accuracy search drives down, in the terms of its verdict:
    1 - IoU for a map judged by IoU, else the relative L2 error of the compared positions."""
    summary = stats.summary()
    if judged_as_map(summary, thresholds):
        if stats.new_nan or stats.new_inf:
            return float("inf")
        return 1.0 - summary["map"]["iou"]
    return stats.relative_l2()


def verdict(stats: dict, thresholds: Thresholds) -> tuple[bool, list[str]]:
    """(passed, reasons for failure) of one output's summary, against the limits that apply to
    it (its own, else the global ones). A probability map is judged by min_iou instead of atol,
    rtol and min_cosine, unless it sets those for itself."""
    name = stats.get("name", "")
    t = thresholds.for_output(name)
    own = thresholds.per_output.get(name, {})
    as_map = judged_as_map(stats, thresholds)
    failures = []
    if stats["new_nan"] or stats["new_inf"]:
        failures.append(f"{stats['new_nan']} NaN and {stats['new_inf']} inf values the reference does not have")
    if as_map and stats["map"]["iou"] < t.min_iou:
        m = stats["map"]
        failures.append(
            f"IoU {m['iou']:.6g} of the masks at > {m['threshold']:g} < min-iou {t.min_iou:g} "
            f"({m['flipped']} of {m['pixels']} pixels flip)"
        )
    raw = ("atol", "rtol", "min_cosine") if not as_map else tuple(k for k in ("atol", "rtol", "min_cosine") if k in own)
    if "atol" in raw and t.atol is not None and stats["max_abs_error"] > t.atol:
        failures.append(f"max abs error {stats['max_abs_error']:.4g} > atol {t.atol:g}")
    if "rtol" in raw and t.rtol is not None and stats["relative_error"] > t.rtol:
        failures.append(f"relative error {stats['relative_error']:.4g} > rtol {t.rtol:g}{_scale_note(stats)}")
    if "min_cosine" in raw and t.min_cosine is not None and stats["cosine"] < t.min_cosine:
        failures.append(f"cosine {stats['cosine']:.6f} < min-cosine {t.min_cosine:g}")
    if t.min_top1 is not None and stats["top1"] is not None and stats["top1"] < t.min_top1:
        failures.append(f"top-1 agreement {stats['top1']:.4f} < min-top1 {t.min_top1:g}")
    return not failures, failures


def _scale_note(stats: dict) -> str:
    """Why the relative error was measured against the floor, when it was."""
    scale, top = stats.get("relative_scale"), stats.get("max_abs_reference", 0.0)
    if scale is None or scale <= top:
        return ""
    return (
        f" (max abs error {stats['max_abs_error']:.3g} measured against {scale:.3g}, the low-precision "
        f"resolution at 1: max |reference| {top:.3g} is below it)"
    )
