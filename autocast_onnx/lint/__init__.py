"""Lint: checks declared in rules/lint.toml, run over a model, producing Diagnostics."""

from .catalog import Check, load_checks
from .engine import LintOptions, LintResult, lint

__all__ = ["Check", "LintOptions", "LintResult", "lint", "load_checks"]


# `autocast_onnx.lint(...)` is the API function (lint/api.py, re-exported by autocast_onnx.api);
# the package stays importable as `autocast_onnx.lint.<module>`.
import sys as _sys
import types as _types


class _CallablePackage(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .api import lint as _lint

        return _lint(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallablePackage
