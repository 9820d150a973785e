"""Stage: rule catalog. Reads TOML rule files into a `RuleSet` (pure data) and validates them.

Precedence, lowest to highest (documented in docs/rules-format.md):
  1. [settings] unknown_op - the category of an op no file names;
  2. [ops.*] categories - a later file overrides an earlier one (the default profile first);
  3. [[nodes]] rules by node name - a later file overrides an earlier one, and within one file
     a later matching rule overrides an earlier one;
  4. command-line --exclude-op / --exclude-node / --include-node; where an exclude and an include
     both match a node, the exclude (fp32) wins.
Data rules (out-of-range constants) and schema limits apply on top; a user forcing low precision
over a data rule gets the conversion and a warning in the plan.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from ..errors import AutocastError, InternalCheckError

CATEGORIES = ("low_precision", "follow", "keep_fp32", "clear", "non_float")
TOP_KEYS = {"settings", "thresholds", "ops", "pins", "nodes"}
SETTINGS_KEYS = {"unknown_op", "output_head"}
OUTPUT_HEAD = ("fp32", "off")
THRESHOLDS = {
    # name: (type, minimum, maximum)
    "small_constant_elements": (int, 0, 2**31),
    "max_flush_fraction": (float, 0.0, 1.0),
    "calibration_headroom": (float, 1.0, 1e6),
}
DEFAULT_THRESHOLDS = {"small_constant_elements": 64, "max_flush_fraction": 0.01, "calibration_headroom": 4.0}
NODE_KEYS = {"match", "name", "precision", "why", "op_types"}
PIN_KEYS = {"inputs", "outputs", "why"}
OP_KEY = re.compile(r"^(?:(?P<domain>[A-Za-z_][\w.\-]*):)?(?P<op>[A-Za-z_]\w*)$")


@dataclass(frozen=True)
class Source:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class OpRule:
    category: str
    why: str
    source: Source


@dataclass(frozen=True)
class Pin:
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    why: str
    source: Source


@dataclass(frozen=True)
class NodeRule:
    pattern: re.Pattern | None
    name: str | None
    precision: str  # "fp32" or "low"
    why: str
    op_types: frozenset[str] | None
    source: Source

    def matches(self, node_name: str, op_type: str) -> bool:
        if self.op_types is not None and op_type not in self.op_types:
            return False
        if self.name is not None:
            return node_name == self.name
        if self.pattern is None:
            raise InternalCheckError("a node rule has neither 'name' nor 'match'")
        return self.pattern.search(node_name) is not None


@dataclass
class RuleSet:
    ops: dict[tuple[str, str], OpRule] = field(default_factory=dict)
    pins: dict[tuple[str, str], Pin] = field(default_factory=dict)
    node_rules: list[NodeRule] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    unknown_op: OpRule = OpRule("keep_fp32", "built-in default: unknown ops stay fp32", Source("<built-in>", 0))
    # "fp32": the output head (the last MatMul/Gemm/Conv/ConvTranspose on each path back from a
    # float graph output, and what lies between it and the output) stays fp32; "off": no rule
    output_head: OpRule = OpRule("off", "built-in default: no output-head rule", Source("<built-in>", 0))
    files: list[str] = field(default_factory=list)

    def op_rule(self, domain: str, op_type: str) -> OpRule | None:
        return self.ops.get((normalize_domain(domain), op_type))

    def pin(self, domain: str, op_type: str) -> Pin | None:
        return self.pins.get((normalize_domain(domain), op_type))


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def default_rules_path() -> Path:
    source_tree = Path(__file__).resolve().parent.parent.parent / "rules" / "default.toml"
    if source_tree.is_file():
        return source_tree
    from importlib import resources

    return Path(str(resources.files("autocast_onnx._rules") / "default.toml"))


def load_rules(user_files: Sequence[str | Path] = (), *, include_default: bool = True) -> RuleSet:
    """Load the default profile and then each user file in order, later ones overriding."""
    rules = RuleSet()
    paths = ([default_rules_path()] if include_default else []) + [Path(p) for p in user_files]
    for path in paths:
        _merge(rules, path)
    return rules


class _Lines:
    """Maps (table, key) to the line that defines it, for messages and plan reasons."""

    HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
    KEY = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|[A-Za-z0-9_.\-]+)\s*=')

    def __init__(self, text: str):
        self.keys: dict[tuple[str, str], list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        table = ""
        for lineno, line in enumerate(text.splitlines(), 1):
            header = self.HEADER.match(line)
            if header:
                table = header.group(2).strip()
                self.tables.setdefault(table, []).append(lineno)
                continue
            key = self.KEY.match(line)
            if key:
                name = key.group(1)
                if name.startswith('"'):
                    name = name[1:-1]
                self.keys.setdefault((table, name), []).append(lineno)

    def key(self, table: str, name: str, nth: int = 0) -> int:
        lines = self.keys.get((table, name), [])
        return lines[nth] if len(lines) > nth else self.table(table)

    def table(self, table: str, nth: int = 0) -> int:
        lines = self.tables.get(table, [])
        return lines[nth] if len(lines) > nth else 1


def _merge(rules: RuleSet, path: Path) -> None:
    where = "rules/default.toml" if path == default_rules_path() else str(path)
    if path.is_dir():
        raise AutocastError("is a directory, not a rule file", where, "pass a .toml rule file")
    if not path.is_file():
        raise AutocastError("rule file not found", where, "check the --rules path")
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise AutocastError("rule file is not UTF-8 text", where, "save it as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        at = re.search(r"line (\d+)", msg)
        raise AutocastError(
            f"invalid TOML: {msg}", f"{where}:{at.group(1)}" if at else where, "fix the syntax"
        ) from None
    lines = _Lines(text)
    rules.files.append(where)
    user_file = where != "rules/default.toml"

    def fail(what: str, line: int, hint: str) -> NoReturn:
        raise AutocastError(what, f"{where}:{line}", hint)

    for key in data:
        if key not in TOP_KEYS:
            fail(
                f"unknown table or key '{key}'",
                lines.key("", key) if ("", key) in lines.keys else lines.table(key),
                f"allowed: {', '.join(sorted(TOP_KEYS))}",
            )

    settings = data.get("settings", {})
    _expect_table(settings, "settings", lines, where)
    for key, value in settings.items():
        line = lines.key("settings", key)
        if key not in SETTINGS_KEYS:
            fail(f"unknown key 'settings.{key}'", line, f"allowed: {', '.join(sorted(SETTINGS_KEYS))}")
        if key == "output_head":
            if value not in OUTPUT_HEAD:
                fail(f"settings.output_head must be one of {', '.join(OUTPUT_HEAD)}, not {value!r}", line, "pick one")
            rules.output_head = OpRule(value, "output-head setting", Source(where, line))
            continue
        if value not in CATEGORIES:
            fail(f"settings.unknown_op must be one of {', '.join(CATEGORIES)}, not {value!r}", line, "pick a category")
        rules.unknown_op = OpRule(value, "category of ops that no rule file names", Source(where, line))

    thresholds = data.get("thresholds", {})
    _expect_table(thresholds, "thresholds", lines, where)
    for key, value in thresholds.items():
        line = lines.key("thresholds", key)
        if key not in THRESHOLDS:
            fail(f"unknown threshold '{key}'", line, f"allowed: {', '.join(sorted(THRESHOLDS))}")
        kind, low, high = THRESHOLDS[key]
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int:
            ok_type = isinstance(value, int) and not isinstance(value, bool)
        if not ok_type or not (low <= value <= high):
            fail(
                f"threshold '{key}' must be {'an integer' if kind is int else 'a number'} in [{low}, {high}], "
                f"not {value!r}",
                line,
                "fix the value",
            )
        rules.thresholds[key] = kind(value)

    ops = data.get("ops", {})
    _expect_table(ops, "ops", lines, where)
    seen: dict[tuple[str, str], tuple[str, int]] = {}
    for category, table in ops.items():
        header = f"ops.{category}"
        if category not in CATEGORIES:
            fail(f"unknown category '[{header}]'", lines.table(header), f"allowed: {', '.join(CATEGORIES)}")
        if not isinstance(table, dict):
            fail(f"'[{header}]' must be a table of OpType = \"why\" entries", lines.table(header), "fix the table")
        for op_key, why in table.items():
            line = lines.key(header, op_key)
            match = OP_KEY.match(op_key)
            if not match:
                fail(f"'{op_key}' is not an op name (OpType or domain:OpType)", line, "fix the key")
            if not isinstance(why, str):
                fail(
                    f"'{op_key}' must map to a string saying why, not {type(why).__name__}",
                    line,
                    'write OpType = "reason"',
                )
            if user_file:
                check_op_type(op_key, f"{where}:{line} [{header}]")
            ident = (normalize_domain(match.group("domain") or ""), match.group("op"))
            if ident in seen:
                other_cat, other_line = seen[ident]
                fail(
                    f"op '{op_key}' is in two categories: '{other_cat}' (line {other_line}) and '{category}'",
                    line,
                    "keep it in one category",
                )
            seen[ident] = (category, line)
            rules.ops[ident] = OpRule(category, why, Source(where, line))

    pins = data.get("pins", {})
    _expect_table(pins, "pins", lines, where)
    for op_key, spec in pins.items():
        line = lines.key("pins", op_key)
        match = OP_KEY.match(op_key)
        if not match:
            fail(f"'{op_key}' is not an op name (OpType or domain:OpType)", line, "fix the key")
        if user_file:
            check_op_type(op_key, f"{where}:{line} [pins]")
        if not isinstance(spec, dict):
            fail(f"pin '{op_key}' must be a table like {{ inputs = [2], why = \"...\" }}", line, "fix the entry")
        for key in spec:
            if key not in PIN_KEYS:
                fail(f"unknown key '{key}' in pin '{op_key}'", line, f"allowed: {', '.join(sorted(PIN_KEYS))}")
        ports = {}
        for key in ("inputs", "outputs"):
            value = spec.get(key, [])
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                fail(f"pin '{op_key}': '{key}' must be a list of port indices (integers >= 0)", line, "fix the list")
            ports[key] = tuple(value)
        ident = (normalize_domain(match.group("domain") or ""), match.group("op"))
        rules.pins[ident] = Pin(ports["inputs"], ports["outputs"], str(spec.get("why", "")), Source(where, line))

    nodes = data.get("nodes", [])
    if not isinstance(nodes, list):
        fail("'nodes' must be an array of tables ([[nodes]])", lines.key("", "nodes"), "write [[nodes]] entries")
    for i, entry in enumerate(nodes):
        line = lines.table("nodes", i)
        if not isinstance(entry, dict):
            fail("each [[nodes]] entry must be a table", line, "fix the entry")
        for key in entry:
            if key not in NODE_KEYS:
                fail(
                    f"unknown key '{key}' in [[nodes]]",
                    lines.key("nodes", key, 0) if key else line,
                    f"allowed: {', '.join(sorted(NODE_KEYS))}",
                )
        if ("match" in entry) == ("name" in entry):
            fail("a [[nodes]] entry needs exactly one of 'match' (regex) or 'name' (exact)", line, "add one")
        precision = entry.get("precision")
        if precision not in ("fp32", "low"):
            fail(f'[[nodes]] precision must be "fp32" or "low", not {precision!r}', line, "fix the value")
        pattern = None
        if "match" in entry:
            if not isinstance(entry["match"], str):
                fail("[[nodes]] match must be a string", line, "quote the regex")
            try:
                pattern = re.compile(entry["match"])
            except re.error as exc:
                fail(f"bad regex {entry['match']!r}: {exc}", line, "fix the pattern")
        elif not isinstance(entry["name"], str):
            fail("[[nodes]] name must be a string", line, "quote the name")
        op_types = entry.get("op_types")
        if op_types is not None and (not isinstance(op_types, list) or not all(isinstance(o, str) for o in op_types)):
            fail("[[nodes]] op_types must be a list of op names", line, "fix the list")
        for op_type in op_types or ():
            check_op_type(op_type, f"{where}:{line} [[nodes]] op_types")
        rules.node_rules.append(
            NodeRule(
                pattern,
                entry.get("name"),
                precision,
                str(entry.get("why", "")),
                frozenset(op_types) if op_types is not None else None,
                Source(where, line),
            )
        )


@functools.cache
def known_op_types() -> frozenset[str]:
    """Op types of the default ONNX domain that anything can name: the installed onnx package's
    schemas, ONNX Runtime's registered ops (autocast_onnx/data) and the default rule profile.

        "Softmax" in known_op_types() -> True; "Softmaxx" -> False"""
    import json

    import onnx

    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")}
    data = Path(__file__).resolve().parent.parent / "data"
    for file in ("ort_signatures.json", "ort_training_signatures.json"):
        names.update(k for k in json.loads((data / file).read_text(encoding="utf-8")) if ":" not in k)
    default = tomllib.loads(default_rules_path().read_text(encoding="utf-8"))
    for table in list(default.get("ops", {}).values()) + [default.get("pins", {})]:
        names.update(k for k in table if ":" not in k)
    return frozenset(names)


def check_op_type(op_key: str, where: str | None) -> None:
    """Refuse a default-domain op type that no schema, ONNX Runtime registration or rule knows,
    with the nearest names; `domain:OpType` (a custom domain) is taken as written."""
    match = OP_KEY.match(op_key)
    if match is None or normalize_domain(match.group("domain") or "") != "":
        return
    op = match.group("op")
    if op in known_op_types():
        return
    near = difflib.get_close_matches(op, sorted(known_op_types()), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}? " if near else "check the spelling; "
    raise AutocastError(
        f"op type '{op}' is in no ONNX schema and is no known runtime op",
        where,
        hint + "write a custom op as domain:OpType",
    )


def _expect_table(value, name: str, lines: _Lines, where: str) -> None:
    if not isinstance(value, dict):
        raise AutocastError(f"'{name}' must be a table", f"{where}:{lines.key('', name)}", f"write [{name}]")
