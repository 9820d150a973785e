"""Standard-library helpers for files and processes, shared by the loader and saver (io.py), the
batch's workers (cli/batch.py) and the fast path's worker (fast/worker.py), which may import
nothing heavier than the standard library: it is forked before the command line imports onnx and
numpy."""

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


PR_SET_PDEATHSIG = 1  # prctl(2): the signal the kernel sends this process when its parent ends


def end_with_parent(sig: int, parent: int) -> bool:
    """Have the kernel send this (forked) process `sig` when its parent, of pid `parent`, ends
    however it ends (SIGKILL, the OOM killer): Linux's prctl(PR_SET_PDEATHSIG) through ctypes.
    A parent that ended before the request was made is not waited for: `sig` is sent at once.
    Returns False where the request cannot be made (not Linux, or prctl refused it): the caller
    then watches the parent itself. (The kernel sends it when the parent's thread that forked
    this process ends: fork from the thread that outlives the work, here always the only one.)"""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError, ValueError):
        return False
    if os.getppid() != parent:  # it ended first: this process was handed to another
        os.kill(os.getpid(), sig)
    return True
