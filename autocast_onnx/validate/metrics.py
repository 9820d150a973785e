"""Stage: validate / metrics. Per-output error statistics between reference and converted
outputs, accumulated over batches, and the pass/fail verdict against thresholds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

TOPK = 5
CLASS_NAME = re.compile(r"logit|prob|score|class|pred|label", re.I)
MAX_NAMED_RANK = 3  # [batch, classes] or [batch, sequence, classes]; a rank-4 map's last axis is spatial


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
class Thresholds:
    atol: float | None = None  # max |converted - reference|
    rtol: float | None = 0.01  # max |converted - reference| / max |reference|
    min_cosine: float | None = 0.999
    min_top1: float | None = 0.99  # only for outputs that look like class scores

    def as_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine, "min_top1": self.min_top1}


@dataclass
class OutputStats:
    name: str
    shape: list = field(default_factory=list)
    elements: int = 0
    max_abs: float = 0.0
    sum_abs: float = 0.0
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

    def add(self, ref: np.ndarray, out: np.ndarray) -> None:
        self.shape = list(ref.shape)
        if ref.dtype.kind not in "fc":
            same = int(np.count_nonzero(ref != out))
            self.elements += ref.size
            self.max_abs = max(self.max_abs, float(same > 0))
            return
        r = ref.astype(np.float64).ravel()
        o = out.astype(np.float64).ravel()
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
            self.max_ref = max(self.max_ref, float(np.abs(r[both]).max()))
            self.dot += float(np.dot(o[both], r[both]))
            self.norm_ref += float(np.dot(r[both], r[both]))
            self.norm_out += float(np.dot(o[both], o[both]))
        if self.class_scores is None:
            self.class_scores_why = class_score_kind(self.name, ref)
            self.class_scores = self.class_scores_why is not None
        elif self.class_scores and self.class_scores_why is None:
            self.class_scores_why = "--class-output"
        if self.class_scores and ref.ndim >= 1 and ref.shape[-1] >= 2:
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
        out = {
            "name": self.name,
            "shape": self.shape,
            "elements": self.elements,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.sum_abs / self.elements if self.elements else 0.0,
            "max_abs_reference": self.max_ref,
            "relative_error": self.max_abs / self.max_ref if self.max_ref > 0 else self.max_abs,
            "cosine": float(cosine),
            "new_nan": self.new_nan,
            "new_inf": self.new_inf,
            "reference_nonfinite": self.ref_nonfinite,
            "top1": None,
            "topk": None,
            "k": None,
            "class_scores": self.class_scores_why if self.class_scores and self.rows else None,
        }
        if self.class_scores and self.rows:
            out["top1"] = self.top1_agree / self.rows
            out["topk"] = self.topk_overlap / self.rows
            out["k"] = self.k
        return out


def verdict(stats: dict, thresholds: Thresholds) -> tuple[bool, list[str]]:
    """(passed, reasons for failure) of one output's summary."""
    failures = []
    if stats["new_nan"] or stats["new_inf"]:
        failures.append(f"{stats['new_nan']} NaN and {stats['new_inf']} inf values the reference does not have")
    if thresholds.atol is not None and stats["max_abs_error"] > thresholds.atol:
        failures.append(f"max abs error {stats['max_abs_error']:.4g} > atol {thresholds.atol:g}")
    if thresholds.rtol is not None and stats["relative_error"] > thresholds.rtol:
        failures.append(f"relative error {stats['relative_error']:.4g} > rtol {thresholds.rtol:g}")
    if thresholds.min_cosine is not None and stats["cosine"] < thresholds.min_cosine:
        failures.append(f"cosine {stats['cosine']:.6f} < min-cosine {thresholds.min_cosine:g}")
    if thresholds.min_top1 is not None and stats["top1"] is not None and stats["top1"] < thresholds.min_top1:
        failures.append(f"top-1 agreement {stats['top1']:.4f} < min-top1 {thresholds.min_top1:g}")
    return not failures, failures
