"""The explicit opset upgrade (`--opset N`): the model's default-domain opset raised to N by ONNX's
version converter before anything is planned, so that ops whose low-precision schema types come
with a later opset (bf16 Conv from 22, BatchNormalization with fp32 parameters from 15, fp16 Q/DQ
scales from 19) can convert. The tool never upgrades unasked; planning only suggests it.

The upgrade edits the model in place (a caller's `copy=False` model is the one converted) and
refuses, with the node named, what the converter cannot carry over: a node whose op has no schema
at the model's opset, or one whose op has no adapter to N. A downgrade, or an N above the opsets
the installed onnx knows, is refused too. Tensors stored as external data keep their references
(location, offset, length): the converter copies them as they are, and the payloads stay in the
files beside the input."""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx
from onnx import defs, helper

from ..catalog.loader import normalize_domain
from ..errors import AutocastError

# protobuf's limit on one serialized message: the converter works on the model's bytes
_PROTOBUF_LIMIT = 2**31 - 1
# a node the converter's shape inference names in its message
_NODE_NAMED = re.compile(r"node name: ([^)]*)\)")


@dataclass(frozen=True)
class OpsetChange:
    """What the upgrade did: the default-domain opset before and after (equal: nothing to do)."""

    before: int
    after: int

    def to_dict(self) -> dict:
        return {"from": self.before, "to": self.after}


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset; None when it imports none."""
    return next((o.version for o in model.opset_import if normalize_domain(o.domain) == ""), None)


def upgrade_opset(model: onnx.ModelProto, target: int, where: str) -> OpsetChange:
    """Raise `model`'s default-domain opset to `target` in place (onnx.version_converter); the
    change it made. Raises AutocastError for a downgrade, an unknown opset or a node the
    converter cannot upgrade (named)."""
    flag = f"--opset {target}"
    known = defs.onnx_opset_version()
    current = default_opset(model)
    if current is None:
        raise AutocastError(f"{flag}: the model imports no default-domain opset to upgrade", where, "drop --opset")
    if target > known:
        raise AutocastError(
            f"{flag}: the installed onnx {onnx.__version__} knows opsets up to {known}",
            where,
            f"choose --opset {known} or lower, or upgrade onnx",
        )
    if target < current:
        raise AutocastError(
            f"{flag} would downgrade the model from opset {current}; autocast-onnx only upgrades",
            where,
            f"drop --opset, or give {current} or higher",
        )
    if target == current:
        return OpsetChange(current, current)
    _refuse_unknown_ops(model, current, target, where)
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise AutocastError(
            f"{flag}: the model is over 2 GiB in memory, more than the version converter can serialize",
            where,
            "save it with its weights as external data (onnx.save(..., save_as_external_data=True)) and pass that file",
        )
    try:
        upgraded = onnx.version_converter.convert_version(model, target)
    except (RuntimeError, onnx.checker.ValidationError, IndexError) as exc:
        raise _refusal(model, current, target, str(exc), where) from None
    needed = helper.find_min_ir_version_for([helper.make_opsetid("", target)], ignore_unknown=True)
    upgraded.ir_version = max(upgraded.ir_version, model.ir_version, needed)
    model.CopyFrom(upgraded)
    return OpsetChange(current, target)


def _nodes(graph: onnx.GraphProto, path: str = "main"):
    """Every node of `graph` and of its bodies, with the graph it is in."""
    for node in graph.node:
        yield node, path
        for attr in node.attribute:
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for body in bodies:
                yield from _nodes(body, f"{path}/{node.name or node.op_type}.{attr.name}")


def _label(node: onnx.NodeProto, path: str) -> str:
    name = f"'{node.name}'" if node.name else "(unnamed)"
    return f"node {name} ({node.op_type})" + ("" if path == "main" else f" in {path}")


def _refuse_unknown_ops(model: onnx.ModelProto, current: int, target: int, where: str) -> None:
    """A default-domain node whose op has no schema at the model's own opset: the converter
    cannot tell which version it is, so it cannot upgrade it."""
    for node, path in _nodes(model.graph):
        if normalize_domain(node.domain) != "":
            continue
        try:
            defs.get_schema(node.op_type, current, "")
        except defs.SchemaError:
            raise AutocastError(
                f"--opset {target}: {_label(node, path)} has no ONNX schema at opset {current}, "
                "so the version converter cannot upgrade it",
                where,
                "replace the node with standard ops, or drop --opset",
            ) from None


def _refusal(model: onnx.ModelProto, current: int, target: int, message: str, where: str) -> AutocastError:
    """The converter's failure as one line naming the node it stopped at: the node its message
    names, else the first node of the op type it names (its adapters say `adapt_scan_8_9`, `of
    Attention`, `for Relu`), else its own words."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    said = re.sub(r"^.*?Assertion `[^`]*` failed: ", "", lines[-1] if lines else "no reason given").strip()
    nodes = [(n, p) for n, p in _nodes(model.graph) if normalize_domain(n.domain) == ""]
    named = _NODE_NAMED.search(message)
    found = next(((n, p) for n, p in nodes if named and n.name == named.group(1)), None)
    if found is None:
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", message.replace("_", " "))}
        found = next(((n, p) for n, p in nodes if n.op_type.lower() in words), None)
    if found is not None:
        what = f"--opset {target}: the version converter cannot upgrade {_label(*found)} from opset {current}: {said}"
    else:
        what = f"--opset {target}: the version converter cannot upgrade the model from opset {current}: {said}"
    return AutocastError(what, where, "replace the node with ops of the target opset, or drop --opset")
