"""Options: one frozen object per concern, built the same way for every command from the
configuration file (`[tool.autocast-onnx]` in pyproject.toml or an autocast-onnx.toml, see
config.py) and the command-line flags or API arguments, which win. A list given on the command
line replaces the configuration's list rather than extending it.

  PlanOptions        what decides the precision plan: precision, rule files, keep_io_types,
                     node and op selections (plan/options.py: one declaration per option, with
                     its flag and configuration key). convert, explain, lint (what the rules
                     protect) and check all plan with the same object, so they agree on every node.
  ValidateOptions    inputs and thresholds of validation (validate/core.py defines it).
  LintOptions        which checks run and what fails (lint/engine.py defines it).

The CLI only collects flags and calls these builders; the Python API's keywords go through the
same builders, and the objects travel whole to the stage that reads them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .errors import AutocastError
from .patterns import compile_patterns as compile_patterns  # the flags' regexes; re-exported
from .patterns import shown
from .plan.options import PlanOptions as PlanOptions  # declared beside the plan; re-exported
from .plan.options import plan_options as plan_options

# Allowed values of each threshold (command line, configuration file and --target).
THRESHOLD_BOUNDS = {"atol": (0.0, math.inf), "rtol": (0.0, math.inf), "min_cosine": (-1.0, 1.0), "min_top1": (0.0, 1.0)}
SEED_MAX = 2**32 - 1  # numpy seeds are unsigned 32-bit


def check_threshold(key: str, value, flag: str, hint: str, label: str | None = None) -> None:
    """Refuse a threshold outside THRESHOLD_BOUNDS (or not a finite number)."""
    low, high = THRESHOLD_BOUNDS[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        bound = " >= 0" if high == math.inf else f" from {low:g} to {high:g}"
        raise AutocastError(f"{label or flag} must be a finite number{bound}, not {shown(value)}", flag, hint)


def validate_options(settings: dict | None = None, **flags):
    """ValidateOptions from configuration `settings` and the validation flags (the keyword names
    of the CLI's validation option group). Thresholds come from the flags, else the
    configuration, else the defaults."""
    from .validate.core import ValidateOptions
    from .validate.inputs import parse_assignments, parse_ranges
    from .validate.metrics import Thresholds

    settings = settings or {}
    thresholds = Thresholds()
    for key in THRESHOLD_BOUNDS:
        value = flags.get(key)
        if value is None:
            value = settings.get(key, getattr(thresholds, key))
        if value is not None:
            check_threshold(
                key, value, "--" + key.replace("_", "-"), "fix the threshold (command line or [tool.autocast-onnx])"
            )
            value = float(value)
        setattr(thresholds, key, value)
    seed = flags.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise AutocastError(
            f"--seed must be a whole number from 0 to 2**32-1, not {seed!r}", "--seed", "pick another seed"
        )
    return ValidateOptions(
        inputs=flags.get("inputs"),
        dims=parse_assignments(_assignments(flags.get("dims", ())), "dim"),
        ranges=parse_ranges(_assignments(flags.get("ranges", ()))),
        seed=seed,
        thresholds=thresholds,
        speed=flags.get("speed", True),
        class_outputs=list(flags.get("class_outputs", ())),
        strict=bool(flags.get("strict") or settings.get("strict", False)),
        batches=_count("batches", flags),
        iterations=_count("iterations", flags),
        warmup=_count("warmup", flags),
        generate=_count("generate", flags),
        device=_choice("device", flags),
        numerics=_choice("numerics", flags),
    )


# The validation options' whole numbers (default, lowest, highest) and choices (the first is the
# default): the command line's click types hold its flags to the same.
COUNTS = {
    "batches": (1, 1, 10_000),
    "iterations": (20, 1, 1_000_000),
    "warmup": (3, 0, 100_000),
    "generate": (16, 0, 1024),
}
CHOICES = {"device": ("auto", "cpu", "cuda"), "numerics": ("auto", "emulate", "plain")}


def _count(key: str, flags: dict) -> int:
    """A validation count (COUNTS) from the flags, or AutocastError naming its flag."""
    default, low, high = COUNTS[key]
    value = flags.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        flag = "--" + key
        raise AutocastError(f"{flag} must be a whole number from {low} to {high}, not {shown(value)}", flag, "fix it")
    return value


def _choice(key: str, flags: dict) -> str:
    """A validation choice (CHOICES) from the flags, or AutocastError naming its flag."""
    allowed = CHOICES[key]
    value = flags.get(key, allowed[0])
    if value not in allowed:
        flag = "--" + key
        raise AutocastError(f"{flag} must be one of {', '.join(allowed)}, not {shown(value)}", flag, "fix it")
    return value


def _assignments(given) -> list:
    """--dim / --input-range values as the command line gives them (NAME=VALUE, NAME=LO:HI): a
    mapping (the Python API's form, e.g. {"batch": 4} or {"x": (0, 1)}) is written out in the
    flag's form first, so both forms are read and checked by the same parser."""
    if not isinstance(given, Mapping):
        return list(given)
    return [
        f"{name}={':'.join(map(str, value)) if isinstance(value, (tuple, list)) else value}"
        for name, value in given.items()
    ]


def parse_targets(targets):
    """`--target` values (e.g. ["cosine=0.9999,top1=0.99"]) as Thresholds, range-checked."""
    from .validate.search import parse_target

    goal = parse_target(targets)
    keys = {"atol": "atol", "rtol": "rtol", "min_cosine": "cosine", "min_top1": "top1"}
    for key, name in keys.items():
        value = getattr(goal, key)
        if value is not None:
            check_threshold(key, value, "--target", "e.g. --target cosine=0.9999,top1=0.99", f"{name}=")
    return goal


def lint_options(
    settings: dict | None = None,
    *,
    select=(),
    ignore=(),
    fail_on=None,
    plan: PlanOptions | None = None,
    precision_given: bool = True,
):
    """LintOptions from configuration `settings`, the lint flags and the plan options (the rules
    and selections that decide which findings the default conversion protects). With
    `precision_given` false an fp32 model is linted against the plan's precision only as a default."""
    from .diagnostics import SEVERITIES
    from .lint.engine import LintOptions, Suppression

    settings = settings or {}
    plan = plan or plan_options(settings)
    if fail_on is not None and fail_on not in SEVERITIES:
        raise AutocastError(
            f"--fail-on must be one of {', '.join(SEVERITIES)}, not {shown(fail_on)}", "--fail-on", "fix it"
        )
    suppress = [
        Suppression(code=e["code"], node=e.get("node", ".*"), source=settings.get("_source", "config"))
        for e in settings.get("suppress", [])
    ]
    return LintOptions(
        select=list(select) or settings.get("select", ["AC"]),
        ignore=list(ignore) or settings.get("ignore", []),
        fail_on=fail_on or settings.get("fail_on", "error"),
        precision=plan.target.value if precision_given else None,
        suppress=suppress,
        rules=list(plan.rules),
        plan=plan,
    )
