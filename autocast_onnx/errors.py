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


def printable_lines(lines) -> str:
    """Lines of a text report joined by newlines, each through one_line: a name from a model, a
    path or a metadata value that holds a newline, a carriage return or a terminal escape stays
    inside its own line, so it can neither forge a line of its own (a CI annotation such as
    `::error file=...::`) nor move, clear or retitle the terminal."""
    return "\n".join(one_line(line) for line in lines)


def printable_text(text: str) -> str:
    """`text` with its newlines kept and every other character that is not printable escaped
    (one_line per line): the last guard of the command line's output, for text that another
    stage has laid out in lines already."""
    return text if text.isprintable() else printable_lines(text.split("\n"))


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
