"""Standard-library file helpers shared by the loader and saver (io.py) and the fast path's worker
(fast/worker.py), which may import nothing heavier than the standard library: it is forked before
the command line imports onnx and numpy."""

from __future__ import annotations

import os


def write_all(fd: int, data) -> None:
    """`data` (bytes-like) written whole to the file descriptor `fd`, whatever os.write takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def identity(path) -> tuple:
    """The file at `path` as stat_identity sees it; () when it cannot be looked at."""
    try:
        return stat_identity(os.stat(path))
    except OSError:
        return ()


def stat_identity(st: os.stat_result) -> tuple:
    """What tells one state of a file from another: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
