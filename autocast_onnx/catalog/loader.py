"""Stage: rule catalog. Reads TOML rule files into a `RuleSet` (pure data) and validates them.

Precedence, lowest to highest (documented in docs/rules-format.md):
  1. [settings] unknown_op - the category of an op no file names;
  2. [ops.*] categories - a later file overrides an earlier one (the default profile first);
  3. [[nodes]] rules by node name - a later file overrides an earlier one, and within one file
     a later matching rule overrides an earlier one;
  4. command-line --exclude-op / --exclude-node / --include-node / --include-op; where an exclude and an include
     both match a node, the exclude (fp32) wins.
Data rules (out-of-range constants) and schema limits apply on top; a user forcing low precision
over a data rule gets the conversion and a warning in the plan.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
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
from ..graph.domains import normalize_domain
from ..patterns import UserPattern, compile_pattern, shown
from .toml_lines import TomlLines

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
OP_KEY = re.compile(r"(?:(?P<domain>[A-Za-z_][\w.\-]*):)?(?P<op>[A-Za-z_]\w*)")  # fullmatch it


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
    pattern: UserPattern | None  # matched with a time bound (patterns.py)
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
        return self.pattern.search(node_name)


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
    # sha256 of each file's bytes, in the order of `files`: the provenance record of a converted
    # model names the exact rules it was planned with (rewrite/provenance.py)
    digests: list[str] = field(default_factory=list)

    def op_rule(self, domain: str, op_type: str) -> OpRule | None:
        return self.ops.get((normalize_domain(domain), op_type))

    def pin(self, domain: str, op_type: str) -> Pin | None:
        return self.pins.get((normalize_domain(domain), op_type))


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


def parse_toml(text: str, where: str) -> dict:
    """The TOML document `text`, read by the standard parser. What it cannot read is bad input,
    said in one line naming `where`: a syntax error (with its line), arrays or inline tables
    nested deeper than the parser's recursion allows, a number too long to convert."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        at = re.search(r"line (\d+)", msg)
        raise AutocastError(
            f"invalid TOML: {msg}", f"{where}:{at.group(1)}" if at else where, "fix the syntax"
        ) from None
    except RecursionError:
        raise AutocastError(
            "invalid TOML: arrays or inline tables nested too deeply to read",
            where,
            "flatten the nesting; settings and rules need at most a few levels",
        ) from None
    except ValueError as exc:  # an integer of thousands of digits, beyond int()'s limit
        raise AutocastError(
            f"invalid TOML: a value cannot be read ({str(exc).split(':')[0]})", where, "fix the value"
        ) from None


def read_toml(path: Path, where: str, kind: str) -> tuple[str, dict]:
    """(text, data) of the TOML file `path` (a `kind` such as "rule file"), as parse_toml reads it;
    a file that is not UTF-8 or cannot be read is bad input naming `where`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AutocastError(f"{kind} is not UTF-8 text", where, "save it as UTF-8 TOML") from None
    except OSError as exc:
        raise AutocastError(f"cannot read the {kind}: {exc.strerror or exc}", where, "check the file") from None
    return text, parse_toml(text, where)


class _File:
    """One rule file being merged: its name for messages, its line map, and `fail`."""

    def __init__(self, where: str, text: str):
        self.where = where
        self.lines = TomlLines(text)
        self.user = where != "rules/default.toml"

    def fail(self, what: str, line: int, hint: str) -> NoReturn:
        raise AutocastError(what, f"{self.where}:{line}", hint)

    def table(self, data: dict, name: str) -> dict:
        """The top-level table `name` (empty when absent); anything else there is an error."""
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.fail(f"{name!r} must be a table", self.lines.key((), name), f"write [{name}]")
        return value


def _merge(rules: RuleSet, path: Path) -> None:
    where = "rules/default.toml" if path == default_rules_path() else str(path)
    if path.is_dir():
        raise AutocastError("is a directory, not a rule file", where, "pass a .toml rule file")
    if not path.is_file():
        raise AutocastError("rule file not found", where, "check the --rules path")
    text, data = read_toml(path, where, "rule file")
    file = _File(where, text)
    rules.files.append(where)
    rules.digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    for key in data:
        if key not in TOP_KEYS:
            file.fail(
                f"unknown table or key {shown(key)}", file.lines.key((), key), f"allowed: {', '.join(sorted(TOP_KEYS))}"
            )
    _merge_settings(rules, file, file.table(data, "settings"))
    _merge_thresholds(rules, file, file.table(data, "thresholds"))
    _merge_ops(rules, file, file.table(data, "ops"))
    _merge_pins(rules, file, file.table(data, "pins"))
    nodes = data.get("nodes", [])
    if not isinstance(nodes, list):
        file.fail(
            "'nodes' must be an array of tables ([[nodes]])", file.lines.key((), "nodes"), "write [[nodes]] entries"
        )
    for i, entry in enumerate(nodes):
        rules.node_rules.append(_node_rule(file, i, entry))


def _merge_settings(rules: RuleSet, file: _File, settings: dict) -> None:
    for key, value in settings.items():
        line = file.lines.key(("settings",), key)
        if key not in SETTINGS_KEYS:
            file.fail(f"unknown key {shown('settings.' + key)}", line, f"allowed: {', '.join(sorted(SETTINGS_KEYS))}")
        choices = OUTPUT_HEAD if key == "output_head" else CATEGORIES
        if not isinstance(value, str) or value not in choices:
            file.fail(f"settings.{key} must be one of {', '.join(choices)}, not {shown(value)}", line, "pick one")
        if key == "output_head":
            rules.output_head = OpRule(value, "output-head setting", Source(file.where, line))
        else:
            rules.unknown_op = OpRule(value, "category of ops that no rule file names", Source(file.where, line))


def _merge_thresholds(rules: RuleSet, file: _File, thresholds: dict) -> None:
    for key, value in thresholds.items():
        line = file.lines.key(("thresholds",), key)
        if key not in THRESHOLDS:
            file.fail(f"unknown threshold {shown(key)}", line, f"allowed: {', '.join(sorted(THRESHOLDS))}")
        kind, low, high = THRESHOLDS[key]
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int:
            ok_type = isinstance(value, int) and not isinstance(value, bool)
        if not ok_type or not (low <= value <= high):
            file.fail(
                f"threshold {key!r} must be {'an integer' if kind is int else 'a number'} in [{low}, {high}], "
                f"not {shown(value)}",
                line,
                "fix the value",
            )
        rules.thresholds[key] = kind(value)


def _merge_ops(rules: RuleSet, file: _File, ops: dict) -> None:
    seen: dict[tuple[str, str], tuple[str, int]] = {}
    for category, table in ops.items():
        header = ("ops", category)
        if category not in CATEGORIES:
            file.fail(
                f"unknown category {shown('[ops.' + category + ']')}",
                file.lines.table(header),
                f"allowed: {', '.join(CATEGORIES)}",
            )
        if not isinstance(table, dict):
            file.fail(
                f"'[ops.{category}]' must be a table of OpType = \"why\" entries",
                file.lines.table(header),
                "fix the table",
            )
        for op_key, why in table.items():
            line = file.lines.key(header, op_key)
            ident = _op_ident(file, op_key, line, f"[ops.{category}]")
            if not isinstance(why, str):
                file.fail(
                    f"{shown(op_key)} must map to a string saying why, not {type(why).__name__}",
                    line,
                    'write OpType = "reason"',
                )
            if ident in seen:
                other_cat, other_line = seen[ident]
                file.fail(
                    f"op {shown(op_key)} is in two categories: '{other_cat}' (line {other_line}) and '{category}'",
                    line,
                    "keep it in one category",
                )
            seen[ident] = (category, line)
            rules.ops[ident] = OpRule(category, why, Source(file.where, line))


def _op_ident(file: _File, op_key: str, line: int, table: str) -> tuple[str, str]:
    """(domain, op type) of a rule file's op key; a key that is no op name, or (in a user file) a
    default-domain op type nothing knows, is an error at `line`."""
    match = OP_KEY.fullmatch(op_key)
    if not match:
        file.fail(f"{shown(op_key)} is not an op name (OpType or domain:OpType)", line, "fix the key")
    if file.user:
        check_op_type(op_key, f"{file.where}:{line} {table}")
    return normalize_domain(match.group("domain") or ""), match.group("op")


def _merge_pins(rules: RuleSet, file: _File, pins: dict) -> None:
    for op_key, spec in pins.items():
        line = file.lines.key(("pins",), op_key)
        ident = _op_ident(file, op_key, line, "[pins]")
        if not isinstance(spec, dict):
            file.fail(
                f'pin {shown(op_key)} must be a table like {{ inputs = [2], why = "..." }}', line, "fix the entry"
            )
        for key in spec:
            if key not in PIN_KEYS:
                file.fail(
                    f"unknown key {shown(key)} in pin {shown(op_key)}", line, f"allowed: {', '.join(sorted(PIN_KEYS))}"
                )
        ports = {}
        for key in ("inputs", "outputs"):
            value = spec.get(key, [])
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                file.fail(
                    f"pin {shown(op_key)}: {key!r} must be a list of port indices (integers >= 0)", line, "fix the list"
                )
            ports[key] = tuple(value)
        why = spec.get("why", "")
        if not isinstance(why, str):
            file.fail(f"pin {shown(op_key)}: 'why' must be a string, not {type(why).__name__}", line, "fix the entry")
        rules.pins[ident] = Pin(ports["inputs"], ports["outputs"], why, Source(file.where, line))


def _node_rule(file: _File, i: int, entry) -> NodeRule:
    """The `i`-th [[nodes]] entry as a NodeRule, every key checked."""
    line = file.lines.table(("nodes",), i)
    if not isinstance(entry, dict):
        file.fail("each [[nodes]] entry must be a table", line, "fix the entry")
    for key in entry:
        if key not in NODE_KEYS:
            file.fail(
                f"unknown key {shown(key)} in [[nodes]]",
                file.lines.key(("nodes",), key, i),
                f"allowed: {', '.join(sorted(NODE_KEYS))}",
            )
    if ("match" in entry) == ("name" in entry):
        file.fail("a [[nodes]] entry needs exactly one of 'match' (regex) or 'name' (exact)", line, "add one")
    precision = entry.get("precision")
    if precision not in ("fp32", "low"):
        file.fail(f'[[nodes]] precision must be "fp32" or "low", not {shown(precision)}', line, "fix the value")
    pattern = None
    if "match" in entry:
        if not isinstance(entry["match"], str):
            file.fail("[[nodes]] match must be a string", line, "quote the regex")
        pattern = compile_pattern(entry["match"], f"{file.where}:{line}")
    elif not isinstance(entry["name"], str):
        file.fail("[[nodes]] name must be a string", line, "quote the name")
    why = entry.get("why", "")
    if not isinstance(why, str):
        file.fail(f"[[nodes]] why must be a string, not {type(why).__name__}", line, "fix the value")
    op_types = entry.get("op_types")
    if op_types is not None and (not isinstance(op_types, list) or not all(isinstance(o, str) for o in op_types)):
        file.fail("[[nodes]] op_types must be a list of op names", line, "fix the list")
    for op_type in op_types or ():
        check_op_type(op_type, f"{file.where}:{line} [[nodes]] op_types")
    frozen = frozenset(op_types) if op_types is not None else None
    return NodeRule(pattern, entry.get("name"), precision, why, frozen, Source(file.where, line))


@functools.cache
def known_op_types() -> frozenset[str]:
    """Op types of the default ONNX domain that anything can name: the installed onnx package's
    schemas, ONNX Runtime's registered ops (autocast_onnx/data) and the default rule profile.

        "Softmax" in known_op_types() -> True; "Softmaxx" -> False"""
    import json

    import onnx

    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if normalize_domain(s.domain) == ""}
    data = Path(__file__).resolve().parent.parent / "data"
    for file in ("ort_signatures.json", "ort_training_signatures.json"):
        names.update(k for k in json.loads((data / file).read_text(encoding="utf-8")) if ":" not in k)
    default = tomllib.loads(default_rules_path().read_text(encoding="utf-8"))
    for table in list(default.get("ops", {}).values()) + [default.get("pins", {})]:
        names.update(k for k in table if ":" not in k)
    return frozenset(names)


def check_op_type(op_key: str, where: str | None) -> None:
    """Refuse an op name that is not `OpType` or `domain:OpType` (an identifier), and a
    default-domain op type that no schema, ONNX Runtime registration or rule knows, with the
    nearest names; `domain:OpType` (a custom domain) is taken as written.

        "Softmax" -> ok;  "Softmaxx", "Soft-max", "Softmax " -> AutocastError (did you mean Softmax?)"""
    match = OP_KEY.fullmatch(op_key)
    if match is not None and normalize_domain(match.group("domain") or "") != "":
        return
    op = match.group("op") if match is not None else op_key
    if match is not None and op in known_op_types():
        return
    near = difflib.get_close_matches(op.strip(), sorted(known_op_types()), n=3, cutoff=0.6) if len(op) < 100 else []
    hint = f"did you mean {' or '.join(near)}? " if near else "check the spelling; "
    what = (
        f"op type {shown(op)} is in no ONNX schema and is no known runtime op"
        if match is not None
        else f"{shown(op_key)} is not an op name (OpType or domain:OpType)"
    )
    raise AutocastError(what, where, hint + "write a custom op as domain:OpType")
