"""Settings from a configuration file, discovered as ruff and other Python tools do: starting in
the current folder and going up, the first folder with an `autocast-onnx.toml` (whose top-level
keys are the settings) or a `pyproject.toml` that has a `[tool.autocast-onnx]` table wins; in one
folder `autocast-onnx.toml` comes first. `--config FILE` names one directly. Command-line flags
override the file.

Keys (hyphens or underscores): atol, rtol, min-cosine, min-top1, min-iou, map-threshold (validate
thresholds), outputs (a table per output name of its own thresholds), compare-padded; speed,
iterations, warmup (timing: speed true/false, left out: on CUDA only), batches (generated batches);
select, ignore, fail-on, suppress (lint); rules (extra conversion rule files, relative to the
configuration file), precision, keep-io-types, exclude-op, include-op, exclude-node, include-node,
low-precision-io, opset, runtime (what decides the plan: PLAN_KEYS, read from PlanOptions' fields); gpu
(the GPU of convert's latency estimate, a key of data/gpus.json). Every
command reads the same file, so convert, explain, lint and check plan every node alike."""

from __future__ import annotations

from pathlib import Path

from .catalog.loader import read_toml
from .diagnostics import SEVERITIES
from .errors import AutocastError
from .patterns import shown
from .plan.options import planning_fields
from .runtimes import RUNTIME_CHOICES
from .validate.options import config_keys
from .validate.thresholds import THRESHOLDS

VALIDATE_KEYS = THRESHOLDS  # validate's thresholds, as validate/metrics.py declares them
# an output's own thresholds, then what else validation compares (compare padded positions too)
COMPARE_KEYS = ("outputs", *config_keys("compare"))
RUN_KEYS = config_keys("run")  # how validation runs: speed and generated batches (ValidateOptions' fields)
LINT_KEYS = ("select", "ignore", "fail_on", "suppress")
REPORT_KEYS = ("gpu",)  # the GPU of convert's latency estimate (roofline/gpus.json)
# the planning options that have a key, as PlanOptions declares them (plan/options.py)
PLAN_KEYS = tuple(f.metadata["key"] for f in planning_fields() if f.metadata["key"] is not None)
ALL_KEYS = VALIDATE_KEYS + COMPARE_KEYS + RUN_KEYS + LINT_KEYS + PLAN_KEYS + REPORT_KEYS


def find_config(start: Path | None = None) -> tuple[Path, bool] | None:
    """(file, is_pyproject) of the configuration in force, or None."""
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        own = folder / "autocast-onnx.toml"
        if own.is_file():
            return own, False
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            _, data = read_toml(pyproject, str(pyproject), "configuration file")
            tool = data.get("tool", {})
            if isinstance(tool, dict) and "autocast-onnx" in tool:
                return pyproject, True
    return None


def load_settings(start: Path | None = None, config: Path | None = None) -> tuple[dict, str | None]:
    """(settings, the file they came from). Keys are normalized to underscores; every value is
    checked (type and range), and a bad one is an AutocastError naming the key and the file."""
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
    _, data = read_toml(path, str(path), "configuration file")
    section = data
    if is_pyproject:
        tool = data.get("tool", {})
        section = tool.get("autocast-onnx", {}) if isinstance(tool, dict) else tool
    if not isinstance(section, dict):
        raise AutocastError("[tool.autocast-onnx] must be a table", str(path), "fix the section")
    where = f"{path} [tool.autocast-onnx]" if is_pyproject else str(path)
    settings = {}
    for key, value in section.items():
        norm = key.replace("-", "_")
        if norm not in ALL_KEYS:
            raise AutocastError(
                f"unknown key {shown(key)}", where, "allowed: " + ", ".join(k.replace("_", "-") for k in ALL_KEYS)
            )
        settings[norm] = _checked(norm, key, value, where, path)
    settings["_source"] = where
    return settings, str(path)


LIST_EXAMPLES = {"select": '["AC1", "AC203"]', "ignore": '["AC1", "AC203"]', "rules": '["my_rules.toml"]'}


def _checked(norm: str, key: str, value, where: str, path: Path):
    """The value of setting `norm` (written `key`), checked; rule files made relative to the
    configuration file's folder."""
    if norm in VALIDATE_KEYS:
        from .validate.options import check_threshold

        try:
            check_threshold(norm, value, key, "fix the value")
        except AutocastError as exc:
            raise AutocastError(exc.what, where, "fix the value") from None
        return float(value)
    if norm in RUN_KEYS:
        return _checked_run_key(norm, key, value, where)
    if norm == "outputs":
        return _checked_outputs(key, value, where)
    if norm == "compare_padded" and not isinstance(value, bool):
        raise AutocastError(f"{key} must be true or false, not {shown(value)}", where, "fix the value")
    if norm in ("precision", "fail_on"):
        choices = ("fp16", "bf16") if norm == "precision" else SEVERITIES
        if not isinstance(value, str) or value not in choices:
            allowed = "fp16 or bf16" if norm == "precision" else "one of " + ", ".join(choices)
            raise AutocastError(f"{key} must be {allowed}, not {shown(value)}", where, "fix the value")
    elif norm == "opset":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AutocastError(
                f"{key} must be a whole number (an opset, e.g. 22), not {shown(value)}", where, "fix the value"
            )
    elif norm == "runtime":
        if not isinstance(value, str) or value not in RUNTIME_CHOICES:
            allowed = ", ".join(RUNTIME_CHOICES[:-1]) + " or " + RUNTIME_CHOICES[-1]
            raise AutocastError(f"{key} must be {allowed}, not {shown(value)}", where, "fix the value")
    elif norm in ("keep_io_types", "precise"):
        if not isinstance(value, bool):
            raise AutocastError(f"{key} must be true or false, not {shown(value)}", where, "fix the value")
    elif norm == "low_precision_io":
        if not isinstance(value, str) or not value.strip():
            raise AutocastError(
                f"{key} must be a regex string, not {shown(value)}", where, "e.g. 'past_key_values\\..*|present\\..*'"
            )
    elif norm == "gpu":
        from .roofline import gpu

        if not isinstance(value, str):
            raise AutocastError(f"{key} must be a GPU's name, not {shown(value)}", where, "e.g. gpu = 'A100'")
        try:
            gpu(value, where)
        except AutocastError as exc:
            raise AutocastError(exc.what, where, exc.hint) from None
    elif norm == "suppress":
        _check_suppress(key, value, where)
    elif not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise AutocastError(
            f"{key} must be a list of non-empty strings, not {shown(value)}",
            where,
            "e.g. " + LIST_EXAMPLES.get(norm, '["Softmax"]' if norm.endswith("_op") else '["^encoder/"]'),
        )
    elif norm == "rules":
        return [str(path.parent / v) for v in value]
    return value


def _checked_run_key(norm: str, key: str, value, where: str):
    """speed (true or false) or a whole number within the range its flag takes (options.COUNTS)."""
    from .validate.options import COUNTS

    if norm == "speed":
        if not isinstance(value, bool):
            raise AutocastError(f"{key} must be true or false, not {shown(value)}", where, "fix the value")
        return value
    _, low, high = COUNTS[norm]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise AutocastError(
            f"{key} must be a whole number from {low} to {high}, not {shown(value)}", where, "fix the value"
        )
    return value


def _check_suppress(key: str, value, where: str) -> None:
    ok = isinstance(value, list) and all(
        isinstance(v, dict)
        and set(v) <= {"code", "node"}
        and isinstance(v.get("code"), str)
        and isinstance(v.get("node", ".*"), str)
        for v in value
    )
    if not ok:
        raise AutocastError(
            f'{key} must be a list of {{ code = "AC...", node = "regex" }} tables, not {shown(value)}',
            where,
            "fix the entries",
        )


def _checked_outputs(key: str, value, where: str) -> dict:
    """`[outputs.NAME]` tables: output name -> {threshold: number}, the keys those of
    thresholds.PER_OUTPUT_KEYS (hyphens or underscores), each value range-checked."""
    from .validate.options import check_threshold
    from .validate.thresholds import PER_OUTPUT_KEYS

    allowed = ", ".join(k.replace("_", "-") for k in PER_OUTPUT_KEYS)
    example = f"[{key}.prob_map] min-iou = 0.98"
    if not isinstance(value, dict) or not all(isinstance(own, dict) for own in value.values()):
        raise AutocastError(f"{key} must hold one table per output name, not {shown(value)}", where, f"e.g. {example}")
    out: dict = {}
    for name, own in value.items():
        out[name] = {}
        for sub, number in own.items():
            norm = sub.replace("-", "_")
            if norm not in PER_OUTPUT_KEYS:
                raise AutocastError(f"unknown key {shown(sub)} in {key}.{name}", where, "allowed: " + allowed)
            try:
                check_threshold(norm, number, sub, "fix the value", f"{key}.{name}.{sub}")
            except AutocastError as exc:
                raise AutocastError(exc.what, where, "fix the value") from None
            out[name][norm] = float(number)
    return out
