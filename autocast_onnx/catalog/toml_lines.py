"""Where each table and key of a TOML document is written: `file:line` for rule-file messages and
plan reasons. The TOML parser gives values, not lines, so this scanner reads the text once more.

It reads each character a bounded number of times (no backtracking regexes: a header such as
`[ops.<5,000 spaces>"a]b"]` costs no more than its length), and it knows what is no header or key:
lines inside multi-line strings and arrays, `]`, `#` and `.` inside quoted keys, comments. It
expects a document the TOML parser has accepted; on anything else it maps what it can and never
raises.

    [ops . "keep_fp32"]   # comment     -> table ("ops", "keep_fp32") at line 1
    Softmax = "why"                       -> key "Softmax" of that table at line 2
"""

from __future__ import annotations

import bisect
import re

Path = tuple[str, ...]

BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
BLANK = " \t"
# Jumps to the next character that matters (one character class each: nothing to backtrack).
IN_VALUE = re.compile(r"[\"'\[\]{}#\n]")
IN_BASIC = re.compile(r'["\\\n]')
IN_MULTILINE_BASIC = re.compile(r'["\\]')
BLANKS = re.compile(r"[ \t]*")
# The common line, whole: blank, a comment, or `key = "text"` with maybe a comment, where the key
# is one bare or "basic" part and no string has a quote or an escape inside. Runs of disjoint
# classes: it fails or matches in one pass over the line.
SIMPLE_LINE = re.compile(r'[ \t]*(?:(?:([A-Za-z0-9_\-]+)|"([^"\\\n]*)")[ \t]*=[ \t]*"[^"\\\n]*"[ \t]*)?(?:#[^\n]*)?\n')
# blanks, a bare key part (maybe empty) and blanks: three runs of disjoint classes, so at most one
# way to match from any position (the bare characters are BARE's)
BARE_PART = re.compile(r"[ \t]*([A-Za-z0-9_\-]*)[ \t]*")
ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class TomlLines:
    """The lines of a TOML document's table headers and keys.

    `tables[path]` lists the header line of each `[path]` / `[[path]]` in file order (one per
    array-of-tables element); `key(path, name)` is the line that defines `name` in that table."""

    def __init__(self, text: str):
        self.tables: dict[Path, list[int]] = {}
        self.arrays: set[Path] = set()  # paths written as [[path]]
        self._keys: dict[tuple[Path, int], dict[str, int]] = {}
        self._first: dict[Path, int] = {}  # the first line that names each path (header or key)
        _Scanner(text, self).run()

    # ---- queries ------------------------------------------------------------------------------
    def table(self, path: Path, nth: int = 0) -> int:
        """The header line of the `nth` `[path]` (or `[[path]]` element); where there is none, the
        first line that names the path or one of its parents; 1 when nothing does."""
        headers = self.tables.get(path, [])
        return headers[nth] if len(headers) > nth else self._near(path)

    def key(self, path: Path, name: str, nth: int = 0) -> int:
        """The line defining `name` in the `nth` instance of table `path` (instances count the
        `[[path]]` elements; a plain table has one); else the nearest line as `table` finds it."""
        line = self._keys.get((path, nth), {}).get(name)
        if line is not None:
            return line
        if (path + (name,)) in self.tables:
            return self.tables[path + (name,)][0]
        return self.table(path, nth)

    def has_key(self, path: Path, name: str, nth: int = 0) -> bool:
        """Whether `name` is written as a key (not a header) in the `nth` instance of `path`."""
        return name in self._keys.get((path, nth), {})

    def _near(self, path: Path) -> int:
        for end in range(len(path), 0, -1):
            line = self._first.get(path[:end])
            if line is not None:
                return line
        return 1

    # ---- recording (by the scanner) ------------------------------------------------------------
    def _header(self, path: Path, line: int, array: bool) -> int:
        lines = self.tables.setdefault(path, [])
        lines.append(line)
        if array:
            self.arrays.add(path)
        for end in range(1, len(path) + 1):
            self._first.setdefault(path[:end], line)
        return len(lines) - 1

    def _key(self, table: Path, instance: int, parts: list[str], line: int) -> None:
        for k, part in enumerate(parts):
            scope = table + tuple(parts[:k])
            self._keys.setdefault((scope, instance), {}).setdefault(part, line)
            self._first.setdefault(scope + (part,), line)


class _Scanner:
    """One pass over the text: statements are blank lines, comments, headers and key = value."""

    def __init__(self, text: str, out: TomlLines):
        self.text = text
        self.n = len(text)
        self.i = 0
        self.out = out
        self.table: Path = ()
        self.instance = 0
        self.starts = [0]
        at = text.find("\n")
        while at >= 0:
            self.starts.append(at + 1)
            at = text.find("\n", at + 1)

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos)

    def run(self) -> None:
        while self.i < self.n:
            simple = SIMPLE_LINE.match(self.text, self.i)
            if simple is not None:
                bare, quoted = simple.groups()
                if bare or quoted is not None:
                    key = bare or quoted
                    self.out._key(self.table, self.instance, [key], self.line(self.i))
                self.i = simple.end()
                continue
            self.skip_blank()
            if self.i >= self.n:
                return
            c = self.text[self.i]
            if c in "\r\n":
                self.i += 1
            elif c == "#":
                self.skip_line()
            elif c == "[":
                self.header()
            else:
                self.key_value()

    # ---- statements ------------------------------------------------------------------------------
    def header(self) -> None:
        start = self.i
        array = self.text.startswith("[[", start)
        self.i += 2 if array else 1
        parts = self.key_parts()
        self.skip_blank()
        close = "]]" if array else "]"
        if parts is not None and self.text.startswith(close, self.i):
            self.i += len(close)
            self.table = tuple(parts)
            self.instance = self.out._header(self.table, self.line(start), array)
        self.skip_line()

    def key_value(self) -> None:
        start = self.i
        parts = self.key_parts()
        self.skip_blank()
        if parts is None or not self.text.startswith("=", self.i):
            self.skip_line()
            return
        self.out._key(self.table, self.instance, parts, self.line(start))
        self.i += 1
        self.skip_blank()
        self.skip_value()
        self.skip_line()

    # ---- pieces ----------------------------------------------------------------------------------
    def skip_blank(self) -> None:
        blanks = BLANKS.match(self.text, self.i)
        assert blanks is not None  # [ \t]* matches anywhere
        self.i = blanks.end()

    def skip_line(self) -> None:
        """To the start of the next line (the rest of this one is a comment or blank)."""
        at = self.text.find("\n", self.i)
        self.i = self.n if at < 0 else at + 1

    def key_parts(self) -> list[str] | None:
        """A (dotted) key: bare, "basic" or 'literal' parts, blanks around the dots; None if the
        text here is no key."""
        parts = []
        while True:
            bare = BARE_PART.match(self.text, self.i)
            assert bare is not None  # every part of it may be empty
            self.i = bare.end()
            if bare.group(1):
                parts.append(bare.group(1))
            else:  # a quoted part, or no key
                part = self.key_part()
                if part is None:
                    return None
                parts.append(part)
                self.skip_blank()
            if not self.text.startswith(".", self.i):
                return parts
            self.i += 1

    def key_part(self) -> str | None:
        if self.i >= self.n:
            return None
        c = self.text[self.i]
        if c == '"':
            end = self.end_of_basic(self.i + 1)
            raw = self.text[self.i + 1 : end - 1]
            self.i = end
            return _unescape(raw)
        if c == "'":
            end = self.text.find("'", self.i + 1)
            end = self.n if end < 0 else end + 1
            raw = self.text[self.i + 1 : end - 1]
            self.i = end
            return raw
        start = self.i
        while self.i < self.n and self.text[self.i] in BARE:
            self.i += 1
        return self.text[start : self.i] if self.i > start else None

    def skip_value(self) -> None:
        """Past one value: a scalar, a string (multi-line ones too) or an array or inline table,
        however many lines it spans. Iterative, so deep nesting costs no stack."""
        depth = 0
        text = self.text
        while self.i < self.n:
            found = IN_VALUE.search(text, self.i)
            if found is None:
                self.i = self.n
                return
            self.i = found.start()
            c = text[self.i]
            if c == '"' or c == "'":
                self.i = self.end_of_string(self.i)
                if depth == 0:
                    return
                continue
            if c in "[{":
                depth += 1
            elif c in "]}":
                depth -= 1
                if depth <= 0:
                    self.i += 1
                    return
            elif depth == 0:  # '#' or a newline ends a one-line value
                return
            elif c == "#":
                self.skip_line()
                continue
            self.i += 1

    def end_of_string(self, pos: int) -> int:
        """The position just past the string that starts at `pos`."""
        text = self.text
        if text.startswith('"""', pos):
            return self.end_of_multiline(pos + 3, '"', escapes=True)
        if text.startswith("'''", pos):
            return self.end_of_multiline(pos + 3, "'", escapes=False)
        if text[pos] == '"':
            return self.end_of_basic(pos + 1)
        end = text.find("'", pos + 1)
        newline = text.find("\n", pos + 1)
        if end < 0 or 0 <= newline < end:
            return self.n if newline < 0 else newline
        return end + 1

    def end_of_basic(self, pos: int) -> int:
        """Past the closing quote of a one-line "basic" string whose text starts at `pos`."""
        text = self.text
        while True:
            found = IN_BASIC.search(text, pos)
            if found is None:
                return self.n
            pos = found.start()
            c = text[pos]
            if c == "\\":
                pos += 2
            elif c == '"':
                return pos + 1
            else:  # a newline: unterminated
                return pos

    def end_of_multiline(self, pos: int, quote: str, escapes: bool) -> int:
        """Past the closing triple quote (with up to two quotes of text before it)."""
        text = self.text
        while True:
            if escapes:
                found = IN_MULTILINE_BASIC.search(text, pos)
                at = -1 if found is None else found.start()
            else:
                at = text.find(quote * 3, pos)
            if at < 0:
                return self.n
            if text[at] == "\\":
                pos = at + 2
            elif text.startswith(quote * 3, at):
                while at < self.n and text[at] == quote:
                    at += 1
                return at
            else:
                pos = at + 1


def _unescape(raw: str) -> str:
    """The text of a basic-string key: \\n, \\", \\\\, \\uXXXX, ... decoded."""
    if "\\" not in raw:
        return raw
    out = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "\\" or i + 1 >= len(raw):
            out.append(c)
            i += 1
            continue
        e = raw[i + 1]
        width = 4 if e == "u" else 8 if e == "U" else 0
        if width and _is_hex(raw[i + 2 : i + 2 + width], width):
            out.append(chr(int(raw[i + 2 : i + 2 + width], 16)))
            i += 2 + width
            continue
        out.append(ESCAPES.get(e, "\\" + e))
        i += 2
    return "".join(out)


def _is_hex(text: str, width: int) -> bool:
    return len(text) == width and all(c in "0123456789abcdefABCDEF" for c in text) and int(text, 16) <= 0x10FFFF
