"""Errors. `AutocastError` is the one error type for bad input: the CLI prints it as a
single line (what, where, what to do) and exits with code 2. Anything else that escapes
is a bug in autocast-onnx and is allowed to fail loudly."""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` with every character that is not printable (newline, carriage return, escape,
    NUL, tab, line separators, bidi controls, undecodable bytes of a file name) written as its
    Python escape (`\\n`, `\\x1b`, `\\udcff`): a message repeats names from models, rule files and
    paths, and one holding a newline would otherwise split its line, or forge a second one."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class AutocastError(Exception):
    """Bad input from the user: a model, a rule file, a path or an option.

    `what` says what is wrong, `where` names the file/line/node, `hint` says what to do. A
    message quotes the user's text with !r; line() escapes whatever is left (see one_line).
    """

    def __init__(self, what: str, where: str | None = None, hint: str | None = None):
        self.what = what
        self.where = where
        self.hint = hint
        super().__init__(self.line())

    def line(self) -> str:
        """The message as one line: 'WHERE: WHAT (HINT)', control characters escaped."""
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return one_line(text)


class InternalCheckError(RuntimeError):
    """An invariant of the converter does not hold (a bug, not bad input)."""
