"""The provenance record a converted model carries in its metadata_props, so that a model found
later can be traced to how it was made:

    autocast_onnx.version    the tool's version, e.g. "0.1.0"
    autocast_onnx.precision  the target precision, "fp16" or "bf16"
    autocast_onnx.rules      JSON list of the rule files the plan was made with, in order, the
                             default profile first: [{"file": "rules/default.toml", "sha256": HEX}, ...]
                             (the plan's rule_files and rule_sha256: a replayed plan file carries
                             them; "sha256": null where a plan file written before them lacks them)
    autocast_onnx.plan       the plan's model fingerprint (plan/paint.py index_fingerprint), the
                             "model_fingerprint" a --plan-out file of the same conversion holds
    autocast_onnx.runtime    the runtime whose kernels the plan counted on (the plan's "kernels"):
                             "cuda" (also without --runtime: ONNX Runtime's CUDA provider is the
                             design's), "tensorrt", "dml", or "any" (none); lint without --runtime
                             lints the model for it, so that it agrees with the conversion

It is a function of the plan alone, so a replayed plan gives the model planning gave, byte for
byte. `record` (the rewrite's last pass, rewrite/apply.py) writes it, replacing an earlier record
(a converted model converted again carries one record, the last); `read` gives it back for lint
and explain, as found (a rules value that is not the JSON list it should be stays the string it
is: the model is reported, not judged).

The values are the model's, so anything at all: `examine` reads any of them without failing and
says what it could not read (a value protobuf could not decode as UTF-8, one longer than any
record's, a rules value that is not the list of rule files: not JSON, or nested deeper than the
JSON parser goes). Lint and explain show such a record with a warning (`describe`), and a
conversion replaces it with its own record whatever else it changes, with a plan warning
(`replaced_warning`). `describe` escapes every character of the model's text that is not
printable, so that no value can reach a terminal raw."""

from __future__ import annotations

import json

import onnx

from .._version import __version__
from ..errors import one_line

PREFIX = "autocast_onnx."
FIELDS = ("version", "precision", "rules", "plan", "runtime")
# A value longer than this is not read: a record's rules list of a few rule files holds some
# hundreds of characters; a value of 64 Ki characters is no record's. It is kept cut to PREVIEW
# characters, which is also as much of any value as the provenance line shows.
MAX_CHARS = 1 << 16
PREVIEW = 60


def record(model: onnx.ModelProto, plan) -> None:
    """Put the provenance record of `plan` (a PrecisionPlan) into `model`'s metadata_props, after
    the model's own entries (any earlier record removed first)."""
    digests = plan.rule_sha256 or [None] * len(plan.rule_files)
    rules = [{"file": f, "sha256": d} for f, d in zip(plan.rule_files, digests, strict=True)]
    values = {
        "version": __version__,
        "precision": plan.target.value,
        "rules": json.dumps(rules, separators=(",", ":")),
        "plan": plan.fingerprint or "",
        "runtime": plan.kernels,
    }
    keys = {PREFIX + name for name in FIELDS}
    kept = [p for p in model.metadata_props if p.key not in keys]
    if len(kept) != len(model.metadata_props):
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
    for name in FIELDS:
        model.metadata_props.add(key=PREFIX + name, value=values[name])


def read(model: onnx.ModelProto) -> dict | None:
    """The record in `model`: {"version", "precision", "rules", "plan"}, each None when absent;
    None when the model has none of them. "rules" is the list of {"file", "sha256"} the record
    holds, or the string as found when it is not such a list (see examine)."""
    return examine(model)[0]


def examine(model: onnx.ModelProto) -> tuple[dict | None, list[str]]:
    """The record in `model` as read() gives it, and what of it cannot be read, one phrase per
    field (none: the record reads). Never raises, whatever the values: a value that is not UTF-8
    (protobuf then gives bytes) is given decoded with its undecodable bytes as \\x escapes; one
    longer than MAX_CHARS is not read, and given cut to PREVIEW characters and "..."."""
    raw: dict = dict.fromkeys(FIELDS)
    for prop in model.metadata_props:
        key = prop.key
        # a key that is not UTF-8 comes as bytes: none of the record's
        if isinstance(key, str) and key.startswith(PREFIX) and key[len(PREFIX) :] in FIELDS:
            raw[key[len(PREFIX) :]] = prop.value
    if all(value is None for value in raw.values()):
        return None, []
    found: dict = dict.fromkeys(FIELDS)
    problems: list[str] = []
    for name, value in raw.items():
        if value is None:
            continue
        if not isinstance(value, str):
            problems.append(f"{PREFIX}{name} is not UTF-8")
            value = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
        if len(value) > MAX_CHARS:
            problems.append(f"{PREFIX}{name} holds {len(value)} characters, more than a record's {MAX_CHARS}")
            found[name] = value[:PREVIEW] + "..."
            continue
        found[name] = value
        if name == "rules" and isinstance(raw[name], str):  # one not UTF-8 is no list already
            found[name], problem = _rules(value)
            if problem is not None:
                problems.append(f"{PREFIX}rules is {problem}")
    return found, problems


def _rules(text: str) -> tuple[list | str, str | None]:
    """The rule list of a record, or `text` itself and what is wrong with it."""
    try:
        rules = json.loads(text)
    except RecursionError:
        return text, "JSON nested deeper than the parser reads"
    except ValueError:  # not JSON, or a number too long to convert
        return text, "not JSON"
    fine = isinstance(rules, list) and all(
        isinstance(r, dict)
        and set(r) == {"file", "sha256"}
        and isinstance(r["file"], str)
        and isinstance(r["sha256"], (str, type(None)))
        for r in rules
    )
    return (rules, None) if fine else (text, 'not a list of {"file", "sha256"} entries')


def _shown(value: str | None) -> str:
    """A value of the record as the provenance line shows it: at most PREVIEW characters."""
    if value is None:
        return "?"
    return value if len(value) <= PREVIEW else value[:PREVIEW] + "..."


def describe(path, found: dict, problems=()) -> str:
    """One line saying how the model at `path` was made, from its record (lint, explain), every
    character that is not printable escaped (errors.one_line); with `problems` (examine's), it
    ends in a warning that the record cannot be read."""
    parts = [f"{path}: converted by autocast-onnx {_shown(found['version'])} to {_shown(found['precision'])}"]
    rules = found["rules"]
    if isinstance(rules, list):
        named = [f"{r['file']} ({r['sha256'][:12] if r['sha256'] else 'no digest'})" for r in rules]
        parts.append("rules " + ", ".join(named))
    elif rules is not None:
        parts.append(f"rules {_shown(rules)!r}")
    if found["plan"] is not None:
        parts.append(f"plan {_shown(found['plan'])}")
    if found.get("runtime") is not None:
        parts.append(f"planned for {_shown(found['runtime'])}")
    if problems:
        parts.append(
            f"warning: the record cannot be read ({', '.join(problems)}): converting the model writes a fresh one"
        )
    return one_line("; ".join(parts))


def replaced_warning(problems) -> str:
    """What a conversion says when it replaces a record that cannot be read (examine's problems)."""
    return one_line(
        f"the model's provenance record cannot be read ({', '.join(problems)}): replaced with this conversion's"
    )
