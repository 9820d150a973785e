"""The worker a conversion forks before it loads the model file. It walks the file's protobuf
encoding once (wire.py) for two stages:

- the loader (io.load_model with in_file.parser): the worker writes the file's encoding with the main graph's large
  fp32 payloads left in the file (wire.leaving_payloads) into memory both processes share, and
  lists those payloads; the main process parses that encoding instead of walking the file;
- the weight screen (screen.py; its worker half in screen_work.py): the worker converts the
  main graph's fp32 payloads to fp16 from the mapped file into shared memory and flags those that
  lost range.

This module imports nothing beyond the standard library and wire.py; the worker imports the
screen's half (screen_work.py) itself, after the walk. (The command line once forked it before
importing onnx and numpy, to walk beside those imports; measured side by side it bought nothing:
docs/benchmarks.md.)

What the worker writes on its pipe, in order: the loader's message (a header of two int64: the
encoding's size in the shared `encoding` buffer, or -1 when the walk failed, and the number of
rows; then a row of four int64 per payload left in the file: ordinal, offset, length and the
length of the tensor's name; then the names, back to back), then the screen's message
(screen.py), then nothing more: it exits. The loader checks each row against its parse of
the encoding (in_file._left_in_file) and the screen each of its own against the loaded model
(WeightScreen.results): a walk that disagrees with protobuf is never used.

Forked only where it can pay: Linux, no other thread running (a fork copies only the calling
thread), a model file of at least MIN_BYTES, and a process of at most MAX_PARENT_BYTES resident
(a process that holds more would pay a copy of each shared page it then writes to). It ends with
the process that forked it, however that ends (filesys.end_with_parent: SIGKILL on Linux)."""

from __future__ import annotations

import gc
import mmap
import os
import signal
import sys
import threading
from array import array
from pathlib import Path

from ..filesys import end_with_parent, identity, write_all
from . import wire

MIN_BYTES = 16 * 2**20  # model file bytes below which the fork costs more than it saves
MAX_PARENT_BYTES = 256 * 2**20  # resident bytes of this process above which it does not fork
HEADER_BYTES = 16  # the loader's message: encoding size, row count
ROW_ITEMS = 4  # ordinal, offset, length, name length


class Worker:
    """The parent's handle on a forked worker: its process, the read end of its pipe, the
    screen's and the loader's shared buffers, and the file as the worker found it."""

    def __init__(
        self, pid: int, fd: int, buffer: mmap.mmap | None, encoding: mmap.mmap | None, path: Path, seen: tuple
    ):
        self.pid = pid
        self.fd = fd
        self.buffer = buffer
        self.encoding = encoding
        self.path = path
        self.seen = seen


def fork(path, min_bytes: int | None = None, max_parent_bytes: int | None = None) -> Worker | None:
    """Fork the worker for the model file at `path`, or None where it cannot or would not pay
    (limits: MIN_BYTES and MAX_PARENT_BYTES unless given)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return None
    if threading.active_count() != 1:
        return None
    if resident_bytes() > (MAX_PARENT_BYTES if max_parent_bytes is None else max_parent_bytes):
        return None
    try:
        file_bytes = os.stat(path).st_size
    except OSError:
        return None  # loading the model says what is wrong with it
    if file_bytes < (MIN_BYTES if min_bytes is None else min_bytes):
        return None
    seen = identity(path)
    # sized from the file: fp16 payloads are at most half of it, and the encoding with payloads
    # left in the file is smaller than the file; only the pages written take memory
    buffer = mmap.mmap(-1, file_bytes // 2 + mmap.PAGESIZE)
    encoding = mmap.mmap(-1, file_bytes + mmap.PAGESIZE)
    parent = os.getpid()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        buffer.close()
        encoding.close()
        return None
    if pid == 0:  # the worker: never returns
        status = 1
        try:
            # it ends with the process that forked it (SIGKILL, the OOM killer): it writes only
            # the shared buffers and its pipe, and nothing else would end a walk or screen no
            # one waits for (or let a batch's parent see its worker's pipe close)
            end_with_parent(signal.SIGKILL, parent)
            os.close(read_fd)
            gc.disable()  # no cyclic collections: it keeps an object per initializer until it exits
            _run(path, buffer, encoding, write_fd)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    return Worker(pid, read_fd, buffer, encoding, Path(path), seen)


def _run(path, buffer: mmap.mmap, encoding: mmap.mmap, fd: int) -> None:
    """In the worker: one walk of the file, the loader's message, then the screen's work."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        try:
            graph = wire.main_graph(view)
            inits = list(wire.initializers(view, graph))
        except (wire.Unwalked, IndexError):
            write_all(fd, array("q", [-1, 0]).tobytes())
            raise
        chosen = [init for init in inits if wire.may_leave_in_file(init)]
        size = (
            _write_parts(encoding, wire.leaving_payloads(view, graph, chosen, os.path.basename(path))) if chosen else 0
        )
        rows = array("q", [size, len(chosen)])
        for init in chosen:
            rows.extend((init.ordinal, init.raw[1], init.raw[2], len(init.name)))
        write_all(fd, rows.tobytes() + b"".join(init.name for init in chosen))
        del rows, chosen
        from . import screen_work  # numpy and onnx: imported here, after the walk

        write_all(fd, screen_work._work(data, buffer, inits))
        os.close(fd)
        del view


def _write_parts(buffer: mmap.mmap, parts: list) -> int:
    """Write `parts` (views of the mapped file, which must all be released before it is closed)
    one after the other at the start of `buffer`; returns how many bytes."""
    return sum(buffer.write(part) for part in parts)


def stop(worker: Worker) -> None:
    """Kill and reap `worker` (its buffers go with the last reference to them)."""
    try:
        os.kill(worker.pid, 9)
    except ProcessLookupError:
        pass
    try:
        os.close(worker.fd)
    except OSError:
        pass
    os.waitpid(worker.pid, 0)


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return MAX_PARENT_BYTES + 1  # unknown: do not fork
