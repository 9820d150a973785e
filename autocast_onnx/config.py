"""Settings from a configuration file, discovered as ruff and other Python tools do: starting in
the current folder and going up, the first folder with an `autocast-onnx.toml` (whose top-level
keys are the settings) or a `pyproject.toml` that has a `[tool.autocast-onnx]` table wins; in one
folder `autocast-onnx.toml` comes first. `--config FILE` names one directly. Command-line flags
override the file.

Keys (hyphens or underscores): atol, rtol, min-cosine, min-top1 (validate thresholds);
select, ignore, fail-on, suppress (lint); rules (extra conversion rule files, relative to the
configuration file), precision, keep-io-types, exclude-op, exclude-node, include-node (what
decides the plan). Every command reads the same file, so convert, explain, lint and check plan
every node alike."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .diagnostics import SEVERITIES
from .errors import AutocastError

VALIDATE_KEYS = ("atol", "rtol", "min_cosine", "min_top1")
LINT_KEYS = ("select", "ignore", "fail_on", "suppress")
PLAN_KEYS = ("rules", "precision", "keep_io_types", "exclude_op", "exclude_node", "include_node", "low_precision_io")
ALL_KEYS = VALIDATE_KEYS + LINT_KEYS + PLAN_KEYS


def find_config(start: Path | None = None) -> tuple[Path, bool] | None:
    """(file, is_pyproject) of the configuration in force, or None."""
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        own = folder / "autocast-onnx.toml"
        if own.is_file():
            return own, False
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            try:
                data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise AutocastError(f"invalid TOML: {exc}", str(pyproject), "fix the file") from None
            if "autocast-onnx" in data.get("tool", {}):
                return pyproject, True
    return None


def load_settings(start: Path | None = None, config: Path | None = None) -> tuple[dict, str | None]:
    """(settings, the file they came from). Keys are normalized to underscores."""
    found: tuple[Path, bool] | None
    if config is not None:
        config = Path(config)
        if not config.is_file():
            raise AutocastError("config file not found", str(config), "check the --config path")
        found = (config, config.name == "pyproject.toml")
    else:
        found = find_config(start)
    if found is None:
        return {}, None
    path, is_pyproject = found
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AutocastError(f"invalid TOML: {exc}", str(path), "fix the file") from None
    section = data.get("tool", {}).get("autocast-onnx", {}) if is_pyproject else data
    where = f"{path} [tool.autocast-onnx]" if is_pyproject else str(path)
    if not isinstance(section, dict):
        raise AutocastError("[tool.autocast-onnx] must be a table", str(path), "fix the section")
    settings = {}
    for key, value in section.items():
        norm = key.replace("-", "_")
        if norm not in ALL_KEYS:
            raise AutocastError(
                f"unknown key '{key}'", where, "allowed: " + ", ".join(k.replace("_", "-") for k in ALL_KEYS)
            )
        if norm in VALIDATE_KEYS:
            from .options import check_threshold

            try:
                check_threshold(norm, value, key, "fix the value")
            except AutocastError as exc:
                raise AutocastError(exc.what, where, "fix the value") from None
            value = float(value)
        elif norm == "precision":
            if value not in ("fp16", "bf16"):
                raise AutocastError(f"precision must be fp16 or bf16, not {value!r}", where, "fix the value")
        elif norm == "keep_io_types":
            if not isinstance(value, bool):
                raise AutocastError(f"keep-io-types must be true or false, not {value!r}", where, "fix the value")
        elif norm == "low_precision_io":
            if not isinstance(value, str) or not value.strip():
                raise AutocastError(
                    "low-precision-io must be a regex string", where, "e.g. 'past_key_values\\..*|present\\..*'"
                )
        elif norm in ("select", "ignore", "rules", "exclude_op", "exclude_node", "include_node"):
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise AutocastError(
                    f"{key} must be a list of non-empty strings",
                    where,
                    'e.g. ["AC1", "AC203"]' if norm in ("select", "ignore") else 'e.g. ["Softmax"]',
                )
            if norm == "rules":
                value = [str(path.parent / v) for v in value]
        elif norm == "fail_on":
            if value not in SEVERITIES:
                raise AutocastError(
                    f"fail-on must be one of {', '.join(SEVERITIES)}, not {value!r}", where, "fix the value"
                )
        elif norm == "suppress":
            if not isinstance(value, list) or not all(
                isinstance(v, dict)
                and set(v) <= {"code", "node"}
                and isinstance(v.get("code"), str)
                and isinstance(v.get("node", ".*"), str)
                for v in value
            ):
                raise AutocastError(
                    'suppress must be a list of { code = "AC...", node = "regex" } tables', where, "fix the entries"
                )
        settings[norm] = value
    settings["_source"] = where
    return settings, str(path)
