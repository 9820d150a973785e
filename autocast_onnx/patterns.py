"""User regexes, matched within a time bound. Every regex the user gives (--exclude-node,
--include-node, --low-precision-io, `[[nodes]] match` in rule files, lint suppressions in the
configuration or the model, explain's NODE) is matched against names the model brings, and
Python's `re` backtracks without limit: '^(a|a)+$' on a name of 40 'a's and a 'b' would run
for days. So every such regex is compiled here, once, and matched with the `regex` package,
which takes the same syntax (each pattern is checked with `re.compile` first, so what is
accepted is exactly Python's regex syntax) and stops a match at a timeout. A pattern that runs
out of time is bad input: an AutocastError naming the pattern, where it came from (an option,
a rule file's file:line) and what to do.

Bounds: MATCH_TIMEOUT_S for one name, PATTERN_BUDGET_S for all the names one compiled pattern
meets; a pattern is compiled anew for each conversion, lint or explain. Typical patterns take
microseconds per name, so only a pattern that backtracks catastrophically comes near either.

    p = compile_pattern("^enc/", "--exclude-node");  p.search("enc/fc") -> True
    compile_pattern("^(a|a)+$", "--exclude-node").search("a" * 40 + "b") -> AutocastError after 1 s
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from .errors import AutocastError

MATCH_TIMEOUT_S = 1.0  # one name
PATTERN_BUDGET_S = 10.0  # every name one compiled pattern meets
HINT = (
    "the regex backtracks too much: rewrite it without nested or overlapping repeats such as (a+)+, "
    "(a|a)* or (.*a){20}, e.g. anchor a literal prefix like '^encoder/'"
)


class UserPattern:
    """A user's regex, matched with a time bound. `pattern` is its text, `origin` where it came
    from (e.g. "--exclude-node", "rules.toml:7 [[nodes]] match"): the `where` of the error a
    match that runs out of time raises. Raises re.error for a regex that does not compile."""

    __slots__ = ("_compiled", "_spent", "origin", "pattern")

    def __init__(self, text: str, origin: str):
        try:
            re.compile(text)  # the accepted syntax is Python's: its errors, as re words them
        except RecursionError:
            raise re.error("groups nested too deeply") from None
        except OverflowError as exc:  # a repeat count beyond re's limit
            raise re.error(str(exc)) from None
        import regex  # here, not above: a command given no regex never pays its import (~7 ms)

        try:
            self._compiled = regex.compile(text)
        except (regex.error, RecursionError, OverflowError) as exc:  # pragma: no cover - re took it
            raise re.error(f"{exc} (accepted by Python's re, not by the bounded matcher)") from None
        self.pattern = text
        self.origin = origin
        self._spent = 0.0

    def search(self, name: str) -> bool:
        """Whether the regex matches somewhere in `name` (re.search)."""
        return self._bounded(self._compiled.search, name)

    def fullmatch(self, name: str) -> bool:
        """Whether the regex matches the whole of `name` (re.fullmatch)."""
        return self._bounded(self._compiled.fullmatch, name)

    def _bounded(self, method: Callable, name: str) -> bool:
        left = PATTERN_BUDGET_S - self._spent
        limit = max(min(MATCH_TIMEOUT_S, left), 1e-3)
        start = time.perf_counter()
        try:
            return method(name, timeout=limit) is not None
        except TimeoutError:
            raise self._timeout(name, per_name=limit >= MATCH_TIMEOUT_S) from None
        finally:
            self._spent += time.perf_counter() - start

    def _timeout(self, name: str, per_name: bool) -> AutocastError:
        took = (
            f"more than {MATCH_TIMEOUT_S:g} s to match the name {shown(name)}"
            if per_name
            else f"more than {PATTERN_BUDGET_S:g} s in all to match the model's names (the last: {shown(name)})"
        )
        return AutocastError(f"regex {shown(self.pattern)} takes {took}", self.origin, HINT)


def compile_pattern(text: str, origin: str) -> UserPattern:
    """`text` as a UserPattern; a regex that does not compile is an AutocastError at `origin`.

    compile_pattern("([", "--exclude-node") -> AutocastError("bad regex '([': ...", "--exclude-node")"""
    try:
        return UserPattern(text, origin)
    except re.error as exc:
        raise AutocastError(f"bad regex {shown(text)}: {exc}", origin, "fix the pattern") from None


def shown(value, limit: int = 80) -> str:
    r"""User text (or any value) quoted for a one-line message: its repr, so quotes show and
    control characters are escaped, cut to `limit` characters; a value nested too deeply to
    repr is named by its type.

        shown("Soft\nmax") -> "'Soft\\nmax'";  shown("x" * 500) -> "'xxx...xx..."  (80 characters)"""
    try:
        text = repr(value)
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compile_patterns(patterns, flag: str) -> list[UserPattern]:
    """Node- or tensor-name regexes, compiled for bounded matching (patterns.py); a bad one is an
    AutocastError naming the flag, and so is one that later takes too long on a name."""
    out = []
    for pattern in patterns:
        try:
            out.append(UserPattern(pattern, flag))
        except re.error as exc:
            raise AutocastError(f"bad regex {shown(pattern)} for {flag}: {exc}", None, "fix the pattern") from None
    return out
