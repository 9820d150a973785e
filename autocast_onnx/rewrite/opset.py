"""The explicit opset upgrade (`--opset N`): the model's default-domain opset raised to N by ONNX's
version converter before anything is planned, so that ops whose low-precision schema types come
with a later opset (bf16 Conv from 22, fp16 Q/DQ
scales from 19) can convert. The tool never upgrades unasked; planning only suggests it.

The upgrade edits the model in place (a caller's `copy=False` model is the one converted) and
refuses, with the node named, what the converter cannot carry over: a node whose op has no schema
at the model's opset, or one whose op has no adapter to N. A downgrade, or an N above the opsets
the installed onnx knows, is refused too. Tensors stored as external data keep their references
(location, offset, length): the converter copies them as they are, and the payloads stay in the
files beside the input.

What the converter drops is carried over from the original: model-local functions (whose bodies
the converter does not upgrade: a body whose ops change version between its opset and N is
upgraded on its own, or refused naming the function), the opset imports of their domains, every
node's metadata_props (matched by name, else outputs, else position among the nodes of its op;
in bodies too: `autocast-onnx:ignore` suppressions keep working), each graph's metadata_props,
value_info and quantization annotations. An attribute the converter leaves that the node's new
schema does not have is removed where it has no effect (Pad-10's `value` outside constant mode)
and refused, naming the node, otherwise.

Then the upgraded fp32 model is compared with the original on generated inputs
(rewrite/opset_check.py): where they disagree the upgrade is refused naming the node (Resize-10's
linear mode and Hardmax-11's axis, which the converter carries over wrongly). What cannot be
checked, and an upgraded node the runtime cannot run, is returned as a warning in the
OpsetChange: the plan's warnings show them (lint reports the kernel ones as AC404 findings)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache

import onnx
from onnx import defs, helper

from ..errors import AutocastError
from ..graph.domains import normalize_domain
from ..io import PROTOBUF_LIMIT, encoded_size
from .opset_check import Changed, Disagreement, OpsetWarning, compare, kernel_warnings

# a node the converter's shape inference names in its message
_NODE_NAMED = re.compile(r"node name: ([^)]*)\)")
_HINT = "replace the node with ops of the target opset, or drop --opset"
# what the converter raises where it cannot upgrade (ConvertError: an input it finds undefined)
_CONVERTER_ERRORS: tuple[type[Exception], ...] = (RuntimeError, onnx.checker.ValidationError, IndexError)
_CONVERTER_ERRORS += tuple(e for e in [getattr(onnx.version_converter, "ConvertError", None)] if e is not None)


@dataclass(frozen=True)
class OpsetChange:
    """What the upgrade did: the default-domain opset before and after (equal: nothing to do), and
    what it could not check or the runtime cannot run (OpsetWarning each)."""

    before: int
    after: int
    warnings: tuple[OpsetWarning, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict:
        return {"from": self.before, "to": self.after}


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset; None when it imports none."""
    return next((o.version for o in model.opset_import if normalize_domain(o.domain) == ""), None)


def upgrade_opset(
    model: onnx.ModelProto,
    target: int,
    where: str,
    *,
    runtime: str | None = None,
    low_type: int | None = None,
    base_dir=None,
) -> OpsetChange:
    """Raise `model`'s default-domain opset to `target` in place (onnx.version_converter); the
    change it made, with its warnings. Raises AutocastError for a downgrade, an unknown opset, a
    node the converter cannot upgrade (named) and an upgraded model that computes something else
    than the original (the node named). `runtime` (--runtime) and `low_type` (the target's
    TensorProto type) say which kernels the upgraded nodes need; `base_dir` is the folder the
    model's external data is read from for the comparison."""
    flag = f"--opset {target}"
    current = _checked_request(model, target, where)
    if target == current:
        return OpsetChange(current, current)
    _refuse_unknown_ops(model, target, where)
    if encoded_size(model) > PROTOBUF_LIMIT:
        raise AutocastError(
            f"{flag}: the model is over 2 GiB in memory, more than the version converter can serialize",
            where,
            "save it with its weights as external data (onnx.save(..., save_as_external_data=True)) and pass that file",
        )
    try:
        upgraded = onnx.version_converter.convert_version(model, target)
    except _CONVERTER_ERRORS as exc:
        raise _refusal(model, current, target, str(exc), where) from None
    needed = helper.find_min_ir_version_for([helper.make_opsetid("", target)], ignore_unknown=True)
    upgraded.ir_version = max(upgraded.ir_version, model.ir_version, needed)
    warnings = _carry_over(model, upgraded, current, target, where)
    _refuse_left_attributes(upgraded, current, target, where)
    changed = changed_nodes(model, target)
    try:
        warnings += compare(model, upgraded, changed, base_dir)
    except Disagreement as exc:
        raise AutocastError(f"{flag}: {exc}", where, _HINT) from None
    warnings += kernel_warnings(changed, (current, target), runtime, low_type)
    model.CopyFrom(upgraded)
    return OpsetChange(current, target, tuple(warnings))


def _checked_request(model: onnx.ModelProto, target: int, where: str) -> int:
    """The model's default-domain opset, after refusing a model without one, an opset the installed
    onnx does not know and a downgrade."""
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
    return current


def _nodes(graph: onnx.GraphProto, path: str = "main") -> Iterator[tuple[onnx.NodeProto, str]]:
    """Every node of `graph` and of its bodies, with the graph it is in."""
    for node in graph.node:
        yield node, path
        for attr, body in _bodies(node):
            yield from _nodes(body, f"{path}/{node.name or node.op_type}.{attr}")


def _bodies(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The node's graph attributes: (the attribute's name, with [k] for the k-th of a list; the body)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        for k, body in enumerate(attr.graphs):
            yield f"{attr.name}[{k}]", body


def _all_nodes(model: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, str, int | None]]:
    """Every node of the model (main graph, bodies, model-local functions) with where it is and the
    default-domain opset it is read at (a function's own; None for a function that imports none)."""
    opset = default_opset(model)
    for node, path in _nodes(model.graph):
        yield node, path, opset
    for f in model.functions:
        own = _function_opset(f)
        for node in f.node:
            yield node, f"function {_function_name(f)}", own
            for attr, body in _bodies(node):
                for inner, path in _nodes(body, f"function {_function_name(f)}/{node.name or node.op_type}.{attr}"):
                    yield inner, path, own


def _function_opset(f: onnx.FunctionProto) -> int | None:
    return next((o.version for o in f.opset_import if normalize_domain(o.domain) == ""), None)


def _function_name(f: onnx.FunctionProto) -> str:
    return f"{f.domain}:{f.name}" if f.domain else f.name


def _label(node: onnx.NodeProto, path: str) -> str:
    name = f"'{node.name}'" if node.name else "(unnamed)"
    return f"node {name} ({node.op_type})" + ("" if path == "main" else f" in {path}")


@cache
def _since(op: str, opset: int) -> int | None:
    """The since-version of the default-domain `op` at `opset`, None where it has no schema."""
    try:
        return defs.get_schema(op, opset, "").since_version
    except defs.SchemaError:
        return None


def changed_nodes(model: onnx.ModelProto, target: int) -> list[Changed]:
    """The default-domain nodes (main graph, bodies, model-local functions) whose op version differs
    between the opset they are read at and `target`: those the converter's adapters may rewrite."""
    found = []
    for node, path, opset in _all_nodes(model):
        if normalize_domain(node.domain) != "" or opset is None or opset >= target:
            continue
        before, after = _since(node.op_type, opset), _since(node.op_type, target)
        if before is not None and after is not None and before != after:
            found.append(Changed(node, path, before, after))
    return found


def _refuse_unknown_ops(model: onnx.ModelProto, target: int, where: str) -> None:
    """A default-domain node whose op has no schema at the opset it is read at: the converter cannot
    tell which version it is, so it cannot upgrade it."""
    for node, path, opset in _all_nodes(model):
        if normalize_domain(node.domain) != "" or opset is None:
            continue
        if _since(node.op_type, opset) is None:
            raise AutocastError(
                f"--opset {target}: {_label(node, path)} has no ONNX schema at opset {opset}, "
                "so the version converter cannot upgrade it",
                where,
                "replace the node with standard ops, or drop --opset",
            ) from None


# ---- what the converter drops ---------------------------------------------------------------------
def _carry_over(
    model: onnx.ModelProto, upgraded: onnx.ModelProto, current: int, target: int, where: str
) -> list[OpsetWarning]:
    """Put back into `upgraded` what the converter dropped from `model` (the module's text), and
    remove the attributes it left where they have no effect; the warnings of metadata that found no
    node to go to."""
    lost: list[str] = []
    _restore_graph(model.graph, upgraded.graph, "main", lost)
    functions = [_upgraded_function(f, model, target, where, lost) for f in model.functions]
    del upgraded.functions[:]
    upgraded.functions.extend(functions)
    imported = {normalize_domain(o.domain) for o in upgraded.opset_import}
    upgraded.opset_import.extend(o for o in model.opset_import if normalize_domain(o.domain) not in imported)
    for node, _ in _nodes(upgraded.graph):
        _drop_idle_attributes(node, current, target)
    if not lost:
        return []
    shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
    return [
        OpsetWarning(
            "kept",
            f"the metadata_props of {shown} could not be carried over: the version converter replaced the "
            "node(s), and no upgraded node is theirs by name, outputs or position",
        )
    ]


def _restore_graph(before: onnx.GraphProto, after: onnx.GraphProto, path: str, lost: list[str]) -> None:
    """`before`'s metadata_props, value_info and quantization annotations into `after`, and its nodes'
    metadata_props into their counterparts, in the bodies too; `lost` gets the nodes without one."""
    if not after.metadata_props:
        after.metadata_props.extend(before.metadata_props)
    declared = {v.name for v in (*after.input, *after.output, *after.value_info)}
    made = {o for n in after.node for o in n.output if o}
    after.value_info.extend(v for v in before.value_info if v.name in made and v.name not in declared)
    if not after.quantization_annotation:
        after.quantization_annotation.extend(before.quantization_annotation)
    pairs = counterparts(before.node, after.node)
    for old in before.node:
        new = pairs.get(_key(old))
        if new is None:
            if old.metadata_props:
                lost.append(_label(old, path))
            continue
        if old.metadata_props and not new.metadata_props:
            new.metadata_props.extend(old.metadata_props)
        bodies = dict(_bodies(new))
        for attr, body in _bodies(old):
            if attr in bodies:
                _restore_graph(body, bodies[attr], f"{path}/{old.name or old.op_type}.{attr}", lost)


def _key(node: onnx.NodeProto) -> tuple:
    return (node.name, node.op_type, tuple(node.output), tuple(node.input))


def counterparts(before: Sequence[onnx.NodeProto], after: Sequence[onnx.NodeProto]) -> dict:
    """Each node of `before` (by _key) -> the node of `after` the converter made of it: the one of the
    same name where the name is one node's in each list (the converter keeps names, even where the op
    changes: Upsample-9 becomes Resize-10), else the one with the same outputs, else the k-th of the
    same op where both lists hold as many of it."""
    names_after = _unique_names(after)
    names_before = _unique_names(before)
    by_outputs = {tuple(n.output): n for n in after if any(n.output)}
    ops_after: dict[str, list] = {}
    for n in after:
        ops_after.setdefault(n.op_type, []).append(n)
    ops_before: dict[str, int] = {}
    for n in before:
        ops_before[n.op_type] = ops_before.get(n.op_type, 0) + 1
    seen: dict[str, int] = {}
    pairs = {}
    for n in before:
        k = seen.get(n.op_type, 0)
        seen[n.op_type] = k + 1
        if n.name and n.name in names_before and n.name in names_after:
            pairs[_key(n)] = names_after[n.name]
        elif tuple(n.output) in by_outputs and any(n.output):
            pairs[_key(n)] = by_outputs[tuple(n.output)]
        elif len(ops_after.get(n.op_type, ())) == ops_before[n.op_type]:
            pairs[_key(n)] = ops_after[n.op_type][k]
    return pairs


def _unique_names(nodes: Sequence[onnx.NodeProto]) -> dict[str, onnx.NodeProto]:
    count: dict[str, int] = {}
    for n in nodes:
        count[n.name] = count.get(n.name, 0) + 1
    return {n.name: n for n in nodes if n.name and count[n.name] == 1}


def _upgraded_function(
    f: onnx.FunctionProto, model: onnx.ModelProto, target: int, where: str, lost: list[str]
) -> onnx.FunctionProto:
    """Model-local function `f` read at `target`: as it is, with its default-domain import raised,
    where none of its ops changes version on the way; else its body upgraded by the converter on its
    own (a graph of the body with untyped inputs and outputs), refused naming the function where the
    converter cannot. The comparison of the whole model then checks what the body computes."""
    own = _function_opset(f)
    new = onnx.FunctionProto()
    new.CopyFrom(f)
    if own is None or own >= target:
        return new
    body = [n for n, _, _ in _all_nodes(_holder(f, model.ir_version)) if normalize_domain(n.domain) == ""]
    if any(_since(n.op_type, own) != _since(n.op_type, target) for n in body):
        try:
            converted = onnx.version_converter.convert_version(_holder(f, model.ir_version), target)
        except _CONVERTER_ERRORS as exc:
            said = _said(str(exc))
            raise AutocastError(
                f"--opset {target}: the version converter cannot upgrade the body of model-local function "
                f"'{_function_name(f)}' from opset {own}: {said}",
                where,
                "rewrite the function's body with ops of the target opset, or drop --opset",
            ) from None
        holder = _holder(f, model.ir_version)
        _restore_graph(holder.graph, converted.graph, f"function {_function_name(f)}", lost)
        for node, _ in _nodes(converted.graph):
            _drop_idle_attributes(node, own, target)
        del new.node[:]
        new.node.extend(converted.graph.node)
    for o in new.opset_import:
        if normalize_domain(o.domain) == "":
            o.version = target
    return new


def _holder(f: onnx.FunctionProto, ir_version: int) -> onnx.ModelProto:
    """A model whose graph is `f`'s body, its inputs and outputs untyped, at `f`'s opsets."""
    graph = helper.make_graph(
        list(f.node),
        f.name,
        [onnx.ValueInfoProto(name=n) for n in f.input],
        [onnx.ValueInfoProto(name=n) for n in f.output],
    )
    holder = helper.make_model(graph, opset_imports=list(f.opset_import))
    holder.ir_version = ir_version
    return holder


# ---- attributes the converter leaves --------------------------------------------------------------
def _drop_idle_attributes(node: onnx.NodeProto, before: int, target: int) -> None:
    """Remove what the converter leaves on a node (upgraded from opset `before`) that has no effect
    there: Pad-10's `value` when the mode is not constant (the adapter to Pad-11 moves it to an input
    in constant mode only, and it pads with nothing in the other modes)."""
    if normalize_domain(node.domain) != "" or node.op_type != "Pad" or not before < 11 <= target:
        return
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
    if mode != "constant":
        kept = [a for a in node.attribute if a.name != "value"]
        del node.attribute[:]
        node.attribute.extend(kept)


def _refuse_left_attributes(upgraded: onnx.ModelProto, current: int, target: int, where: str) -> None:
    """Refuse a node the converter left with an attribute its op had at the model's opset but has no
    more at `target` (an attribute its old schema does not know either was the input's, and is left
    to the checks that judge the input)."""
    for node, path, _ in _all_nodes(upgraded):
        if normalize_domain(node.domain) != "" or _since(node.op_type, target) is None:
            continue
        now = defs.get_schema(node.op_type, target, "").attributes
        left = [a.name for a in node.attribute if a.name not in now]
        if not left:
            continue
        try:
            before = defs.get_schema(node.op_type, current, "").attributes
        except defs.SchemaError:
            continue
        stale = [name for name in left if name in before]
        if stale:
            version = _since(node.op_type, target)
            raise AutocastError(
                f"--opset {target}: ONNX's version converter left attribute '{stale[0]}' on {_label(node, path)}, "
                f"which {node.op_type}-{version} does not have, so the upgraded node would not be valid",
                where,
                _HINT,
            )


def _refusal(model: onnx.ModelProto, current: int, target: int, message: str, where: str) -> AutocastError:
    """The converter's failure as one line naming the node it stopped at: the node its message
    names, else the first node of the op type it names (its adapters say `adapt_scan_8_9`, `of
    Attention`, `for Relu`), else its own words."""
    said = _said(message)
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
    return AutocastError(what, where, _HINT)


def _said(message: str) -> str:
    """The converter's reason, from the last line of its message, without the assertion it quotes."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return re.sub(r"^.*?Assertion `[^`]*` failed: ", "", lines[-1] if lines else "no reason given").strip()
