"""Errors. `AutocastError` is the one error type for bad input: the CLI prints it as a
single line (what, where, what to do) and exits with code 2. Anything else that escapes
is a bug in autocast-onnx and is allowed to fail loudly."""

from __future__ import annotations


class AutocastError(Exception):
    """Bad input from the user: a model, a rule file, a path or an option.

    `what` says what is wrong, `where` names the file/line/node, `hint` says what to do.
    """

    def __init__(self, what: str, where: str | None = None, hint: str | None = None):
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return text


class InternalCheckError(RuntimeError):
    """An invariant of the converter does not hold (a bug, not bad input)."""
