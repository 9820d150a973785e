"""The weight screen on the second core. While the main process indexes and classifies a model,
a forked worker converts the main graph's fp32 initializers to fp16 into memory both processes
share, and finds which of them lost range (the test `classify._screen_by_conversion` makes).
The data rules then read those results instead of converting the weights themselves, and the
rewrite stores the shared fp16 bytes.

Why a process: reading protobuf payloads and joining them holds the GIL, so a thread gains
nothing; the forked worker sees the loaded model as it was (copy-on-write) and only writes to
the shared buffer. It reads nothing the main process changes: it starts before the index is
built and the model is not edited until the rewrite, which waits for it.

Used when it can pay: Linux, fp16 target, a model in memory (no spill to external data), no
other thread running (a fork copies only the calling thread), and at least MIN_BYTES of fp32
weights. Anything unexpected in the worker (it died, its table is short) makes `results()`
return None and classification screens the weights itself, as it does without a worker.

    screen = WeightScreen.start(model, file_bytes)   # before build_index
    ...
    screened = screen.results()   # {name: (fp16 bytes view, lost)} or None
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ..hazards import fp16_lost
from ..io import parse_file

log = logging.getLogger(__name__)

MIN_BYTES = 16 * 2**20  # fp32 weight bytes below which the fork costs more than it saves
_GROUP_BYTES = 4 * 2**20  # fp32 bytes the worker converts and screens at a time (cache-sized)
_FLOAT = TensorProto.FLOAT


class WeightScreen:
    """A forked worker's fp16 conversion of the main graph's fp32 raw-data initializers."""

    def __init__(self, pid: int, fd: int, buffer: mmap.mmap, path, seen: tuple):
        self._path = path
        self._seen = seen  # the file as the worker found it: a file replaced since is not trusted
        self._pid = pid
        self._fd = fd
        self._buffer = buffer
        self._results: dict | None = None
        self._done = False

    @classmethod
    def start(cls, path, min_bytes: int | None = None) -> WeightScreen | None:
        """Fork the worker for the model file at `path`, or None where it cannot or would not pay
        (see the module docstring). Called before the model is loaded: the worker parses its own
        copy while this process parses the file too, and the fork copies no model memory that
        this process would then pay to write to (every page a fork shares is copied on its first
        write). The file's size bounds the fp32 payloads, so the shared buffer is sized without
        reading the tensors."""
        if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
            return None
        if threading.active_count() != 1:
            log.debug("weight screen: other threads are running, screening in process")
            return None
        try:
            file_bytes = os.stat(path).st_size
        except OSError:
            return None  # loading the model says what is wrong with it
        if file_bytes < (MIN_BYTES if min_bytes is None else min_bytes):
            return None
        seen = _identity(path)
        buffer = mmap.mmap(-1, file_bytes // 2 + mmap.PAGESIZE, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            log.debug("weight screen: fork failed (%s), screening in process", exc)
            os.close(read_fd)
            os.close(write_fd)
            buffer.close()
            return None
        if pid == 0:  # the worker: never returns
            os.close(read_fd)
            status = 1
            try:
                model = onnx.ModelProto()
                parse_file(Path(path), model)
                _work(model, buffer, write_fd)
                status = 0
            finally:
                os._exit(status)
        os.close(write_fd)
        return cls(pid, read_fd, buffer, path, seen)

    def results(self, model) -> dict | None:
        """name -> (fp16 bytes as a memoryview of the shared buffer, whether range was lost) for
        each screened initializer of the main graph of `model` (the file's model, as loaded and
        not edited since); None when the worker failed."""
        if self._done:
            return self._results
        self._done = True
        chunks = []
        try:
            while True:
                part = os.read(self._fd, 1 << 20)
                if not part:
                    break
                chunks.append(part)
        finally:
            os.close(self._fd)
            _, status = os.waitpid(self._pid, 0)
        table = b"".join(chunks)
        rows = np.frombuffer(table[: len(table) - len(table) % 24], dtype="<i8").reshape(-1, 3)
        inits = model.graph.initializer
        if (
            status != 0
            or len(table) % 24
            or (len(rows) and (rows[:, 0].max() >= len(inits) or 2 * int(rows[:, 1].sum()) > len(self._buffer)))
            or _identity(self._path) != self._seen
        ):
            log.debug("weight screen: the worker failed (status %d), screening in process", status)
            return None
        view = memoryview(self._buffer)
        out = {}
        offset = 0
        for ordinal, count, lost in rows.tolist():
            out[inits[ordinal].name] = (view[2 * offset : 2 * (offset + count)], bool(lost))
            offset += count
        view.release()  # the slices keep their own exports of the buffer
        self._results = out
        return out

    def close(self) -> None:
        """Stop the worker if its results were never read (a failure before classification)."""
        if not self._done:
            self._done = True
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:
                pass
            os.close(self._fd)
            os.waitpid(self._pid, 0)


def _work(model, buffer: mmap.mmap, fd: int) -> None:
    """In the worker: convert every fp32 raw-data initializer of the main graph into `buffer`
    (in graph order, back to back) and write the table (ordinal, elements, lost) to `fd`. Tensors
    are taken a cache-sized group at a time: one conversion and one screen per group."""
    out = np.frombuffer(buffer, dtype="<f2", count=len(buffer) // 2)
    rows: list[tuple[int, int, int]] = []
    group: list = []  # (ordinal, raw bytes) of the group being gathered
    gathered = 0
    offset = 0  # elements written so far

    def flush() -> None:
        nonlocal offset, gathered
        flat = np.frombuffer(b"".join([raw for _, raw in group]), dtype="<f4")
        half = out[offset : offset + flat.size]
        with np.errstate(over="ignore"):
            np.copyto(half, flat, casting="unsafe")
        counts = [len(raw) // 4 for _, raw in group]
        lost = np.zeros(len(group), dtype=bool)
        lost[np.unique(np.searchsorted(np.cumsum(counts), fp16_lost(flat, half), side="right"))] = True
        rows.extend(zip([k for k, _ in group], counts, lost.tolist()))
        offset += flat.size
        group.clear()
        gathered = 0

    for ordinal, tensor in enumerate(model.graph.initializer):
        if tensor.data_type != _FLOAT or not tensor.HasField("raw_data"):
            continue
        raw = tensor.raw_data
        if not raw or len(raw) % 4:
            continue
        group.append((ordinal, raw))
        gathered += len(raw)
        if gathered >= _GROUP_BYTES:
            flush()
    if group:
        flush()
    table = np.asarray(rows, dtype="<i8").reshape(-1, 3).tobytes()
    view = memoryview(table)
    while view:
        view = view[os.write(fd, view) :]
    os.close(fd)


def _identity(path) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
