"""Hostile rule and configuration files (issue 26): each is refused in one line naming the file
(exit 2), or read correctly, and never hangs or ends in an internal error.

- The line mapper (autocast_onnx/catalog/toml_lines.py) read table headers with a backtracking
  regex: a 5 KB header of spaces around a quoted key holding ']' took minutes. It is a linear
  scanner now; a hypothesis fuzz checks it against tomllib (which tables exist, on which line).
- TOML nested thousands deep made tomllib raise RecursionError (exit 3); a 5,000-digit integer
  raised ValueError.
- A configuration value of the wrong type is an error naming the key and the file.
- An op name that is no identifier ('Soft-max', 'Softmax ') passed the unknown-op check and only
  warned; it is the same error as a misspelt one.
- A rule file's or a configuration's text is quoted with repr escapes in the messages, so a
  newline in a key cannot split the one-line error.
"""

from __future__ import annotations

import re
import sys

import onnx
import pytest
from bad_input_helpers import assert_one_error, invoke, run_process, small_model
from helpers import planned
from hypothesis import event, given, note
from hypothesis import strategies as st
from strategies import FUZZ  # the project's hypothesis profiles (AUTOCAST_ONNX_FUZZ)
from work_helpers import call_count, in_re, profiled

import autocast_onnx
from autocast_onnx.catalog import load_rules, toml_lines
from autocast_onnx.catalog.toml_lines import TomlLines
from autocast_onnx.errors import AutocastError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if sys.version_info >= (3, 11):  # the parser of `re`, which one_pass reads regexes with
    from re import _constants as sre
    from re import _parser as sre_parse
else:  # pragma: no cover
    import sre_constants as sre
    import sre_parse

SPACES = " " * 5000


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(8), path)
    return path


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path) -> AutocastError:
    with pytest.raises(AutocastError) as info:
        load_rules([path])
    return info.value


# ---- work that does not move with the machine's speed ------------------------------------------
# No test here reads a clock (a loaded machine must not fail them). The scanner's work is counted:
# the function calls it makes (cProfile), and the regexes it applies, each checked to match in one
# pass: from any position, every choice it makes (take one more blank or stop, this branch or that,
# the optional part or not) is decided by the next character, or made where nothing after it can
# fail, and it repeats single characters only, so a backtracking engine reads each character a
# bounded number of times. The header regex the scanner replaced,
# r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$", fails that check: its runs of \s and
# [^\]] can hand blanks to one another, which is what made a 5 KB header take minutes.
def calls(fn, *args, **kwargs) -> tuple[int, list[str]]:
    """The function calls (Python and built-in) made while fn(*args, **kwargs) runs, and the
    Python functions of the `re` package among them (a regex compiled, or applied through
    re.match and its like, rather than one of the compiled regexes the scanner holds)."""
    stats = profiled(fn, *args, **kwargs)
    in_re_calls = [e.code.co_name for e in stats if not isinstance(e.code, str) and in_re(e.code.co_filename)]
    return call_count(stats), in_re_calls


PROBE = frozenset(map(chr, range(0x250))) | frozenset("\u2028\u3000\U0001f600")  # what classes are probed with
CATEGORIES = {
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\w",
    sre.CATEGORY_NOT_WORD: r"\W",
}
NOTHING: frozenset = frozenset()


class NotOnePass(Exception):
    pass


def _chars(op, av) -> frozenset | None:
    """The PROBE characters a one-character item matches; None for an item of another kind."""
    if op is sre.LITERAL:
        return frozenset(chr(av))
    if op is sre.NOT_LITERAL:
        return PROBE - {chr(av)}
    if op is sre.ANY:
        return PROBE - {"\n"}
    if op is not sre.IN:
        return None
    chars, negate = set(), False
    for kind, value in av:
        if kind is sre.NEGATE:
            negate = True
        elif kind is sre.LITERAL:
            chars.add(chr(value))
        elif kind is sre.RANGE:
            chars.update(c for c in PROBE if value[0] <= ord(c) <= value[1])
        elif kind is sre.CATEGORY and value in CATEGORIES:
            chars.update(c for c in PROBE if re.fullmatch(CATEGORIES[value], c))
        else:
            raise NotOnePass(f"a class holding {kind}")
    return PROBE - chars if negate else frozenset(chars)


def _item(op, av, after: frozenset, sure: bool) -> tuple[frozenset, bool, bool]:
    """(the characters the item may start with, whether it may match nothing, whether it always
    matches), where `after` may follow it and `sure` says that what follows always matches;
    raises NotOnePass where the next character does not decide what the item does."""
    chars = _chars(op, av)
    if chars is not None:
        return chars, False, False
    if op is sre.AT:  # an anchor: matches nothing, and may fail
        return NOTHING, True, False
    if op is sre.SUBPATTERN:
        _, add_flags, del_flags, sub = av
        if add_flags or del_flags:
            raise NotOnePass("flags inside the pattern")
        return _sequence(list(sub), after, sure)
    if op is sre.BRANCH:
        arms = [_sequence(list(arm), after, sure) for arm in av[1]]
        starts = NOTHING.union(*(first for first, _, _ in arms))
        if sum(len(first) for first, _, _ in arms) != len(starts):
            raise NotOnePass("two branches may start with the same character")
        empty = any(e for _, e, _ in arms)
        if empty and not sure and starts & after:
            raise NotOnePass("a branch may match nothing and another take what follows")
        return starts, empty, any(s for _, _, s in arms)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        low, high, sub = av
        items = list(sub)
        if high > 1:
            one = _chars(*items[0]) if len(items) == 1 else None
            if one is None:
                raise NotOnePass("a repeat of more than one character")
            if low < high and not sure and one & after:
                raise NotOnePass(f"a run of a class is followed by {sorted(one & after)[:5]}, which it also takes")
            return one, low == 0, low == 0
        first, empty, always = _sequence(items, after, sure)
        if low == 0 and not sure and (empty or first & after):
            raise NotOnePass("an optional part may start with what follows it")
        return first, low == 0 or empty, low == 0 or always
    raise NotOnePass(str(op))


def _sequence(items, after: frozenset, sure: bool) -> tuple[frozenset, bool, bool]:
    first, empty, always = NOTHING, True, True  # of the items to the right, read so far
    for op, av in reversed(items):
        follows = first | (after if empty else NOTHING)
        head, head_empty, head_always = _item(op, av, follows, always and sure)
        first = head | (first if head_empty else NOTHING)
        empty, always = head_empty and empty, head_always and always
    return first, empty, always


def one_pass(pattern: re.Pattern, whole: bool = False) -> None:
    """Raise NotOnePass unless `pattern` matches in one pass from any position (see above);
    `whole`: as fullmatch applies it (the end of the text is one more thing that may fail)."""
    if pattern.flags & ~re.UNICODE:
        raise NotOnePass("flags")
    _sequence(list(sre_parse.parse(pattern.pattern, pattern.flags)), NOTHING, not whole)


def one_character(pattern: re.Pattern) -> bool:
    """Whether `pattern` is one character class: a search with it reads each character once."""
    items = list(sre_parse.parse(pattern.pattern, pattern.flags))
    return len(items) == 1 and _chars(*items[0]) is not None


MATCHING = ("match", "fullmatch", "search", "finditer", "findall", "sub", "subn", "split")


class _Applied:
    """A compiled regex of the scanner that records the methods it is applied with."""

    def __init__(self, name: str, pattern: re.Pattern, used: set):
        self._name, self._pattern, self._used = name, pattern, used

    def __getattr__(self, method):
        if method in MATCHING:
            self._used.add((self._name, method))
        return getattr(self._pattern, method)


class Regexes:
    """The compiled regexes toml_lines holds (`held`) and, from now on, each (name, method) it
    applies one of them with (`used`)."""

    def __init__(self, monkeypatch):
        self.held = {name: value for name, value in vars(toml_lines).items() if isinstance(value, re.Pattern)}
        self.used: set[tuple[str, str]] = set()
        for name, pattern in self.held.items():
            monkeypatch.setattr(toml_lines, name, _Applied(name, pattern, self.used))

    def check_held(self) -> None:
        """Every regex held matches in one pass (checked before any is applied to a long line)."""
        for name, pattern in self.held.items():
            try:
                one_pass(pattern)
            except NotOnePass as exc:
                pytest.fail(f"toml_lines.{name} = {pattern.pattern!r} may backtrack: {exc}")

    def check_used(self) -> None:
        """Those applied with fullmatch match in one pass to the end, and those searched with
        (tried at each position on) are one character class."""
        assert self.used, "the scanner applied none of its regexes"
        for name, method in sorted(self.used):
            pattern = self.held[name]
            if method == "fullmatch":
                one_pass(pattern, whole=True)
            elif method != "match":
                assert one_character(pattern), f"toml_lines.{name}.{method}: more than one character class"


# ---- 1. the line mapper ------------------------------------------------------------------------
def _header_document(blanks: int) -> str:
    return '# rules\n[settings]\nunknown_op = "keep_fp32"\n[' + " " * blanks + 'ops."a]b"]\n'


def test_a_5kb_header_with_a_quoted_bracket_loads_at_once(tmp_path, monkeypatch):
    """'[<5,000 spaces>ops."a]b"]' took minutes in the header regex; now the unknown category is
    reported at once, at its line: each regex the scanner holds matches in one pass, mapping the
    lines compiles no regex and takes no more calls per blank with 400 blanks than with 100
    (measured: the same 96 calls with none, 100, 400 or 20,000; few blanks, so that a regression
    fails here rather than hangs), and the 5 KB header is scanned with those regexes alone."""
    regexes = Regexes(monkeypatch)
    regexes.check_held()
    (none, in_re), (some, _), (many, _) = (calls(TomlLines, _header_document(n)) for n in (0, 100, 400))
    assert in_re == [], in_re
    assert many - none <= 4 * (some - none) + 10, (none, some, many)
    rules = write(tmp_path / "r.toml", _header_document(len(SPACES)))
    error = load_error(rules)
    regexes.check_used()
    assert error.where == f"{rules}:4" and "'[ops.a]b]'" in error.what


def test_spaced_headers_and_keys_map_to_their_lines(tmp_path):
    """Blanks around dots and brackets, quoted keys with ']' '#' '.', comments after headers,
    multi-line strings and arrays holding header-like lines: every rule keeps its own line."""
    text = (
        "[settings]  # [ops.low_precision]\n"  # 1
        'unknown_op = "keep_fp32"\n'  # 2
        '[ ops . "keep_fp32" ]   # ] [[nodes]]\n'  # 3
        'Softmax = """\n'  # 4
        "[ops.low_precision]\n"  # 5 (text of the string)
        'MatMul = "x"\n'  # 6 (text of the string)
        '"""\n'  # 7
        "[" + SPACES + "ops . 'follow'" + SPACES + "]\n"  # 8
        "'Relu' = 'plain'\n"  # 9
        "[pins]\n"  # 10
        'LayerNormalization = { inputs = [1, 2], why = "]#[" }\n'  # 11
        "[[ nodes ]]\n"  # 12
        'match = "^enc/"\n'  # 13
        'precision = "fp32"\n'  # 14
        "[[nodes]]  # second\n"  # 15
        'op_types = [\n  "MatMul",  # ]\n  "Gemm",\n]\n'  # 16-19
        'name = "head"\n'  # 20
        'precision = "fp32"\n'  # 21
    )
    rules = load_rules([write(tmp_path / "r.toml", text)])
    ops = {op: rule.source.line for (_, op), rule in rules.ops.items() if rule.source.file != "rules/default.toml"}
    assert ops == {"Softmax": 4, "Relu": 9}
    assert rules.unknown_op.source.line == 2
    assert rules.pins[("", "LayerNormalization")].source.line == 11
    assert [r.source.line for r in rules.node_rules] == [12, 15]


@pytest.mark.slow
def test_a_discovered_configuration_naming_the_5kb_rule_file_fails_at_once(model_path, tmp_path, monkeypatch):
    """In process, the command makes no more calls per blank of the header with 400 blanks than
    with 100 (measured: the same 36k calls with none, 100, 400 or 20,000), with regexes that match
    in one pass; then with 5,000 in a real process, whose timeout only keeps a hang from stalling
    the suite (nothing is timed)."""
    write(tmp_path / "autocast-onnx.toml", 'rules = ["slow.toml"]\n')
    regexes = Regexes(monkeypatch)
    regexes.check_held()

    def command(blanks: int) -> None:
        write(tmp_path / "slow.toml", "[" + " " * blanks + 'ops."a]b"]\n')
        assert_one_error(invoke(["convert", model_path, "-o", tmp_path / "o.onnx"]), "slow.toml:1", "a]b")

    monkeypatch.chdir(tmp_path)
    command(0)  # the first command in this process fills caches the others find filled
    none, some, many = (calls(command, n)[0] for n in (0, 100, 400))
    assert many - none <= 4 * (some - none) + 100, (none, some, many)
    regexes.check_used()
    write(tmp_path / "slow.toml", "[" + SPACES + 'ops."a]b"]\n')
    outcome = run_process(["convert", model_path, "-o", tmp_path / "o.onnx"], cwd=tmp_path, timeout=120)
    assert_one_error(outcome, "slow.toml:1", "a]b")
    assert not (tmp_path / "o.onnx").exists()


# Fuzz: generated documents whose true header and key lines are known, checked against tomllib.
KEY_CHARS = st.sampled_from(list("ab_-9 ].[#'\"\\\u00e9\u2028\u0085\t") + ["\\n"])
BARE_CHARS = "abcXYZ019_-"
HEADER_LIKE = ["[fake]", "[[fake]]", "  [ops.keep_fp32]", "x = 1", "[a.'b]'] # c", "'''", '\\"""']


def basic(text: str) -> str:
    """`text` as a TOML "basic" string."""
    out = []
    for c in text:
        out.append({"\\": "\\\\", '"': '\\"', "\t": "\\t"}.get(c, c if c != "\n" else "\\n"))
    return '"' + "".join(out) + '"'


@st.composite
def key_texts(draw, prefix: str) -> str:
    """A key's text (decoded): `prefix`, then characters a header might choke on."""
    return prefix + "".join(draw(st.lists(KEY_CHARS, max_size=6))).replace("\\n", "\n")


@st.composite
def written_key(draw, text: str) -> str:
    """`text` written as a bare, a basic or a literal key, whichever it allows."""
    forms = [basic(text)]
    if text and all(c in BARE_CHARS for c in text):
        forms.append(text)
    if "'" not in text and "\n" not in text and "\u2028" not in text:
        forms.append("'" + text + "'")
    return draw(st.sampled_from(forms))


blank = st.sampled_from(["", " ", "\t", "   "])


@st.composite
def dotted(draw, parts) -> str:
    written = [draw(written_key(p)) for p in parts]
    return "".join(w + (draw(blank) + "." + draw(blank) if k < len(written) - 1 else "") for k, w in enumerate(written))


@st.composite
def value_lines(draw) -> list[str]:
    """A value as lines: scalars, strings, multi-line strings and arrays that hold header-like
    lines, inline tables."""
    kind = draw(st.sampled_from(["int", "str", "literal", "ml", "ml_literal", "array", "inline", "date"]))
    filler = st.lists(st.sampled_from(HEADER_LIKE + ["plain", "]]", "# not a comment"]), min_size=1, max_size=3)
    if kind == "int":
        return [str(draw(st.integers(-(10**6), 10**6)))]
    if kind == "str":
        return [basic(draw(key_texts("s")))]
    if kind == "literal":
        return ["'a]b [c] # d'"]
    if kind == "date":
        return ["1979-05-27 07:32:00Z"]
    if kind == "ml":
        body = [line.replace("\\", "\\\\").replace('"', '\\"') for line in draw(filler)]
        return ['"""', *body, 'end"""']
    if kind == "ml_literal":
        return ["'''", *[line.replace("'", "") for line in draw(filler)], "'''"]
    if kind == "inline":
        return ['{ a = "]", "b]" = [1, 2], c = { d = "[x]" } }']
    items = draw(st.lists(st.sampled_from(['"]"', "[1, [2]]", "{ x = 1 }", "# [comment]", "'[q]'", "3"]), max_size=4))
    return ["[", *[item if item.startswith("#") else item + "," for item in items], "]"]


@st.composite
def toml_documents(draw):
    """(text, headers: {path: [lines]}, keys: [(path, instance, name, line)]) of a generated document."""
    paths = draw(st.lists(st.lists(key_texts("t"), min_size=1, max_size=3).map(tuple), max_size=5, unique=True))
    lines: list[str] = []
    headers: dict[tuple, list[int]] = {}
    keys: list[tuple] = []

    def body(path, instance):
        for k in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                lines.append(draw(st.sampled_from(["", "# [x]", "   # [[y]] = 2"])))
            name = f"v{k}"
            parts = [name] + ([draw(key_texts("w"))] if draw(st.booleans()) else [])
            keys.append((path, instance, name, len(lines) + 1))
            value = draw(value_lines())
            lines.append(draw(blank) + draw(dotted(parts)) + draw(blank) + "=" + draw(blank) + value[0])
            lines.extend(value[1:])

    body((), 0)
    for path in paths:
        array = draw(st.booleans())
        for instance in range(draw(st.integers(1, 3)) if array else 1):
            open_, close = ("[[", "]]") if array else ("[", "]")
            comment = draw(st.sampled_from(["", "  # ]", " #[[a]]", "\t# x"]))
            headers.setdefault(path, []).append(len(lines) + 1)
            lines.append(draw(blank) + open_ + draw(blank) + draw(dotted(path)) + draw(blank) + close + comment)
            body(path, instance)
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + newline, headers, keys


def lookup(data, path):
    """The table at `path` in tomllib's data (the last element of an array of tables)."""
    node = data
    for part in path:
        node = node[part]
        if isinstance(node, list):
            node = node[-1]
    return node


@FUZZ
@given(toml_documents())
def test_line_mapper_agrees_with_tomllib(document):
    text, headers, keys = document
    note(text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:  # e.g. [t] after [t.x] as an array of tables: not TOML
        event("not TOML (skipped)")
        return
    event(f"{len(headers)} table paths, {sum(map(len, headers.values()))} headers")
    mapped = TomlLines(text)
    assert mapped.tables == headers
    for path, lines in headers.items():
        table = lookup(data, path)
        assert isinstance(table, dict)
        count = len(lookup(data, path[:-1])[path[-1]]) if path in mapped.arrays else 1
        assert count == len(lines)
    for path, instance, name, line in keys:
        assert mapped.key(path, name, instance) == line, (path, instance, name)
        if instance == len(headers.get(path, [0])) - 1:
            assert name in lookup(data, path)


# ---- 2. nesting, huge numbers and types of configuration values --------------------------------
DEEP_ARRAY = "[" * 3000 + "]" * 3000
DEEP_TABLE = "{a=" * 3000 + "1" + "}" * 3000


@pytest.mark.parametrize("value", [DEEP_ARRAY, DEEP_TABLE, "1" * 5000], ids=["array", "inline_table", "huge_int"])
@pytest.mark.parametrize("place", ["rules", "config", "discovered", "pyproject", "config_pyproject"])
def test_unreadable_toml_is_one_error_naming_the_file(place, value, model_path, tmp_path, monkeypatch):
    name = {"rules": "r.toml", "config": "c.toml", "discovered": "autocast-onnx.toml"}.get(place, "pyproject.toml")
    prefix = "[tool.autocast-onnx]\n" if name == "pyproject.toml" else ""
    path = write(tmp_path / name, f"{prefix}exclude-op = {value}\n")
    args = ["convert", model_path, "-o", tmp_path / "o.onnx"]
    if place == "rules":
        args += ["--rules", path]
    elif place in ("config", "config_pyproject"):
        args += ["--config", path]
    monkeypatch.chdir(tmp_path)
    assert_one_error(invoke(args), str(path), "invalid TOML")
    assert not (tmp_path / "o.onnx").exists()


CONFIG_VALUES = [
    ("exclude-op", '"Softmax"'),
    ("exclude-node", '"^enc/"'),
    ("include-node", "[1]"),
    ("rules", '"r.toml"'),
    ("select", "{ a = 1 }"),
    ("precision", '["fp16"]'),
    ("keep-io-types", '"yes"'),
    ("low-precision-io", '["past.*"]'),
    ("fail-on", '["error"]'),
    ("atol", "[1]"),
    ("suppress", '"AC1"'),
]


@pytest.mark.parametrize("key,value", CONFIG_VALUES, ids=[k for k, _ in CONFIG_VALUES])
@pytest.mark.parametrize("name", ["autocast-onnx.toml", "pyproject.toml"])
def test_a_configuration_value_of_the_wrong_type_names_key_and_file(name, key, value, model_path, tmp_path):
    prefix = "[tool.autocast-onnx]\n" if name == "pyproject.toml" else ""
    path = write(tmp_path / name, f"{prefix}{key} = {value}\n")
    assert_one_error(invoke(["lint", model_path, "--config", path]), str(path), key)


def test_a_pyproject_whose_tool_is_no_table_is_no_configuration(model_path, tmp_path, monkeypatch):
    write(tmp_path / "pyproject.toml", 'tool = "autocast-onnx"\n')
    monkeypatch.chdir(tmp_path)
    outcome = invoke(["convert", model_path, "-o", tmp_path / "o.onnx"])
    assert outcome.code == 0 and outcome.exception is None, outcome.stderr


@pytest.mark.parametrize(
    "text,line,words",
    [
        ("[pins]\nSoftmax = { inputs = [0], why = 3 }\n", 2, "'why' must be a string"),
        ('[[nodes]]\nname = "fc"\nprecision = "fp32"\nwhy = ["x"]\n', 1, "why must be a string"),
        ('[settings]\nunknown_op = ["keep_fp32"]\n', 2, "settings.unknown_op must be one of"),
    ],
)
def test_rule_values_of_the_wrong_type_are_errors_at_their_line(text, line, words, tmp_path):
    path = write(tmp_path / "r.toml", text)
    error = load_error(path)
    assert error.where == f"{path}:{line}" and words in error.what


# ---- 4. op names that are no identifiers -------------------------------------------------------
@pytest.mark.parametrize("op", ["Soft-max", "Softmax ", " Softmax", "MatMuk", "com.microsoft:Soft max", "Softmax\n"])
def test_exclude_op_that_is_no_known_op_is_an_error(op, model_path, tmp_path):
    line = assert_one_error(invoke(["convert", model_path, "-o", tmp_path / "o.onnx", "--exclude-op", op]))
    assert "--exclude-op" in line and repr(op.strip("\n"))[1:-1] in line
    assert not (tmp_path / "o.onnx").exists()
    with pytest.raises(AutocastError, match="op"):
        autocast_onnx.convert(small_model(8), exclude_ops=[op])


def test_a_misspelt_op_name_gets_the_nearest_names():
    with pytest.raises(AutocastError, match="did you mean Softmax"):
        autocast_onnx.convert(small_model(8), exclude_ops=["Soft-max"])


@pytest.mark.parametrize(
    "text",
    [
        'exclude-op = ["Soft-max"]\n',
        'exclude-op = ["Softmax "]\n',
    ],
)
def test_configuration_op_names_are_checked(text, model_path, tmp_path):
    path = write(tmp_path / "c.toml", text)
    assert_one_error(invoke(["convert", model_path, "-o", tmp_path / "o.onnx", "--config", path]), "Soft")


@pytest.mark.parametrize(
    "text,line",
    [
        ('[[nodes]]\nname = "fc"\nprecision = "fp32"\nop_types = ["Soft max"]\n', 1),
        ('[[nodes]]\nname = "fc"\nprecision = "fp32"\nop_types = ["MatMul "]\n', 1),
        ('[ops.keep_fp32]\n"Soft-max" = "x"\n', 2),
        ('[pins]\n"Soft max" = { inputs = [1] }\n', 2),
    ],
)
def test_rule_file_op_names_that_are_no_identifiers_are_errors(text, line, tmp_path):
    path = write(tmp_path / "r.toml", text)
    error = load_error(path)
    assert error.where.startswith(f"{path}:{line}") and "not an op name" in error.what


def test_explain_op_that_is_no_op_name_is_an_error(model_path):
    assert_one_error(invoke(["explain", model_path, "--op", "Soft-max"]), "'Soft-max'")


# ---- 5. user text is quoted with escapes -------------------------------------------------------
@pytest.mark.parametrize(
    "text,shown",
    [
        ('[ops.keep_fp32]\n"Soft\\nmax" = "x"\n', "'Soft\\nmax'"),
        ('[[nodes]]\nname = "fc"\nprecision = "fp32"\nop_types = ["Soft\\nmax"]\n', "'Soft\\nmax'"),
        ('"a\\nb" = 1\n', "'a\\nb'"),
        ('[settings]\n"x\\ny" = 1\n', "'settings.x\\ny'"),
        ('[[nodes]]\nmatch = "a\\n("\nprecision = "fp32"\n', "'a\\n('"),
        ('[pins.Softmax]\ninputs = [0]\n"k\\rk" = 1\n', "'k\\rk'"),
    ],
)
def test_rule_file_text_in_messages_is_escaped(text, shown, tmp_path):
    error = load_error(write(tmp_path / "r.toml", text))
    assert shown in error.what and "\n" not in error.what and "\r" not in error.what


def test_configuration_text_in_messages_is_escaped(tmp_path):
    from autocast_onnx.config import load_settings

    path = write(tmp_path / "c.toml", '"a\\nb" = 1\n')
    with pytest.raises(AutocastError) as info:
        load_settings(config=path)
    assert "'a\\nb'" in info.value.what and "\n" not in info.value.what


def test_a_long_value_is_cut_in_the_message(tmp_path):
    path = write(tmp_path / "r.toml", "[settings]\nunknown_op = " + repr("x" * 10_000) + "\n")
    error = load_error(path)
    assert len(error.line()) < 400 and "..." in error.what


def test_a_node_rule_still_applies_with_its_line(tmp_path):
    """The counterpart of the refusals: a valid [[nodes]] rule decides its node, citing its line."""
    path = write(
        tmp_path / "r.toml", '# keep the first layer\n[[nodes]]\nmatch = "^fc$"\nprecision = "fp32"\nwhy = "x"\n'
    )
    result = autocast_onnx.convert(small_model(8), rules=[str(path)], check="none")
    assert planned(result, "fc") == "fp32" and planned(result, "fc2") == "fp16"
    reason = next(r for r in result.plan.by_name("fc")[0].reasons if r.code == "node-rule")
    assert reason.source == f"{path}:2"
