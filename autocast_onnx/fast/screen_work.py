"""The weight screen's half that runs in the worker (worker.py): convert the main graph's fp32
initializers straight from the mapped model file into the buffer both processes share, flag each
tensor whose conversion lost range (hazards.fp16_lost), and write the message the screen's other
half (plan/screen.py `_decode`) reads. Imported by the worker after its walk of the file: it
needs numpy."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..hazards import fp16_lost
from . import wire

_GROUP_BYTES = 4 * 2**20  # fp32 bytes the worker converts and screens at a time (cache-sized)
_ROW_ITEMS = 5  # the screen's message: ordinal, elements, lost, name length, payload offset
_FLOAT = TensorProto.FLOAT


def _work(data, buffer, inits: list | None = None) -> bytes:
    """In the worker (worker.py): convert every fp32 raw-data initializer of the main graph of
    the model file mapped as `data` (`inits`: its initializers as the worker's walk found them)
    into `buffer` (in graph order, back to back), straight from the mapped file, a cache-sized
    group at a time; returns the message the screen's `_decode` reads (the worker writes it)."""
    out = np.frombuffer(buffer, dtype="<f2", count=len(buffer) // 2)
    rows: list[tuple[int, int, int, int, int]] = []
    names: list[bytes] = []
    group: list = []  # (ordinal, name, fp32 view, offset) of the group being gathered
    gathered = 0
    offset = 0  # elements written so far

    def flush() -> None:
        nonlocal offset, gathered
        flat = group[0][2] if len(group) == 1 else np.concatenate([view for _, _, view, _ in group])
        half = out[offset : offset + flat.size]
        with np.errstate(over="ignore"):
            np.copyto(half, flat, casting="unsafe")
        counts = [view.size for _, _, view, _ in group]
        lost = np.zeros(len(group), dtype=bool)
        lost[np.unique(np.searchsorted(np.cumsum(counts), fp16_lost(flat, half), side="right"))] = True
        for (ordinal, name, _, start), count, flag in zip(group, counts, lost.tolist()):
            rows.append((ordinal, count, flag, len(name), start))
            names.append(name)
        offset += flat.size
        group.clear()
        gathered = 0

    for ordinal, name, start, length in _fp32_payloads(data, inits):
        group.append((ordinal, name, np.frombuffer(data, dtype="<f4", count=length // 4, offset=start), start))
        gathered += length
        if gathered >= _GROUP_BYTES:
            flush()
    if group:
        flush()
    message = len(rows).to_bytes(8, "little") + np.asarray(rows, dtype="<i8").reshape(-1, _ROW_ITEMS).tobytes()
    return message + b"".join(names)


def _fp32_payloads(data, inits: list | None = None):
    """(ordinal, name, start, length) of the raw fp32 payload of each initializer of the main
    graph of the serialized ModelProto `data`, in the order protobuf parses them (wire.py walks
    the encoding; an encoding it does not follow makes the worker fail)."""
    for init in wire.initializers(data) if inits is None else inits:
        if init.dtype == _FLOAT and init.raw is not None and init.raw[2] and not init.raw[2] % 4 and not init.external:
            yield init.ordinal, init.name, init.raw[1], init.raw[2]
