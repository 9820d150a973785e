"""The planning options: one declaration per option, read by every surface that carries it.

`PlanOptions` holds what decides a fresh plan besides the model and measured data. Each field
declares, in its metadata, what the surfaces need: `flag`, its command-line flag (the click
parameter's name is the flag's, with underscores); `key`, its key in the configuration file
(None: no key); `replay`, what it does beside a plan being replayed (`refused`: it would do
nothing, the plan decides every node; `compared`: it must agree with the plan; `allowed`).
The configuration's keys (config.PLAN_KEYS), the builder below (flags win over the
configuration), the CLI's `_plan_from`, the options refused with `--plan` and the keywords
the Python API takes for planning are all read from these fields, so a new planning option is
one field here plus the stage that reads it.

The object travels whole from the builder to the stage that reads it: the CLI and the gate
build it once, and `pipeline.convert(model, options=...)` (or the same options as keywords,
turned into a PlanOptions once at the entry) hands it to planning.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from pathlib import Path

from ..catalog.loader import check_op_type
from ..errors import AutocastError
from ..patterns import compile_patterns
from ..runtimes import RUNTIME_CHOICES
from .vocab import Precision


def _surfaces(flag: str, key: str | None, replay: str) -> dict:
    """A planning option's field metadata: what the surfaces need (see the module's text)."""
    return {"flag": flag, "key": key, "replay": replay}


@dataclass(frozen=True)
class PlanOptions:
    """Everything that decides the plan, besides the model and measured data. `precision` and
    `keep_io_types` left None are not given: a replayed plan decides them, else fp16 and keep
    (`target` is the precision in force)."""

    precision: Precision | None = field(default=None, metadata=_surfaces("--precision", "precision", "compared"))
    # extra rule files, applied in order over the default profile
    rules: tuple[str, ...] = field(default=(), metadata=_surfaces("--rules", "rules", "refused"))
    keep_io_types: bool | None = field(default=None, metadata=_surfaces("--keep-io-types", "keep_io_types", "compared"))
    # op types (or domain:OpType) kept fp32
    exclude_ops: tuple[str, ...] = field(default=(), metadata=_surfaces("--exclude-op", "exclude_op", "refused"))
    # op types (or domain:OpType) forced low, as --include-node forces nodes (an exclude beats it)
    include_ops: tuple[str, ...] = field(default=(), metadata=_surfaces("--include-op", "include_op", "refused"))
    # node-name regexes kept fp32, and forced low
    exclude_nodes: tuple[str, ...] = field(default=(), metadata=_surfaces("--exclude-node", "exclude_node", "refused"))
    include_nodes: tuple[str, ...] = field(default=(), metadata=_surfaces("--include-node", "include_node", "refused"))
    # regex: model inputs/outputs (whole names) given the low type
    low_precision_io: str | None = field(
        default=None, metadata=_surfaces("--low-precision-io", "low_precision_io", "refused")
    )
    # the default-domain opset to upgrade the model to before planning (None: the model's own).
    # Beside a replayed plan it is compared: the plan records the upgrade it was made after
    # (plan.opset), replay repeats that upgrade, and a different --opset contradicts the plan.
    opset: int | None = field(default=None, metadata=_surfaces("--opset", "opset", "compared"))
    # the runtime the model is planned for (cuda, tensorrt, dml; "any": every runtime; None: DEFAULT_RUNTIME): a
    # node whose op that runtime has no kernel for at the low type (catalog/kernels.py) stays fp32; and whose
    # kernels' fp32 compute paint pass 6 counts on ("any": none)
    runtime: str | None = field(default=None, metadata=_surfaces("--runtime", "runtime", "refused"))
    # the precise plan: the normalizations, softmaxes and other bounded ops that the fast plan (the
    # default) runs low together with the streams they sit on keep fp32 inputs and outputs, and so
    # the residual stream of a transformer stays fp32 (plan/kernel_io.py, FAST_OPS); only the
    # kept-fp32 ops whose Casts would change no number still run low
    precise: bool | None = field(default=None, metadata=_surfaces("--precise", "precise", "refused"))
    # a node rule, node pattern, --exclude-op or --include-op that matches nothing is an error
    strict: bool = field(default=False, metadata=_surfaces("--strict", None, "allowed"))
    source: str | None = field(default=None, compare=False)  # the configuration file, if any

    def __post_init__(self) -> None:
        if self.precision is not None:
            try:
                object.__setattr__(self, "precision", Precision.target(self.precision))
            except (ValueError, TypeError):
                raise AutocastError(
                    f"unknown precision {self.precision!r}", "--precision", "use fp16 or bf16"
                ) from None
        for name in ("rules", "exclude_ops", "include_ops", "exclude_nodes", "include_nodes"):
            value = getattr(self, name)
            if isinstance(value, (str, Path)):
                value = (value,)
            object.__setattr__(self, name, tuple(str(v) for v in value))
        compile_patterns(self.exclude_nodes, "--exclude-node")
        compile_patterns(self.include_nodes, "--include-node")
        if self.low_precision_io is not None:
            compile_patterns([self.low_precision_io], "--low-precision-io")
        if self.opset is not None:
            _check_opset_request(self.opset)
        if self.runtime is not None and self.runtime not in RUNTIME_CHOICES:
            raise AutocastError(
                f"unknown runtime {self.runtime!r}", "--runtime", "use one of: " + ", ".join(RUNTIME_CHOICES)
            )
        for op in self.exclude_ops:
            check_op_type(op, "--exclude-op")
        for op in self.include_ops:
            check_op_type(op, "--include-op")

    @property
    def target(self) -> Precision:
        """The precision in force: the one given, else fp16."""
        return self.precision if self.precision is not None else Precision.FP16

    @property
    def selects(self) -> bool:
        """Whether any node or op selection is given."""
        return bool(self.exclude_ops or self.include_ops or self.exclude_nodes or self.include_nodes)


DEFAULT_RUNTIME = "cuda"  # the runtime a plan is made for without --runtime: ONNX Runtime's CUDA provider


def _check_opset_request(opset) -> None:
    """--opset is a whole number from 1 (what the installed onnx knows is checked by the upgrade)."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 1:
        raise AutocastError(f"--opset must be a whole number >= 1, not {opset!r}", "--opset", "e.g. --opset 22")


def planning_fields() -> tuple[Field, ...]:
    """The fields of PlanOptions that are planning options (each with flag, key and replay)."""
    return tuple(f for f in fields(PlanOptions) if "flag" in f.metadata)


PLANNING = tuple(f.name for f in planning_fields())  # the planning keywords of the Python API


def cli_name(option: Field) -> str:
    """The click parameter name of a planning option: its flag's, with underscores."""
    return option.metadata["flag"].lstrip("-").replace("-", "_")


def _given(value) -> bool:
    """Whether a flag or keyword is given: not None and not an empty list."""
    return value is not None and not (isinstance(value, (tuple, list)) and not value)


def plan_options(settings: dict | None = None, **flags) -> PlanOptions:
    """PlanOptions from configuration `settings` (config.load_settings) and flags or keywords
    named as PlanOptions' fields: one that is given (not None, not empty) wins over the
    configuration, and one given nowhere takes the field's default. An unknown name is a
    TypeError, as in a call."""
    unknown = sorted(set(flags) - set(PLANNING))
    if unknown:
        raise TypeError(f"unexpected planning keyword argument {unknown[0]!r}")
    settings = settings or {}
    values = {}
    for option in planning_fields():
        key = option.metadata["key"]
        if _given(flags.get(option.name)):
            values[option.name] = flags[option.name]
        elif key is not None and key in settings:
            values[option.name] = settings[key]
    return PlanOptions(**values, source=settings.get("_source"))


def plan_options_in(keywords: dict, call: str) -> tuple[PlanOptions, dict]:
    """An API call's planning options as one PlanOptions, and its other keywords: the planning
    keywords (PlanOptions' fields) through the builder, or a PlanOptions given as `options=`;
    both at once is a TypeError naming the `call`."""
    rest = {k: v for k, v in keywords.items() if k not in PLANNING and k != "options"}
    planning = {k: v for k, v in keywords.items() if k in PLANNING}
    options = keywords.get("options")
    if options is None:
        return plan_options(**planning), rest
    if not isinstance(options, PlanOptions):
        raise TypeError(f"{call}() options= takes a PlanOptions, not {type(options).__name__}")
    if planning:
        raise TypeError(
            f"{call}() takes the planning options as options= or as keywords, not both "
            f"(got options= and {', '.join(sorted(planning))}=)"
        )
    return options, rest
