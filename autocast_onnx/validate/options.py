"""The validation options, declared beside validation: ValidateOptions (the inputs, thresholds,
counts and choices of one comparison), the thresholds' bounds, and the builders that make them
the same way for every command from the configuration file (`[tool.autocast-onnx]`, config.py)
and the command-line flags or the Python API's keywords, which win (a list given on the command
line replaces the configuration's). `--target` entries are read here too (parse_targets)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields

from ..errors import AutocastError
from ..patterns import shown
from .thresholds import THRESHOLDS, Thresholds, threshold_fields

# Allowed values of each threshold (command line, configuration file and --target): its field's.
THRESHOLD_BOUNDS = {f.name: f.metadata["bounds"] for f in threshold_fields()}
SEED_MAX = 2**32 - 1  # numpy seeds are unsigned 32-bit


def _option(
    *, flag: str, key: str | None = None, count=None, choices=None, section=None, generates: bool = False
) -> dict:
    """A validation option's field metadata, what the surfaces read from it: `flag` (its
    command-line flag), `key` (its configuration key; None: none) and the `section` of the
    configuration it belongs to ("run": how validation runs, "compare": what it compares), `count`
    ((lowest, highest): a whole number in that range) or `choices` (the first is the default), and
    whether it `generates` inputs (it shapes the generated batches: it does nothing beside --inputs)."""
    return {"flag": flag, "key": key, "count": count, "choices": choices, "section": section, "generates": generates}


@dataclass(frozen=True)
class ValidateOptions:
    """The inputs, thresholds, counts and choices of one comparison, one field per option: a new
    validation option is one field here, with its metadata (_option), plus the code that reads it;
    the thresholds are Thresholds' fields (metrics.py)."""

    # .npz or Polygraphy .json file, or a folder of either
    inputs: str | None = field(default=None, metadata=_option(flag="--inputs"))
    # write generated batches here (.npz, Polygraphy's .json) before the runs
    save_inputs: str | None = field(default=None, metadata=_option(flag="--save-inputs"))
    dims: dict = field(default_factory=dict, metadata=_option(flag="--dim", generates=True))
    ranges: dict = field(default_factory=dict, metadata=_option(flag="--input-range", generates=True))
    device: str = field(default="auto", metadata=_option(flag="--device", choices=("auto", "cpu", "cuda")))
    numerics: str = field(default="auto", metadata=_option(flag="--numerics", choices=("auto", "emulate", "plain")))
    thresholds: Thresholds = field(default_factory=Thresholds)
    # None: time the models where it means something (CUDA), not on CPU
    speed: bool | None = field(default=None, metadata=_option(flag="--speed", key="speed", section="run"))
    iterations: int = field(
        default=20, metadata=_option(flag="--iterations", key="iterations", count=(1, 1_000_000), section="run")
    )
    warmup: int = field(default=3, metadata=_option(flag="--warmup", key="warmup", count=(0, 100_000), section="run"))
    # generated batches when no inputs are given
    batches: int = field(
        default=1, metadata=_option(flag="--batches", key="batches", count=(1, 10_000), section="run", generates=True)
    )
    seed: int = field(default=0, metadata=_option(flag="--seed", count=(0, SEED_MAX), generates=True))
    # outputs to score top-1/top-k on, by name
    class_outputs: list = field(default_factory=list, metadata=_option(flag="--class-output"))
    strict: bool = field(
        default=False, metadata=_option(flag="--strict")
    )  # a comparison that compares nothing (see `warnings`) fails
    # causal LMs: tokens of greedy continuation to compare (0: none)
    generate: int = field(default=16, metadata=_option(flag="--generate", count=(0, 1024)))
    # also compare the positions an attention mask marks as padding
    compare_padded: bool = field(
        default=False, metadata=_option(flag="--compare-padded", key="compare_padded", section="compare")
    )


def option_fields() -> tuple[Field, ...]:
    """The fields of ValidateOptions that are options (each with its metadata: _option)."""
    return tuple(f for f in fields(ValidateOptions) if "flag" in f.metadata)


def config_keys(section: str) -> tuple[str, ...]:
    """The configuration keys of the options of one section ("run", "compare"), in field order."""
    return tuple(f.metadata["key"] for f in option_fields() if f.metadata["section"] == section)


# The validation options' whole numbers (default, lowest, highest) and choices (the first is the
# default), as their fields declare them: the command line's click types hold its flags to the same.
COUNTS = {
    f.name: (f.default, *f.metadata["count"]) for f in option_fields() if f.metadata["count"] and f.name != "seed"
}
CHOICES = {f.name: f.metadata["choices"] for f in option_fields() if f.metadata["choices"]}
GENERATING = tuple(f.name for f in option_fields() if f.metadata["generates"])  # nothing to do beside --inputs


def refuse_generating_with_inputs(given: list[str], inputs: str) -> None:
    """The one refusal of the options that shape generated inputs (GENERATING) beside given input
    arrays: `given` are those the caller set, spelled as it takes them (`--dim`, `dims=`), and
    `inputs` is how it spells the inputs option (`--inputs`, `inputs=`)."""
    if given:
        raise AutocastError(
            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect with {inputs} "
            "(the arrays' own shapes and values are used)",
            None,
            f"drop them, or drop {inputs} to generate inputs",
        )


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
    from .inputs import parse_assignments, parse_ranges

    settings = settings or {}
    thresholds = thresholds_from(settings, flags)
    seed = flags.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise AutocastError(
            f"--seed must be a whole number from 0 to 2**32-1, not {seed!r}", "--seed", "pick another seed"
        )
    return ValidateOptions(
        inputs=flags.get("inputs"),
        save_inputs=save_inputs_path(flags.get("save_inputs")),
        dims=parse_assignments(_assignments(flags.get("dims", ())), "dim"),
        ranges=parse_ranges(_assignments(flags.get("ranges", ()))),
        seed=seed,
        thresholds=thresholds,
        speed=_speed(flags, settings),
        class_outputs=list(flags.get("class_outputs", ())),
        strict=bool(flags.get("strict") or settings.get("strict", False)),
        batches=_count("batches", flags, settings),
        iterations=_count("iterations", flags, settings),
        warmup=_count("warmup", flags, settings),
        generate=_count("generate", flags),
        device=_choice("device", flags),
        numerics=_choice("numerics", flags),
        compare_padded=_flag("compare_padded", flags, settings),
    )


THRESHOLD_HINT = "fix the threshold (command line or [tool.autocast-onnx])"


def thresholds_from(settings: dict, flags: dict, keywords: bool = False):
    """The validation Thresholds: each limit from its flag, else the configuration, else the
    default; an output's own limits (`--rtol NAME=X`, the configuration's `[outputs.NAME]`
    tables) beside them, a flag's winning over the file's for the same output and key. Errors
    name the flag, or with `keywords` the Python API's keyword (`rtol=`)."""
    thresholds = Thresholds()
    per_output: dict = {name: dict(own) for name, own in (settings.get("outputs") or {}).items()}
    for key in THRESHOLDS:
        flag = key + "=" if keywords else "--" + key.replace("_", "-")
        value, own = _threshold_values(key, flags.get(key), flag)
        if value is None:
            value = settings.get(key, getattr(thresholds, key))
        if value is not None:
            check_threshold(key, value, flag, THRESHOLD_HINT)
            value = float(value)
        setattr(thresholds, key, value)
        for name, number in own.items():
            per_output.setdefault(name, {})[key] = number
    thresholds.per_output = per_output
    return thresholds


def _threshold_values(key: str, given, flag: str) -> tuple:
    """(the global value or None, {output: value}) of one threshold as given: a number, `X` or
    `NAME=X` text (the command line's form, repeatable: a tuple of them), or a mapping
    {output: X} (the Python API's per-output form), or a list mixing these."""
    if given is None or isinstance(given, (bool, int, float)):
        return given, {}
    items = list(given.items()) if isinstance(given, Mapping) else [given] if isinstance(given, str) else None
    if items is None:
        try:
            items = list(given)
        except TypeError:
            return given, {}  # not a number: check_threshold refuses it in its own words
    found: dict = {}
    value = None
    for item in items:
        name, number = _threshold_item(item, flag)
        if name is None:
            if value is not None:
                raise AutocastError(
                    f"{flag} is given twice without an output name", flag, "give one, and NAME=X for one output"
                )
            value = number
            continue
        check_threshold(key, number, flag, THRESHOLD_HINT, f"{flag} {name}=")
        if name in found:
            raise AutocastError(f"{flag} is given twice for output {name!r}", flag, "give one value per output")
        found[name] = float(number)
    return value, found


def _threshold_item(item, flag: str) -> tuple:
    """(output name or None for every output, the number) of one entry of a threshold flag."""
    if isinstance(item, tuple) and len(item) == 2:  # a mapping's (name, value)
        return str(item[0]), item[1]
    if not isinstance(item, str):
        return None, item
    name, sep, text = item.rpartition("=")
    name = name.strip()
    if sep and not name:
        raise AutocastError(f"{flag} {item!r} names no output", flag, f"e.g. {flag} prob_map=0.05")
    try:
        number = float(text)
    except ValueError:
        raise AutocastError(
            f"{flag} takes a number, or NAME=NUMBER for one output, not {shown(item)}",
            flag,
            f"e.g. {flag} 0.02 or {flag} prob_map=0.05",
        ) from None
    return (name or None), number


def _flag(key: str, flags: dict, settings: dict) -> bool:
    """An on/off validation option: the flag when set, else the configuration's key."""
    value = flags.get(key) or settings.get(key, False)
    if not isinstance(value, bool):
        flag = "--" + key.replace("_", "-")
        raise AutocastError(f"{flag} must be true or false, not {shown(value)}", flag, "fix it")
    return value


def _count(key: str, flags: dict, settings: dict | None = None) -> int:
    """A validation count (COUNTS) from the flags, else the configuration (`settings`, already
    checked by config.py), else its default; a bad flag is an AutocastError naming it."""
    default, low, high = COUNTS[key]
    value = flags.get(key)
    if value is None:
        value = (settings or {}).get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        flag = "--" + key
        raise AutocastError(f"{flag} must be a whole number from {low} to {high}, not {shown(value)}", flag, "fix it")
    return value


def _speed(flags: dict, settings: dict) -> bool | None:
    """--speed/--no-speed, else the configuration's `speed`, else None: time the models only where
    it means something (CUDA; validate/core.py `timed`)."""
    value = flags.get("speed")
    if value is None:
        value = settings.get("speed")
    if value is not None and not isinstance(value, bool):
        raise AutocastError(f"--speed must be true, false or None, not {shown(value)}", "--speed", "fix it")
    return value


def save_inputs_path(path) -> str | None:
    """--save-inputs FILE.npz: a file path ('-', stdout, is refused: an archive is no text)."""
    import os

    if path is None:
        return None
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise AutocastError(f"--save-inputs must be a path, not {shown(path)}", "--save-inputs", "e.g. inputs.npz")
    text = os.fspath(path)
    if text.strip() in ("", "-"):
        raise AutocastError(
            f"--save-inputs needs a file name, not {shown(text)}", "--save-inputs", "e.g. --save-inputs inputs.npz"
        )
    return str(text)


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


# `--target KEY=X`: each threshold a target sets, by its target name and by its own name
TARGET_NAMES = {f.name: f.metadata["target"] for f in threshold_fields() if f.metadata["target"]}
TARGET_KEYS = {key: name for name, alias in TARGET_NAMES.items() for key in dict.fromkeys((alias, name))}


def parse_target(items) -> Thresholds:
    """`atol=1e-3,top1=0.99,iou=0.99` (repeatable) -> Thresholds with only those set: the
    verdict's own metrics (metrics.verdict), so the search keeps fp32 what the verdict needs."""
    found = Thresholds.unset()
    parts = [p for item in items for p in item.split(",") if p.strip()]
    if not parts:
        raise AutocastError("--target needs at least one KEY=VALUE", "--target", "e.g. --target cosine=0.9999")
    for part in parts:
        key, _, value = part.partition("=")
        key = key.strip().lower().replace("-", "_")
        if key not in TARGET_KEYS or not value:
            raise AutocastError(f"bad --target entry {part!r}", "--target", f"use {_target_choices()} with a number")
        try:
            setattr(found, TARGET_KEYS[key], float(value))
        except ValueError:
            raise AutocastError(f"bad number in --target {part!r}", "--target", "e.g. cosine=0.9999") from None
    return found


def _target_choices() -> str:
    """The target names as `atol=, rtol=, ... or iou=`."""
    names = [f"{alias}=" for alias in TARGET_NAMES.values()]
    return ", ".join(names[:-1]) + " or " + names[-1]


def parse_targets(targets):
    """`--target` values (e.g. ["cosine=0.9999,top1=0.99"]) as Thresholds, range-checked."""
    goal = parse_target(targets)
    for key, name in TARGET_NAMES.items():
        value = getattr(goal, key)
        if value is not None:
            check_threshold(key, value, "--target", "e.g. --target cosine=0.9999,top1=0.99", f"{name}=")
    return goal
