"""Options: one frozen object per concern, built the same way for every command from the
configuration file (`[tool.autocast-onnx]` in pyproject.toml or an autocast-onnx.toml, see
config.py) and the command-line flags or API arguments, which win. A list given on the command
line replaces the configuration's list rather than extending it.

  PlanOptions        what decides the precision plan: precision, rule files, keep_io_types,
                     node and op selections. convert, explain, lint (what the rules protect)
                     and check all plan with the same object, so they agree on every node.
  ValidateOptions    inputs and thresholds of validation (validate/core.py defines it).
  LintOptions        which checks run and what fails (lint/engine.py defines it).

The CLI only collects flags and calls these builders; the Python API takes the same objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import AutocastError
from .patterns import compile_patterns as compile_patterns  # the flags' regexes; re-exported
from .patterns import shown
from .plan.vocab import Precision


@dataclass(frozen=True)
class PlanOptions:
    """Everything that decides the plan, besides the model and measured data."""

    precision: Precision = Precision.FP16
    rules: tuple[str, ...] = ()  # extra rule files, applied in order over the default
    keep_io_types: bool = True
    exclude_ops: tuple[str, ...] = ()  # op types (or domain:op) kept fp32
    exclude_nodes: tuple[str, ...] = ()  # node-name regexes kept fp32
    include_nodes: tuple[str, ...] = ()  # node-name regexes forced low
    low_precision_io: str | None = None  # regex: model inputs/outputs (whole names) given the low type
    strict: bool = False  # a node rule, node pattern or --exclude-op that matches nothing is an error
    source: str | None = field(default=None, compare=False)  # the configuration file, if any

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "precision", Precision.target(self.precision))
        except ValueError:
            raise AutocastError(f"unknown precision {self.precision!r}", "--precision", "use fp16 or bf16") from None
        for name in ("rules", "exclude_ops", "exclude_nodes", "include_nodes"):
            value = getattr(self, name)
            if isinstance(value, (str, Path)):
                value = (value,)
            object.__setattr__(self, name, tuple(str(v) for v in value))
        compile_patterns(self.exclude_nodes, "--exclude-node")
        compile_patterns(self.include_nodes, "--include-node")
        if self.low_precision_io is not None:
            compile_patterns([self.low_precision_io], "--low-precision-io")
        from .catalog.loader import check_op_type

        for op in self.exclude_ops:
            check_op_type(op, "--exclude-op")

    @property
    def selects(self) -> bool:
        """Whether any node or op selection is given."""
        return bool(self.exclude_ops or self.exclude_nodes or self.include_nodes)

    def convert_kwargs(self) -> dict:
        """The keyword arguments of `autocast_onnx.convert` these options stand for."""
        return {
            "precision": self.precision,
            "rules": list(self.rules),
            "keep_io_types": self.keep_io_types,
            "exclude_ops": list(self.exclude_ops),
            "exclude_nodes": list(self.exclude_nodes),
            "include_nodes": list(self.include_nodes),
            "low_precision_io": self.low_precision_io,
            "strict": self.strict,
        }


def plan_options(
    settings: dict | None = None,
    *,
    precision=None,
    rules=(),
    keep_io_types=None,
    exclude_ops=(),
    exclude_nodes=(),
    include_nodes=(),
    low_precision_io=None,
    strict=None,
) -> PlanOptions:
    """PlanOptions from configuration `settings` (see config.load_settings) and flags: a flag that
    is given (not None, not empty) wins over the configuration."""
    settings = settings or {}

    def pick(flag, key, default):
        if flag is not None and flag != () and flag != []:
            return flag
        return settings.get(key, default)

    return PlanOptions(
        precision=pick(precision, "precision", "fp16"),
        rules=tuple(pick(tuple(rules), "rules", ())),
        keep_io_types=pick(keep_io_types, "keep_io_types", True),
        exclude_ops=tuple(pick(tuple(exclude_ops), "exclude_op", ())),
        exclude_nodes=tuple(pick(tuple(exclude_nodes), "exclude_node", ())),
        include_nodes=tuple(pick(tuple(include_nodes), "include_node", ())),
        low_precision_io=pick(low_precision_io, "low_precision_io", None),
        strict=bool(pick(strict, "strict", False)),
        source=settings.get("_source"),
    )


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
        dims=parse_assignments(flags.get("dims", ()), "dim"),
        ranges=parse_ranges(flags.get("ranges", ())),
        batches=flags.get("batches", 1),
        seed=seed,
        device=flags.get("device", "auto"),
        numerics=flags.get("numerics", "auto"),
        thresholds=thresholds,
        speed=flags.get("speed", True),
        iterations=flags.get("iterations", 20),
        warmup=flags.get("warmup", 3),
        class_outputs=list(flags.get("class_outputs", ())),
        generate=flags.get("generate", 16),
        strict=bool(flags.get("strict") or settings.get("strict", False)),
    )


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
    from .lint.engine import LintOptions, Suppression

    settings = settings or {}
    plan = plan or plan_options(settings)
    suppress = [
        Suppression(code=e["code"], node=e.get("node", ".*"), source=settings.get("_source", "config"))
        for e in settings.get("suppress", [])
    ]
    return LintOptions(
        select=list(select) or settings.get("select", ["AC"]),
        ignore=list(ignore) or settings.get("ignore", []),
        fail_on=fail_on or settings.get("fail_on", "error"),
        precision=plan.precision.value if precision_given else None,
        suppress=suppress,
        rules=list(plan.rules),
        plan=plan,
    )
