"""The validation thresholds, declared once: one field of Thresholds per threshold, with what
every surface reads from it (its bounds, its --target name, whether an output may set its own,
its help text). The command line's flags and help, the configuration's keys, --target and the
Python API are derived from these fields. Light on purpose (no numpy): the command line reads it
when it starts."""

from __future__ import annotations

import math
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any


def _limit(bounds: tuple[float, float], target: str | None, text: str, per_output: bool = True) -> dict:
    """A threshold's field metadata, what every surface reads from it: `bounds` (the values it takes,
    on the command line, in the configuration file and in --target), `target` (its name in
    `--target KEY=X`, None: no target sets it), `per_output` (an output may set its own: --rtol
    NAME=X, [tool.autocast-onnx.outputs.NAME]), `text` (its flag's help, before the default). Its
    flag is `--` and its name with hyphens, its configuration key and Python keyword its name."""
    return {"bounds": bounds, "target": target, "per_output": per_output, "help": text}


@dataclass
class Thresholds:
    """The limits a validation holds each output to (metrics.verdict), one field per threshold:
    a new threshold is one field here, with its metadata (_limit), plus the verdict's test."""

    # max |converted - reference|
    atol: float | None = field(default=None, metadata=_limit((0.0, math.inf), "atol", "Max absolute error"))
    # max |converted - reference| / max(max |reference|, RELATIVE_FLOOR)
    rtol: float | None = field(
        default=0.01,
        metadata=_limit(
            (0.0, math.inf), "rtol", "Max error relative to max(max |reference|, the low type's resolution at 1)"
        ),
    )
    min_cosine: float | None = field(
        default=0.999, metadata=_limit((-1.0, 1.0), "cosine", "Min cosine similarity, -1 to 1")
    )
    min_top1: float | None = field(
        default=0.99, metadata=_limit((0.0, 1.0), "top1", "Min top-1 agreement of class-score outputs, 0 to 1")
    )  # only for outputs that look like class scores
    # probability maps only: IoU of the masks at map_threshold, which replaces atol/rtol/min_cosine
    min_iou: float | None = field(
        default=0.99,
        metadata=_limit(
            (0.0, 1.0), "iou", "Min IoU of a probability map's masks, 0 to 1; replaces atol/rtol/cosine there"
        ),
    )
    map_threshold: float = field(
        default=0.5, metadata=_limit((0.0, 1.0), None, "A probability map's mask is its values above this, 0 to 1")
    )
    per_output: dict = field(default_factory=dict)  # output name -> {key of PER_OUTPUT_KEYS: value}

    @classmethod
    def unset(cls) -> Thresholds:
        """Limits with no threshold a --target sets (a search judged by those it is given alone)."""
        unset: dict[str, Any] = {f.name: None for f in threshold_fields() if f.metadata["target"]}
        return cls(**unset)

    def for_output(self, name: str) -> Thresholds:
        """The limits that apply to output `name`: its own where it has them, else these."""
        return replace(self, **self.per_output.get(name, {}), per_output={})

    def measured_as(self, validation: Thresholds) -> Thresholds:
        """These limits (a --target's), with the map thresholds of `validation` (global and per
        output): a search measures maps with the masks validation cuts."""
        own = {
            name: {"map_threshold": limits["map_threshold"]}
            for name, limits in validation.per_output.items()
            if "map_threshold" in limits
        }
        return replace(self, map_threshold=validation.map_threshold, per_output=own)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "per_output"}
        out["outputs"] = {name: dict(own) for name, own in self.per_output.items()}
        return out


def threshold_fields() -> tuple[Field, ...]:
    """The fields of Thresholds that are thresholds (each with its metadata: _limit)."""
    return tuple(f for f in fields(Thresholds) if "bounds" in f.metadata)


THRESHOLDS = tuple(f.name for f in threshold_fields())  # atol, rtol, ...: each a flag, a key and a keyword
# the limits one output may set for itself (--rtol NAME=X, [tool.autocast-onnx.outputs.NAME])
PER_OUTPUT_KEYS = tuple(f.name for f in threshold_fields() if f.metadata["per_output"])
