"""Stage: lint catalog. Loads and validates the check declarations of rules/lint.toml."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..diagnostics import SEVERITIES
from ..errors import AutocastError

REQUIRED = ("code", "name", "severity", "kind", "summary", "why", "fix")
CODE = re.compile(r"^AC\d{3}$")
NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Check:
    code: str
    name: str
    severity: str
    kind: str
    summary: str
    why: str
    fix: str
    example: str = ""
    params: dict = field(default_factory=dict)
    line: int = 0


def lint_rules_path() -> Path:
    source_tree = Path(__file__).resolve().parent.parent.parent / "rules" / "lint.toml"
    if source_tree.is_file():
        return source_tree
    from importlib import resources

    return Path(str(resources.files("autocast_onnx._rules") / "lint.toml"))


@lru_cache(maxsize=4)
def load_checks(path: str | None = None) -> tuple[Check, ...]:
    """All checks, in file order; raises AutocastError naming file:line for a bad entry."""
    from .checks import KINDS

    file = Path(path) if path else lint_rules_path()
    where = "rules/lint.toml" if file == lint_rules_path() else str(file)
    text = file.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AutocastError(f"invalid TOML: {exc}", where, "fix the syntax") from None
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip() == "[[check]]"]
    checks, seen = [], {}
    for k, entry in enumerate(data.get("check", [])):
        line = lines[k] if k < len(lines) else 0
        loc = f"{where}:{line}"
        for key in REQUIRED:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise AutocastError(f"check needs a non-empty string '{key}'", loc, "complete the entry")
        if not CODE.match(entry["code"]):
            raise AutocastError(f"bad check code {entry['code']!r}", loc, "codes look like AC123")
        if entry["code"] in seen or entry["name"] in seen:
            raise AutocastError(
                f"duplicate check code or name {entry['code']}/{entry['name']}",
                loc,
                "codes and names are unique and never reused",
            )
        if not NAME.match(entry["name"]):
            raise AutocastError(f"check name {entry['name']!r} is not kebab-case", loc, "e.g. softmax-in-low-precision")
        if entry["severity"] not in SEVERITIES:
            raise AutocastError(
                f"severity {entry['severity']!r} is not one of {', '.join(SEVERITIES)}", loc, "fix the value"
            )
        if entry["kind"] not in KINDS:
            raise AutocastError(f"unknown check kind {entry['kind']!r}", loc, f"known: {', '.join(sorted(KINDS))}")
        seen[entry["code"]] = seen[entry["name"]] = True
        params = {k: v for k, v in entry.items() if k not in REQUIRED and k != "example"}
        checks.append(
            Check(
                code=entry["code"],
                name=entry["name"],
                severity=entry["severity"],
                kind=entry["kind"],
                summary=entry["summary"],
                why=entry["why"],
                fix=entry["fix"],
                example=entry.get("example", ""),
                params=params,
                line=line,
            )
        )
    return tuple(checks)
