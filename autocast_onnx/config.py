"""Settings from `[tool.autocast-onnx]` in pyproject.toml, found in the current folder or the
nearest parent that has one, as other Python tools do. Command-line flags override them."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import AutocastError

VALIDATE_KEYS = {"atol": float, "rtol": float, "min_cosine": float, "min_top1": float}


def find_pyproject(start: Path | None = None) -> Path | None:
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_settings(start: Path | None = None) -> tuple[dict, str | None]:
    """(settings, file they came from). Keys use underscores; hyphens are accepted."""
    path = find_pyproject(start)
    if path is None:
        return {}, None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AutocastError(f"invalid TOML: {exc}", str(path), "fix the file") from None
    section = data.get("tool", {}).get("autocast-onnx", {})
    if not isinstance(section, dict):
        raise AutocastError("[tool.autocast-onnx] must be a table", str(path), "fix the section")
    settings = {}
    for key, value in section.items():
        norm = key.replace("-", "_")
        if norm in VALIDATE_KEYS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise AutocastError(f"[tool.autocast-onnx] {key} must be a number, not {value!r}", str(path),
                                    "fix the value")
            settings[norm] = float(value)
        else:
            raise AutocastError(f"unknown key '{key}' in [tool.autocast-onnx]", str(path),
                                "allowed: " + ", ".join(k.replace("_", "-") for k in VALIDATE_KEYS))
    return settings, str(path)
