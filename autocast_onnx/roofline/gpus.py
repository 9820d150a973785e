"""The GPU table (data/gpus.json): per GPU the dense tensor-core peaks by input type, the fp32
peak, DRAM bandwidth and the datasheet each comes from, plus the model's assumed launch cost and
the fractions of the peaks real kernels reach. Read once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..errors import AutocastError


@dataclass(frozen=True)
class GPU:
    key: str  # the table's key: "H100", "RTX4090"
    name: str
    fp16: float  # TFLOP/s, tensor cores, fp32 accumulation, dense
    bf16: float
    tf32: float
    fp32: float  # TFLOP/s without tensor cores
    bandwidth: float  # TB/s
    source: str

    def peak(self, kind: str) -> float:
        """FLOP/s of a product of `kind` inputs: fp16, bf16, tf32 or fp32."""
        return getattr(self, kind) * 1e12


@dataclass(frozen=True)
class Table:
    gpus: dict
    default: str
    launch_s: float
    compute_efficiency: float
    bandwidth_efficiency: float


@lru_cache(maxsize=1)
def table() -> Table:
    raw = json.loads(resources.files("autocast_onnx").joinpath("data/gpus.json").read_text())
    gpus = {key: GPU(key=key, **row) for key, row in raw["gpus"].items()}
    eff = raw["efficiency"]
    return Table(gpus, raw["default"], raw["launch_us"] * 1e-6, eff["compute"], eff["bandwidth"])


def gpu(name: str | None, where: str = "--gpu") -> GPU:
    """The table's GPU named `name` (case and spaces, dashes and underscores ignored: "rtx-4090" is
    RTX4090); None gives the default. An unknown name is one error naming the known ones."""
    t = table()
    if name is None:
        return t.gpus[t.default]
    wanted = _key(name)
    for key, row in t.gpus.items():
        if _key(key) == wanted:
            return row
    raise AutocastError(
        f"unknown GPU {name!r}", where, f"use one of {', '.join(t.gpus)} (autocast_onnx/data/gpus.json lists them)"
    )


def _key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())
