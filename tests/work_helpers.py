"""Measures of work that do not move with the machine's speed, for tests that guard against
quadratic or exponential work without reading a clock: the function calls a call makes
(cProfile, Python and built-in, generator steps included), and the `re` functions among them."""

from __future__ import annotations

import cProfile
import os
import re


def profiled(fn, *args, builtins: bool = True, **kwargs) -> list:
    """The profile entries (cProfile's getstats()) of fn(*args, **kwargs)."""
    profile = cProfile.Profile(builtins=builtins)
    profile.enable()
    try:
        fn(*args, **kwargs)
    finally:
        profile.disable()
    return profile.getstats()


def call_count(stats: list) -> int:
    """The function calls of a profile (profiled)."""
    return sum(entry.callcount for entry in stats)


def in_re(filename: str) -> bool:
    """Whether `filename` is Python code of the `re` package (re.compile, re.match, its parser)."""
    folder = os.path.dirname(re.__file__)
    if os.path.basename(re.__file__) == "__init__.py":  # Python 3.11+: a package
        return os.path.dirname(filename) == folder
    return os.path.dirname(filename) == folder and os.path.basename(filename) in _RE_FILES  # pragma: no cover


_RE_FILES = ("re.py", "sre_compile.py", "sre_parse.py")  # Python 3.10


def files_loaded(fn, *args, **kwargs) -> list[str]:
    """The paths (as given) of the model files autocast_onnx.io.load_model reads while
    fn(*args, **kwargs) runs, in order: how often a command reads its input, counted by a
    profile hook rather than by patching the function (its callers hold it by name)."""
    import sys

    seen: list[str] = []

    def hook(frame, event, arg) -> None:
        code = frame.f_code
        ours = code.co_filename.endswith(os.path.join("autocast_onnx", "io.py"))
        if event == "call" and code.co_name == "load_model" and ours:
            seen.append(os.fspath(frame.f_locals["path"]))

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return seen
