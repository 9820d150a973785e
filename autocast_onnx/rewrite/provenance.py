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

It is a function of the plan alone, so a replayed plan gives the model planning gave, byte for
byte. `record` (the rewrite's last pass, rewrite/apply.py) writes it, replacing an earlier record
(a converted model converted again carries one record, the last); `read` gives it back for lint
and explain, as found (a rules value that is not the JSON list it should be stays the string it
is: the model is reported, not judged)."""

from __future__ import annotations

import json

import onnx

from .._version import __version__

PREFIX = "autocast_onnx."
FIELDS = ("version", "precision", "rules", "plan")


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
    holds, or the string as found when it is not such a list."""
    found: dict = dict.fromkeys(FIELDS)
    for prop in model.metadata_props:
        name = prop.key[len(PREFIX) :] if prop.key.startswith(PREFIX) else None
        if name in FIELDS:
            found[name] = prop.value
    if all(value is None for value in found.values()):
        return None
    if found["rules"] is not None:
        found["rules"] = _rules(found["rules"])
    return found


def _rules(text: str) -> list | str:
    """The rule list of a record, or `text` itself when it is not one."""
    try:
        rules = json.loads(text)
    except ValueError:
        return text
    fine = isinstance(rules, list) and all(
        isinstance(r, dict)
        and set(r) == {"file", "sha256"}
        and isinstance(r["file"], str)
        and isinstance(r["sha256"], (str, type(None)))
        for r in rules
    )
    return rules if fine else text


def describe(path, found: dict) -> str:
    """One line saying how the model at `path` was made, from its record (lint, explain)."""
    parts = [f"{path}: converted by autocast-onnx {found['version'] or '?'} to {found['precision'] or '?'}"]
    rules = found["rules"]
    if isinstance(rules, list):
        named = [f"{r['file']} ({r['sha256'][:12] if r['sha256'] else 'no digest'})" for r in rules]
        parts.append("rules " + ", ".join(named))
    elif rules is not None:
        parts.append(f"rules {rules!r}")
    if found["plan"] is not None:
        parts.append(f"plan {found['plan']}")
    return "; ".join(parts)
