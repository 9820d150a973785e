"""Drop-ins for the fp16 converters that exporters call today, built on autocast-onnx's planner.

onnxconverter-common's `float16.convert_float_to_float16` and
`auto_mixed_precision.auto_convert_mixed_precision`, and ONNX Runtime's copy of the first
(`onnxruntime.transformers.float16`), take the keywords below and return an onnx.ModelProto.
The functions here take the same keywords and return a ModelProto too, so that one import
switches a script over:

    from autocast_onnx.compat import convert_float_to_float16  # was: from onnxconverter_common.float16 import ...
    model_fp16 = convert_float_to_float16(model, keep_io_types=True, op_block_list=["Softmax"])

    from autocast_onnx import compat as float16               # was: from onnxconverter_common import float16
    from autocast_onnx import compat as auto_mixed_precision  # was: ... import auto_mixed_precision

Each keyword becomes one of autocast-onnx's options (autocast_onnx.convert: precision,
keep_io_types, low_precision_io, exclude_ops, exclude_nodes, check; target and inputs for the
accuracy search), so the conversion is the project's own: rule files, data rules, the plan and the
rewrite, never a second converter. A keyword whose behaviour the project does not reproduce
(clamping constants to min_positive_val/max_finite_val, fp16 weights for fp32 nodes, a
validation callback, ...) is refused with an AutocastError when given a value other than its
default, never ignored. docs/migrating.md maps every keyword and says what differs and why.

The plan's warnings, which the project's own calls keep in `result.plan.warnings`, are issued
as Python warnings (CompatWarning), because a caller of these functions gets only the model.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from .catalog.loader import normalize_domain
from .errors import AutocastError

__all__ = ["DEFAULT_OP_BLOCK_LIST", "CompatWarning", "auto_convert_mixed_precision", "convert_float_to_float16"]

# onnxconverter-common's default block list, kept so that `float16.DEFAULT_OP_BLOCK_LIST + [...]`
# still runs after the import switch. autocast-onnx's default rules keep each of these ops fp32
# already, except Min and Max (exact in any precision) and Resize (fp16 data, fp32 coordinates by
# a pin): rules/default.toml says why. Passing the list blocks the ops it names that the model has.
DEFAULT_OP_BLOCK_LIST = [
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Resize", "Range", "CumSum",
    "Min", "Max", "Upsample",
]  # fmt: skip

# The clamping bounds' defaults: onnxconverter-common's, and ONNX Runtime's copy's. Either is
# taken as "not given"; any other value asks for clamping, which the project does not do.
_CLAMP_DEFAULTS = {"min_positive_val": (1e-7, 5.96e-08), "max_finite_val": (1e4, 65504.0)}
_CLAMP_INSTEAD = {
    "min_positive_val": "it keeps a node fp32 when its constants would flush to zero instead "
    "(rules [thresholds] small_constant_elements, max_flush_fraction)",
    "max_finite_val": "it keeps a node fp32 when its constants exceed the low type's range instead",
}


class CompatWarning(UserWarning):
    """A warning of the plan a drop-in made (a selector that matched nothing, a constant's values
    that flush to zero, ...): autocast_onnx.convert keeps these in result.plan.warnings."""


def convert_float_to_float16(
    model,
    min_positive_val=1e-7,
    max_finite_val=1e4,
    keep_io_types=False,
    disable_shape_infer=False,
    op_block_list=None,
    node_block_list=None,
    *,
    check_fp16_ready=True,
    force_fp16_initializers=False,
    force_fp16_inputs=None,
    use_bfloat16_as_blocked_nodes_dtype=False,
    use_bfloat16=False,
    runtime=None,
) -> onnx.ModelProto:
    """onnxconverter-common's `convert_float_to_float16` (and ONNX Runtime's, with its extra
    keywords), planned and rewritten by autocast-onnx; returns the converted ModelProto and leaves
    `model` (a ModelProto or a path) unchanged.

    keep_io_types: True keeps the float32 inputs and outputs float32; False gives every one of
    them the low type (as the peers do); a list of names (ONNX Runtime) keeps those and lowers
    the others. op_block_list: op types kept fp32, in any domain, on top of the project's rules
    (None: the rules alone). node_block_list: node names kept fp32. disable_shape_infer: True
    checks the result with onnx.checker only, False adds ONNX shape inference to the check (the
    planning itself never needs it). check_fp16_ready: refuse a model that already holds float16
    or bfloat16 tensors. use_bfloat16: convert to bfloat16 instead (autocast-onnx's precision="bf16";
    neither peer has it). runtime: "cuda", "dml" or "tensorrt" keeps fp32 the nodes that runtime has
    no low-precision kernel for (autocast-onnx's --runtime; neither peer has it; None plans for any
    runtime and warns when ONNX Runtime's CUDA provider would run some nodes on the CPU). The keywords
    after node_block_list are keyword-only: the peers put different ones in that position.
    min_positive_val, max_finite_val (other than either peer's default), force_fp16_initializers,
    force_fp16_inputs and use_bfloat16_as_blocked_nodes_dtype ask for what the project does not do,
    and are refused (docs/migrating.md says why)."""
    _refuse_unreproduced(
        min_positive_val=min_positive_val,
        max_finite_val=max_finite_val,
        force_fp16_initializers=force_fp16_initializers,
        force_fp16_inputs=force_fp16_inputs,
        use_bfloat16_as_blocked_nodes_dtype=use_bfloat16_as_blocked_nodes_dtype,
    )
    source = _model_of(model)
    precision = "bf16" if _flag(use_bfloat16, "use_bfloat16") else "fp16"
    if _flag(check_fp16_ready, "check_fp16_ready"):
        _refuse_converted(source)
    planning = {
        "precision": precision,
        **_io_options(source, keep_io_types),
        "exclude_ops": _block_ops(source, op_block_list),
        "exclude_nodes": _block_nodes(node_block_list),
        "runtime": runtime,
    }
    check = "basic" if _flag(disable_shape_infer, "disable_shape_infer") else "full"
    return _converted(source, planning, check=check)


def auto_convert_mixed_precision(
    model, feed_dict, validate_fn=None, rtol=None, atol=None, keep_io_types=False, *, runtime=None
) -> onnx.ModelProto:
    """onnxconverter-common's `auto_convert_mixed_precision`, as autocast-onnx's accuracy search:
    the fewest nodes kept fp32 for the converted model to meet `rtol` and/or `atol` on the inputs
    `feed_dict` (input name -> array); returns the converted ModelProto.

    rtol and atol are the project's validation thresholds (`--target rtol=X,atol=Y`): rtol bounds
    the largest absolute error relative to the output's largest magnitude, atol the largest
    absolute error, both on every output (np.allclose's elementwise test would make every value
    near zero match to atol, which rtol alone sets to 1e-8 there). The outputs are measured with
    the low type's rounding emulated, as `autocast-onnx validate` measures on CPU. keep_io_types
    and runtime as in convert_float_to_float16. validate_fn, a callback the search cannot judge by, is
    refused: state the criterion as rtol/atol, or call autocast_onnx.convert with target= for
    cosine or top-1 agreement."""
    from .api import convert

    if validate_fn is not None:
        raise AutocastError(
            "a validation callback is not supported: the accuracy search judges by its own thresholds",
            "validate_fn",
            "state the criterion as rtol=/atol=, or use autocast_onnx.convert(model, target=['cosine=0.9999'])",
        )
    targets = [
        f"{key}={_tolerance(value, key)}" for key, value in (("rtol", rtol), ("atol", atol)) if value is not None
    ]
    if not targets:
        raise AutocastError("no accuracy target given", "rtol", "pass rtol= and/or atol=, e.g. rtol=0.01")
    source = _model_of(model)
    planning = {"precision": "fp16", **_io_options(source, keep_io_types), "runtime": runtime}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "feed_dict.npz"
        np.savez(inputs, **_feeds(feed_dict))
        try:
            result = convert(source, target=targets, inputs=str(inputs), check="full", **planning)
        except AutocastError as exc:
            if exc.where == "--target":  # the search's own verdict: name the keywords that set it
                raise AutocastError(exc.what, "/".join(t.split("=")[0] for t in targets), exc.hint) from None
            if exc.where is None or tmp not in exc.where:
                raise
            raise AutocastError(exc.what, "feed_dict", exc.hint) from None
    _issue_warnings(result)
    return result.model


def _converted(source: onnx.ModelProto, planning: dict, check: str) -> onnx.ModelProto:
    """autocast_onnx.convert with the planning keywords the drop-in's keywords became; the plan's
    warnings issued as CompatWarning."""
    from .api import convert

    result = convert(source, check=check, **planning)
    _issue_warnings(result)
    return result.model


def _issue_warnings(result) -> None:
    """The plan's warnings as Python warnings, at the caller of the drop-in."""
    for warning in result.plan.warnings:
        warnings.warn(f"autocast-onnx: {warning.message}", CompatWarning, stacklevel=3)


def _refuse_unreproduced(**given) -> None:
    """Refuse each keyword given a value whose behaviour autocast-onnx does not reproduce."""
    for name in ("min_positive_val", "max_finite_val"):
        value = given[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AutocastError(f"{name}={value!r} is not a number", name, "drop it")
        if float(value) not in _CLAMP_DEFAULTS[name]:
            raise AutocastError(
                f"{name}={value!r} asks to clamp constants to it, which autocast-onnx does not do: "
                + _CLAMP_INSTEAD[name],
                name,
                "drop the keyword; docs/migrating.md says what to use instead",
            )
    if _flag(given["force_fp16_initializers"], "force_fp16_initializers"):
        raise AutocastError(
            "force_fp16_initializers=True stores the weights of fp32 nodes as float16, which autocast-onnx does "
            "not do: a node kept fp32 keeps its weights fp32",
            "force_fp16_initializers",
            "drop it; to run more nodes in fp16, block fewer ops or nodes",
        )
    if given["force_fp16_inputs"]:
        raise AutocastError(
            f"force_fp16_inputs={given['force_fp16_inputs']!r} is not supported: the ports it names stay fp32 by "
            "autocast-onnx's [pins] rules (the schema or the value needs fp32)",
            "force_fp16_inputs",
            "drop it; docs/migrating.md says why",
        )
    if _flag(given["use_bfloat16_as_blocked_nodes_dtype"], "use_bfloat16_as_blocked_nodes_dtype"):
        raise AutocastError(
            "use_bfloat16_as_blocked_nodes_dtype=True runs blocked nodes in bfloat16, which autocast-onnx does not "
            "do: a blocked node computes in fp32",
            "use_bfloat16_as_blocked_nodes_dtype",
            "drop it, or convert the whole model to bfloat16 with use_bfloat16=True",
        )


def _flag(value, name: str) -> bool:
    """A keyword that takes True or False (numpy's bools too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise AutocastError(f"{name}={value!r} is not True or False", name, f"pass {name}=True or {name}=False")
    return bool(value)


def _model_of(model) -> onnx.ModelProto:
    """The model a drop-in converts: a ModelProto as it is (never edited), or the model at a path,
    loaded and checked as every command loads one."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        from .graph.sanity import load_checked

        return load_checked(model).model
    raise AutocastError(
        f"expected an onnx.ModelProto or a path, not {type(model).__name__}", "model", "pass onnx.load(path)"
    )


def _float_io(model: onnx.ModelProto) -> list[str]:
    """The names of the main graph's float32 inputs (initializers listed as inputs left out) and
    outputs: those whose type keep_io_types decides."""
    constants = {t.name for t in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in constants] + list(model.graph.output)
    return list(dict.fromkeys(v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT))


def _io_options(model: onnx.ModelProto, keep_io_types) -> dict:
    """keep_io_types (True, False or a list of names) as autocast-onnx's keep_io_types and
    low_precision_io: the model's types kept, but for the float32 inputs and outputs that take
    the low type, named whole in one regex."""
    names = _float_io(model)
    if isinstance(keep_io_types, (bool, np.bool_)):
        lowered = [] if keep_io_types else names
    elif isinstance(keep_io_types, (list, tuple, set, frozenset)) and all(isinstance(n, str) for n in keep_io_types):
        io = {v.name for v in model.graph.input} | {v.name for v in model.graph.output}
        unknown = sorted(n for n in keep_io_types if n not in io)
        if unknown:
            raise AutocastError(
                f"{unknown[0]!r} is not an input or output of the model",
                "keep_io_types",
                "name the model's inputs and outputs: " + ", ".join(sorted(io)),
            )
        lowered = [n for n in names if n not in keep_io_types]
    else:
        raise AutocastError(
            f"keep_io_types={keep_io_types!r} is neither True, False nor a list of names",
            "keep_io_types",
            "pass a bool or a list of input and output names",
        )
    pattern = "|".join(re.escape(n) for n in lowered) if lowered else None
    return {"keep_io_types": True, "low_precision_io": pattern}


def _names(value, keyword: str) -> list[str]:
    """A list of names given to `keyword` (None: none)."""
    if value is None:
        return []
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise AutocastError(f"{keyword}={value!r} is not a list of names", keyword, f'e.g. {keyword}=["Softmax"]')
    return list(value)


def _block_ops(model: onnx.ModelProto, op_block_list) -> list[str]:
    """op_block_list as exclude_ops: each op type as the model's nodes spell it, in any domain
    (the peers compare op_type alone). An op type no node has is dropped, as the peers' lists are
    meant for any model; one that no ONNX schema or runtime knows is refused as a misspelling."""
    wanted = _names(op_block_list, "op_block_list")
    present: dict[str, set[str]] = {}
    for node in _all_nodes(model.graph):
        domain = normalize_domain(node.domain)
        present.setdefault(node.op_type, set()).add(domain)
    known = None
    out: list[str] = []
    for op in dict.fromkeys(wanted):
        if op in present:
            out += sorted(op if not domain else f"{domain}:{op}" for domain in present[op])
            continue
        if known is None:
            from .catalog.loader import known_op_types

            known = set(known_op_types()) | {s.name for s in onnx.defs.get_all_schemas_with_history()}
        if op not in known:
            raise AutocastError(
                f"op type {op!r} is in no ONNX schema, is no known runtime op and no node of the model has it",
                "op_block_list",
                "check the spelling",
            )
    return out


def _all_nodes(graph: onnx.GraphProto):
    """Every node of `graph` and of the bodies of its If, Loop and Scan nodes."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _all_nodes(body)


def _block_nodes(node_block_list) -> list[str]:
    """node_block_list as exclude_nodes: each name as a regex matching that whole name only."""
    return [f"^{re.escape(name)}$" for name in _names(node_block_list, "node_block_list")]


def _refuse_converted(model: onnx.ModelProto) -> None:
    """check_fp16_ready, as onnxconverter-common checks it: a main graph with a float16 (here
    also bfloat16) input, output, value_info, initializer or Cast to that type was converted
    already."""
    low = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
    graph = model.graph
    found = [
        (v.name, v.type.tensor_type.elem_type)
        for v in list(graph.input) + list(graph.output) + list(graph.value_info)
        if v.type.tensor_type.elem_type in low
    ]
    found += [(t.name, t.data_type) for t in graph.initializer if t.data_type in low]
    found += [
        (n.name or n.output[0], a.i)
        for n in graph.node
        if n.op_type == "Cast"
        for a in n.attribute
        if a.name == "to" and a.i in low
    ]
    if found:
        name, elem = found[0]
        raise AutocastError(
            f"the model holds {low[elem]} already ({name!r}): it looks converted",
            "check_fp16_ready",
            "pass check_fp16_ready=False to convert it anyway",
        )


def _tolerance(value, keyword: str) -> float:
    """An rtol or atol: a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise AutocastError(f"{keyword}={value!r} is not a number", keyword, f"e.g. {keyword}=0.01")
    if not (np.isfinite(value) and value > 0):
        raise AutocastError(f"{keyword}={value!r} must be a positive number", keyword, f"e.g. {keyword}=0.01")
    return float(value)


def _feeds(feed_dict) -> dict:
    """feed_dict (input name -> array) as the arrays of one batch."""
    if not isinstance(feed_dict, Mapping) or not feed_dict:
        raise AutocastError(
            "feed_dict must be a non-empty mapping of input names to arrays", "feed_dict", "e.g. {'x': np.ones(...)}"
        )
    out = {}
    for name, value in feed_dict.items():
        if not isinstance(name, str):
            raise AutocastError(f"feed_dict key {name!r} is not an input name", "feed_dict", "use the input's name")
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise AutocastError(
                f"feed_dict[{name!r}] is not an array of numbers ({array.dtype})", "feed_dict", "pass numpy arrays"
            )
        out[name] = array
    return out
