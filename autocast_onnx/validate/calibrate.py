"""Stage: calibration. Runs the fp32 model on calibration batches and records, for every float
tensor of the main graph, the largest |value| and the smallest nonzero |value| seen, plus
whether any value was inf/NaN. Streaming: the tensors are read in groups, so at most one
group's activations for one batch are held at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..dtypes import MIXABLE
from ..graph import build_index
from . import runner

GROUP = 128  # tensors read per session


@dataclass
class TensorRange:
    max_abs: float = 0.0
    min_nonzero_abs: float = float("inf")
    nonfinite: int = 0

    def add(self, array: np.ndarray) -> None:
        if array.size == 0:
            return
        mag = np.abs(array.astype(np.float32, copy=False))
        finite = np.isfinite(mag)
        self.nonfinite += int(mag.size - np.count_nonzero(finite))
        if not finite.all():
            mag = mag[finite]
        if mag.size:
            self.max_abs = max(self.max_abs, float(mag.max()))
            nonzero = mag[mag > 0]
            if nonzero.size:
                self.min_nonzero_abs = min(self.min_nonzero_abs, float(nonzero.min()))


def calibrate(model: onnx.ModelProto, batches: list[dict], device: str = "cpu", progress=None) -> dict:
    """name -> TensorRange for the graph inputs and every float node output of the main graph."""
    index = build_index(onnx.ModelProto.FromString(model.SerializeToString()))
    names = []
    types = {}
    for value in index.main.values.values():
        if value.dtype in MIXABLE and value.kind in ("node", "input"):
            names.append(value.name)
            types[value.name] = value.dtype
    ranges = {name: TensorRange() for name in names}
    for batch in batches:
        for name, array in batch.items():
            if name in ranges:
                ranges[name].add(array)
    node_values = [n for n in names if index.main.values[n].kind == "node"]
    groups = [node_values[i : i + GROUP] for i in range(0, len(node_values), GROUP)]
    bar = progress("calibrating", len(groups) * len(batches)) if progress else None
    for group in groups:
        sess = runner.session(runner.with_outputs(model, group, types), device)
        for batch in batches:
            outputs = runner.run(sess, batch)
            for name, array in zip(group, outputs):
                ranges[name].add(array)
            if bar:
                bar.update(1)
        del sess
    if bar:
        bar.finish()
    return ranges
