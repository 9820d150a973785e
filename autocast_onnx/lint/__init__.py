"""Lint: checks declared in rules/lint.toml, run over a model, producing Diagnostics."""

from .catalog import Check, load_checks
from .engine import LintOptions, LintResult, lint

__all__ = ["Check", "LintOptions", "LintResult", "lint", "load_checks"]
