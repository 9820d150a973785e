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
accuracy search, with the caller's validate_fn as its verdict), so the conversion is the project's
own: rule files, data rules, the plan and the rewrite, never a second converter. A keyword whose
behaviour the project does not reproduce (clamping constants to min_positive_val/max_finite_val,
fp16 weights for fp32 nodes, ...) is refused with an AutocastError when given a value other than
its default, never ignored. docs/migrating.md maps every keyword and says what differs and why.

The plan's warnings, which the project's own calls keep in `result.plan.warnings`, are issued
as Python warnings (CompatWarning), because a caller of these functions gets only the model.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from google.protobuf.message import DecodeError, EncodeError

from .errors import AutocastError
from .graph.domains import normalize_domain

__all__ = [
    "DEFAULT_OP_BLOCK_LIST",
    "CompatWarning",
    "auto_convert_mixed_precision",
    "auto_convert_mixed_precision_model_path",
    "convert_float_to_float16",
    "modelopt_autocast",
    "modelopt_convert_to_f16",
    "modelopt_convert_to_mixed_precision",
    "onnxruntime_convert_float_to_float16",
    "onnxruntime_float16",
]

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

# ONNX Runtime's copy's default list (onnxruntime.transformers.float16, 1.17 to 1.2x): the same
# but for TreeEnsemble (added) and Resize (left out).
ONNXRUNTIME_DEFAULT_OP_BLOCK_LIST = [
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "TreeEnsemble", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum",
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
    check_fp16_ready=True,
    *,
    force_fp16_initializers=False,
    force_fp16_inputs=None,
    use_bfloat16_as_blocked_nodes_dtype=False,
    use_bfloat16=False,
    runtime=None,
) -> onnx.ModelProto:
    """onnxconverter-common's `convert_float_to_float16`, with its signature (the eighth
    parameter, check_fp16_ready, included), planned and rewritten by autocast-onnx; returns the
    converted ModelProto and leaves `model` (a ModelProto or a path) unchanged. ONNX Runtime's
    copy, whose eighth parameter is force_fp16_initializers, is onnxruntime_convert_float_to_float16;
    its extra keywords are taken here too, by keyword only.

    keep_io_types: True keeps the float32 inputs and outputs float32; False gives every one of
    them the low type (as the peers do); a list of names (ONNX Runtime) keeps those and lowers
    the others. op_block_list: op types kept fp32, in any domain, on top of the project's rules
    (None: the rules alone). node_block_list: node names kept fp32. Each list may be any iterable
    of names (a generator, a set, a dict's keys), read once. disable_shape_infer: True
    checks the result with onnx.checker only, False adds ONNX shape inference to the check (the
    planning itself never needs it). check_fp16_ready: refuse a model that already holds float16
    or bfloat16 tensors. use_bfloat16: convert to bfloat16 instead (autocast-onnx's precision="bf16";
    neither peer has it). runtime: "cuda", "dml" or "tensorrt" keeps fp32 the nodes that runtime has
    no low-precision kernel for (autocast-onnx's --runtime; neither peer has it; None plans for any
    runtime and warns when ONNX Runtime's CUDA provider would run some nodes on the CPU).
    min_positive_val, max_finite_val (other than either peer's default), force_fp16_initializers,
    force_fp16_inputs and use_bfloat16_as_blocked_nodes_dtype ask for what the project does not do,
    and are refused (docs/migrating.md says why). A ModelProto over 2 GiB in memory, more than
    protobuf encodes, is converted through a temporary folder (see _converted)."""
    given = _materialised(keep_io_types=keep_io_types, op_block_list=op_block_list, node_block_list=node_block_list)
    _refuse_unreproduced(
        min_positive_val=min_positive_val,
        max_finite_val=max_finite_val,
        force_fp16_initializers=force_fp16_initializers,
        force_fp16_inputs=_materialised(force_fp16_inputs=force_fp16_inputs)["force_fp16_inputs"],
        use_bfloat16_as_blocked_nodes_dtype=use_bfloat16_as_blocked_nodes_dtype,
    )
    result = _float16(
        model, given, check_fp16_ready=check_fp16_ready, disable_shape_infer=disable_shape_infer,
        use_bfloat16=use_bfloat16, runtime=runtime,
    )  # fmt: skip
    _issue_warnings(result)
    return result.model


def onnxruntime_convert_float_to_float16(
    model,
    min_positive_val=5.96e-08,
    max_finite_val=65504.0,
    keep_io_types=False,
    disable_shape_infer=False,
    op_block_list=None,
    node_block_list=None,
    force_fp16_initializers=False,
    force_fp16_inputs=None,
    use_bfloat16_as_blocked_nodes_dtype=False,
    *,
    use_bfloat16=False,
    runtime=None,
) -> onnx.ModelProto:
    """ONNX Runtime's `onnxruntime.transformers.float16.convert_float_to_float16`, with its
    signature and defaults; the keywords as in convert_float_to_float16. As the peer, it converts
    a model that holds float16 already (its float32 parts; onnxconverter-common's check_fp16_ready
    is not its own). `onnxruntime_float16` is this module's stand-in for the peer's module."""
    given = _materialised(keep_io_types=keep_io_types, op_block_list=op_block_list, node_block_list=node_block_list)
    _refuse_unreproduced(
        min_positive_val=min_positive_val,
        max_finite_val=max_finite_val,
        force_fp16_initializers=force_fp16_initializers,
        force_fp16_inputs=_materialised(force_fp16_inputs=force_fp16_inputs)["force_fp16_inputs"],
        use_bfloat16_as_blocked_nodes_dtype=use_bfloat16_as_blocked_nodes_dtype,
    )
    result = _float16(
        model, given, check_fp16_ready=False, disable_shape_infer=disable_shape_infer, use_bfloat16=use_bfloat16,
        runtime=runtime,
    )  # fmt: skip
    _issue_warnings(result)
    return result.model


# `from onnxruntime.transformers import float16` becomes
# `from autocast_onnx.compat import onnxruntime_float16 as float16`
onnxruntime_float16 = SimpleNamespace(
    convert_float_to_float16=onnxruntime_convert_float_to_float16,
    DEFAULT_OP_BLOCK_LIST=ONNXRUNTIME_DEFAULT_OP_BLOCK_LIST,
)


def _float16(model, given: dict, *, check_fp16_ready, disable_shape_infer, use_bfloat16, runtime):
    """Both convert_float_to_float16 drop-ins, once their keywords are read (`given`: the
    iterables, materialised) and the unreproduced ones refused: the ConversionResult."""
    source = _model_of(model)
    precision = "bf16" if _flag(use_bfloat16, "use_bfloat16") else "fp16"
    if _flag(check_fp16_ready, "check_fp16_ready"):
        _refuse_converted(source)
    planning = {
        "precision": precision,
        **_io_options(source, given["keep_io_types"]),
        "exclude_ops": _block_ops(source, given["op_block_list"]),
        "exclude_nodes": _block_nodes(given["node_block_list"]),
        "runtime": runtime,
    }
    check = "basic" if _flag(disable_shape_infer, "disable_shape_infer") else "full"
    return _converted(source, planning, check=check)


def auto_convert_mixed_precision(
    model, feed_dict, validate_fn=None, rtol=None, atol=None, keep_io_types=False, *, runtime=None
) -> onnx.ModelProto:
    """onnxconverter-common's `auto_convert_mixed_precision`, as autocast-onnx's accuracy search:
    the fewest nodes kept fp32 for the converted model to meet `validate_fn` and/or `rtol` and
    `atol` on the inputs `feed_dict` (input name -> array); returns the converted ModelProto.

    validate_fn(res1, res2) -> bool, as in the peer, is called with the fp32 model's outputs and
    the converted model's (two lists of arrays in the model's output order, the second in the
    converted model's output types) and must return True for a conversion to pass; the search
    first checks that it accepts the fp32 outputs against themselves. rtol and atol are the
    project's validation thresholds (`--target rtol=X,atol=Y`): rtol bounds the largest absolute
    error relative to the output's largest magnitude, atol the largest absolute error, both on
    every output (np.allclose's elementwise test would make every value near zero match to atol,
    which rtol alone sets to 1e-8 there). Given with validate_fn, both must hold, as in the peer.
    The outputs are measured with the low type's rounding emulated, as `autocast-onnx validate`
    measures on CPU. keep_io_types and runtime as in convert_float_to_float16. The search's log
    (`judged_by`) names what judged it."""
    keep_io_types = _materialised(keep_io_types=keep_io_types)["keep_io_types"]
    if validate_fn is not None and not callable(validate_fn):
        raise AutocastError(
            f"validate_fn={validate_fn!r} is not callable", "validate_fn", "pass a function (res1, res2) -> bool"
        )
    targets = [
        f"{key}={_tolerance(value, key)}" for key, value in (("rtol", rtol), ("atol", atol)) if value is not None
    ]
    if not targets and validate_fn is None:
        raise AutocastError(
            "no accuracy criterion given", "rtol", "pass validate_fn= and/or rtol= and atol=, e.g. rtol=0.01"
        )
    source = _model_of(model)
    if _encoded(source) is None:
        raise AutocastError(
            "the model is over 2 GiB in memory, more than protobuf encodes: the accuracy search runs it in "
            "ONNX Runtime, which takes a model encoded (the peer fails on it as well)",
            "model",
            "convert it with convert_float_to_float16, which takes a model of any size, and keep nodes fp32 "
            "with node_block_list",
        )
    planning = {"precision": "fp16", **_io_options(source, keep_io_types), "runtime": runtime}
    result = _searched(source, feed_dict, targets, validate_fn, planning, "validate_fn")
    _issue_warnings(result)
    return result.model


# ---- NVIDIA ModelOpt AutoCast: modelopt.onnx.autocast ------------------------------------------

# AutoCast's defaults for the bounds it keeps nodes fp32 by (modelopt/onnx/autocast/convert.py)
MODELOPT_DATA_MAX = 512.0
MODELOPT_INIT_MAX = 65504.0
_MODELOPT_PROVIDERS = {"cpu": None, "cuda": "cuda", "trt": "tensorrt"}


def modelopt_convert_to_mixed_precision(
    onnx_path,
    low_precision_type="fp16",
    nodes_to_exclude=None,
    op_types_to_exclude=None,
    nodes_to_include=None,
    op_types_to_include=None,
    data_max=MODELOPT_DATA_MAX,
    init_max=MODELOPT_INIT_MAX,
    keep_io_types=False,
    calibration_data=None,
    custom_rule=None,
    init_conversion_max_bytes=None,
    providers=("cpu",),
    trt_plugins=(),
    trt_plugins_precision=(),
    max_depth_of_reduction=None,
    opset=None,
    use_standalone_type_inference=False,
) -> onnx.ModelProto:
    """ModelOpt AutoCast's `modelopt.onnx.autocast.convert_to_mixed_precision`, with its parameters
    in its order: the model at `onnx_path` planned by autocast-onnx's rules and returned as a
    ModelProto. nodes_to_exclude / nodes_to_include are regexes matched from the start of the node
    name, as AutoCast matches them (re.match); op_types_to_exclude / op_types_to_include are op
    types; an exclude beats an include in both. low_precision_type "fp16" or "bf16". keep_io_types
    as in convert_float_to_float16 (AutoCast's default, False, gives the float32 inputs and outputs
    the low type). calibration_data, a file of input batches (.npz or Polygraphy .json, or a
    folder): the fp32 model runs on it and nodes whose tensors leave the low type's range (over its
    headroom) stay fp32. providers picks the runtime the plan is made for ("cuda" or "cuda:N":
    runtime "cuda", "trt": "tensorrt", "cpu": any). opset upgrades the model to that opset first
    (autocast-onnx never does it unasked; AutoCast raises fp16 models to 19 and bf16 to 22).
    data_max and init_max other than AutoCast's defaults, custom_rule, init_conversion_max_bytes,
    trt_plugins, trt_plugins_precision and max_depth_of_reduction ask for what the project does
    differently, and are refused (docs/migrating.md says what to use instead);
    use_standalone_type_inference=True does nothing (autocast-onnx types tensors from the op
    schemas itself), and a CompatWarning says so."""
    from .api import convert

    if not isinstance(onnx_path, (str, os.PathLike)):
        raise AutocastError(
            f"onnx_path must be a path, not {type(onnx_path).__name__}",
            "onnx_path",
            "pass the model file's path; for a ModelProto use modelopt_convert_to_f16",
        )
    _refuse_modelopt(
        data_max=data_max, init_max=init_max, custom_rule=custom_rule,
        init_conversion_max_bytes=init_conversion_max_bytes, trt_plugins=trt_plugins,
        trt_plugins_precision=trt_plugins_precision, max_depth_of_reduction=max_depth_of_reduction,
        use_standalone_type_inference=use_standalone_type_inference,
    )  # fmt: skip
    source = _model_of(onnx_path)
    planning = {
        "precision": _low_precision_type(low_precision_type),
        **_io_options(source, _flag(keep_io_types, "keep_io_types")),
        "exclude_nodes": _anchored(nodes_to_exclude, "nodes_to_exclude"),
        "include_nodes": _anchored(nodes_to_include, "nodes_to_include"),
        "exclude_ops": _block_ops(source, _materialised(o=op_types_to_exclude)["o"], "op_types_to_exclude"),
        "include_ops": _block_ops(source, _materialised(o=op_types_to_include)["o"], "op_types_to_include"),
        "runtime": _modelopt_runtime(providers),
        "opset": opset,
    }
    result = convert(source, calibration_data=calibration_data, check="full", **planning)
    _issue_warnings(result)
    return result.model


def modelopt_convert_to_f16(
    model,
    low_precision_type="fp16",
    keep_io_types=True,
    op_block_list=(),
    tensor_block_dict=None,
    trt_plugins=(),
    use_standalone_type_inference=False,
    opset=None,
) -> onnx.ModelProto:
    """ModelOpt AutoCast's `modelopt.onnx.autocast.convert_to_f16`, with its parameters in its
    order: `model` (a ModelProto, or a path) converted by autocast-onnx's rules, `op_block_list`
    op types kept fp32 on top of them (AutoCast's call keeps only those); returns a ModelProto.
    low_precision_type, keep_io_types, opset and use_standalone_type_inference as in
    modelopt_convert_to_mixed_precision. tensor_block_dict (ports kept fp32 per op type) is
    refused when not empty: autocast-onnx pins the ports that need fp32 by its [pins] rules, and a
    rule file adds more. trt_plugins is refused when not empty."""
    _refuse_modelopt(
        trt_plugins=trt_plugins,
        use_standalone_type_inference=use_standalone_type_inference,
        tensor_block_dict=tensor_block_dict,
    )
    source = _model_of(model)
    planning = {
        "precision": _low_precision_type(low_precision_type),
        **_io_options(source, _flag(keep_io_types, "keep_io_types")),
        "exclude_ops": _block_ops(source, _materialised(o=op_block_list)["o"], "op_block_list"),
        "opset": opset,
    }
    result = _converted(source, planning, check="full")
    _issue_warnings(result)
    return result.model


# `from modelopt.onnx import autocast` becomes `from autocast_onnx.compat import modelopt_autocast as autocast`
modelopt_autocast = SimpleNamespace(
    convert_to_mixed_precision=modelopt_convert_to_mixed_precision,
    convert_to_f16=modelopt_convert_to_f16,
)

# what each refused AutoCast keyword asks for, and what autocast-onnx does instead
_MODELOPT_INSTEAD = {
    "data_max": "a bound on calibration values; autocast-onnx keeps a node fp32 when a measured tensor exceeds the "
    "low type's range over its headroom (rules [thresholds] calibration_headroom)",
    "init_max": "a bound on initializers; autocast-onnx keeps a node fp32 when a constant exceeds the low type's range",
    "custom_rule": "a Python node rule; autocast-onnx's rules are rule files (rules=[...], docs/rules-format.md)",
    "init_conversion_max_bytes": "large initializers cast at run time; autocast-onnx converts a low node's weights "
    "once, in the file",
    "trt_plugins": "TensorRT plugin libraries; autocast-onnx loads none: a custom op's precision is a rule",
    "trt_plugins_precision": "plugin precisions; a custom op's precision is a rule ([ops.low_precision] or "
    "[ops.keep_fp32] in a rule file)",
    "max_depth_of_reduction": "reductions kept fp32 by depth; autocast-onnx keeps reductions fp32 by category, at any "
    "depth, and leaves MatMul/Gemm/Conv accumulation to the kernels",
    "tensor_block_dict": "ports kept fp32 per op type; autocast-onnx's [pins] rules keep fp32 the ports that need it, "
    "and a rule file adds more",
}


def _refuse_modelopt(**given) -> None:
    """Refuse each AutoCast keyword given a value whose behaviour autocast-onnx does not reproduce
    (a default is "not given"); warn that use_standalone_type_inference=True does nothing."""
    defaults = {"data_max": MODELOPT_DATA_MAX, "init_max": MODELOPT_INIT_MAX}
    for name, value in given.items():
        if name == "use_standalone_type_inference":
            if _flag(value, name):
                warnings.warn(
                    "autocast-onnx: use_standalone_type_inference=True does nothing: autocast-onnx types every "
                    "tensor from the op schemas itself, without ONNX shape inference",
                    CompatWarning,
                    stacklevel=3,
                )
            continue
        if name in defaults:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise AutocastError(f"{name}={value!r} is not a number", name, "drop it")
            unchanged = float(value) == defaults[name]
        else:
            unchanged = value is None or (isinstance(value, (list, tuple, dict, set)) and not value)
        if not unchanged:
            raise AutocastError(
                f"{name}={value!r} is not supported: it asks for " + _MODELOPT_INSTEAD[name],
                name,
                "drop it; docs/migrating.md says what to use instead",
            )


def _low_precision_type(value) -> str:
    if value not in ("fp16", "bf16"):
        raise AutocastError(f"low_precision_type={value!r} is neither fp16 nor bf16", "low_precision_type", "pass fp16")
    return value


def _anchored(patterns, keyword: str) -> list[str]:
    """AutoCast's node regexes (matched from the start of the name, re.match) as autocast-onnx's
    (searched anywhere, re.search): each anchored at the start; a regex that does not compile is
    refused naming `keyword`."""
    names = _names(_materialised(v=patterns)["v"], keyword)
    for pattern in names:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise AutocastError(f"{pattern!r} is not a regex: {exc}", keyword, "escape it with re.escape") from None
    return [f"^(?:{pattern})" for pattern in names]


def _modelopt_runtime(providers) -> str | None:
    """The runtime a plan is made for, from AutoCast's providers ("cpu", "cuda", "cuda:N", "trt"):
    the first one's."""
    names = [providers] if isinstance(providers, str) else list(providers) if providers is not None else []
    if not names or not all(isinstance(n, str) for n in names):
        raise AutocastError(f"providers={providers!r} is not a list of names", "providers", 'e.g. providers=["cuda"]')
    kinds = [n.split(":")[0] for n in names]
    unknown = [n for n, k in zip(names, kinds) if k not in _MODELOPT_PROVIDERS]
    if unknown:
        raise AutocastError(
            f"provider {unknown[0]!r} is not one of AutoCast's", "providers", "use cpu, cuda, cuda:N or trt"
        )
    return _MODELOPT_PROVIDERS[kinds[0]]


def _searched(source: onnx.ModelProto, feed_dict, targets: list[str], callback, planning: dict, named: str):
    """autocast_onnx.convert's accuracy search on the one batch `feed_dict`, judged by `targets`
    (["rtol=0.01", ...]) and the callback (None: none), which the drop-in calls `named`: the
    ConversionResult, or the search's error said in the drop-in's keywords."""
    from .api import convert

    criteria = [t.split("=")[0] for t in targets] + ([named] if callback is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "feed_dict.npz"
        np.savez(inputs, **_feeds(feed_dict))
        try:
            return convert(
                source, target=targets or None, verdict=callback, inputs=str(inputs), check="full", **planning
            )
        except AutocastError as exc:
            raise _as_keywords(exc, tmp, criteria, named) from None


def _as_keywords(exc: AutocastError, tmp: str, criteria: list[str], named: str) -> AutocastError:
    """An error of the search said in the drop-in's keywords: the search's own verdict names
    the criteria that set it, the callback's failure the callback's keyword (`named`), a bad
    input `feed_dict`."""
    if exc.where == "--target":
        return AutocastError(exc.what, "/".join(criteria), exc.hint)
    if exc.where == "verdict":
        return AutocastError(exc.what.replace("the verdict callback", named), named, exc.hint)
    if exc.where is not None and tmp in exc.where:
        return AutocastError(exc.what, "feed_dict", exc.hint)
    return exc


# ONNX Runtime's execution providers as the runtimes whose kernels a plan is made for
_PROVIDER_RUNTIMES = {
    "CPUExecutionProvider": None,
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
    "DmlExecutionProvider": "dml",
}


def auto_convert_mixed_precision_model_path(
    source_model_path,
    input_feed,
    target_model_path,
    provider,
    location=None,
    customized_validate_func=None,
    rtol=None,
    atol=None,
    keep_io_types=True,
    verbose=False,
) -> None:
    """onnxconverter-common's `auto_mixed_precision_model_path.auto_convert_mixed_precision_model_path`:
    the accuracy search of auto_convert_mixed_precision on the model file `source_model_path` and
    the one batch `input_feed`, the result written to `target_model_path` with its weights as
    external data in `location` (default "fp16_tensor.data") beside it; returns None, as the peer.

    As in the peer, customized_validate_func(res1, res2) -> bool, when given, is the whole
    criterion (rtol and atol given beside it do nothing there, and a CompatWarning says so);
    without it, rtol (default 1e-3) and atol (default 1e-5) are autocast-onnx's thresholds, as
    in auto_convert_mixed_precision. provider, the ONNX Runtime providers the model is for, picks
    the runtime whose kernels the plan is made for (CUDAExecutionProvider: runtime "cuda";
    TensorrtExecutionProvider: "tensorrt"; DmlExecutionProvider: "dml"; CPUExecutionProvider:
    any); the search measures on CPU with the low type's rounding emulated either way. An existing
    output is replaced, as the peer replaces it, with a CompatWarning; the output and its data
    file are written in full or not at all. verbose=True prints the search's summary."""
    if not isinstance(source_model_path, (str, os.PathLike)):
        raise AutocastError(
            f"source_model_path must be a path, not {type(source_model_path).__name__}",
            "source_model_path",
            "pass the model file's path; for a ModelProto use auto_convert_mixed_precision",
        )
    if not isinstance(target_model_path, (str, os.PathLike)):
        raise AutocastError(
            f"target_model_path must be a path, not {type(target_model_path).__name__}",
            "target_model_path",
            "pass the path to write the converted model to",
        )
    runtime = _provider_runtime(provider)
    location = _data_location(location)
    criteria = _model_path_criteria(customized_validate_func, rtol, atol)
    source = _model_of(source_model_path)
    keep = _materialised(keep_io_types=keep_io_types)["keep_io_types"]
    planning = {"precision": "fp16", **_io_options(source, keep), "runtime": runtime}
    result = _searched(source, input_feed, criteria, customized_validate_func, planning, "customized_validate_func")
    _issue_warnings(result)
    _write_with_data(result.model, Path(target_model_path), location)
    if _flag(verbose, "verbose"):
        log = result.plan.search or {}
        print(
            f"autocast-onnx: {log.get('evaluations', 0)} evaluations, judged by "
            f"{', '.join(log.get('judged_by', [])) or 'nothing'}; kept fp32: {', '.join(log.get('kept', [])) or 'none'}"
        )


def _provider_runtime(provider) -> str | None:
    """The runtime a plan is made for, from the peer's `provider` (a list of provider names)."""
    names = [provider] if isinstance(provider, str) else provider
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise AutocastError(
            f"provider={provider!r} is not a list of ONNX Runtime provider names",
            "provider",
            'e.g. provider=["CUDAExecutionProvider"]',
        )
    unknown = [n for n in names if n not in _PROVIDER_RUNTIMES]
    if unknown:
        raise AutocastError(
            f"provider {unknown[0]!r} is not one autocast-onnx plans for",
            "provider",
            "use one of " + ", ".join(_PROVIDER_RUNTIMES),
        )
    return _PROVIDER_RUNTIMES[names[0]]


def _data_location(location) -> str:
    """The external data file's name, in the output's folder (the peer's default when None)."""
    if location is None:
        return "fp16_tensor.data"
    if not isinstance(location, str) or not location or Path(location).name != location or location in (".", ".."):
        raise AutocastError(
            f"location={location!r} is not a file name", "location", 'name a file beside the output, e.g. "model.data"'
        )
    return location


def _model_path_criteria(callback, rtol, atol) -> list[str]:
    """The search's targets: none beside the peer's callback (which is its whole criterion), else
    rtol and atol with the peer's defaults."""
    if callback is not None:
        if not callable(callback):
            raise AutocastError(
                f"customized_validate_func={callback!r} is not callable",
                "customized_validate_func",
                "pass a function (res1, res2) -> bool",
            )
        given = [name for name, value in (("rtol", rtol), ("atol", atol)) if value is not None]
        if given:
            warnings.warn(
                f"autocast-onnx: {' and '.join(given)} do nothing beside customized_validate_func, as in the peer",
                CompatWarning,
                stacklevel=3,
            )
        return []
    return [
        f"rtol={_tolerance(1e-3 if rtol is None else rtol, 'rtol')}",
        f"atol={_tolerance(1e-5 if atol is None else atol, 'atol')}",
    ]


def _write_with_data(model: onnx.ModelProto, target: Path, location: str) -> None:
    """Write `model` to `target` with its tensors in `location` beside it: both written into a
    temporary folder beside the output and moved into place, so that a failure leaves neither
    half-written."""
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    if target.exists() or (folder / location).exists():
        warnings.warn(f"autocast-onnx: replacing {target} and its data file {location}", CompatWarning, stacklevel=3)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".autocast-onnx-") as tmp:
        staged = Path(tmp) / target.name
        onnx.save_model(model, staged, save_as_external_data=True, location=location, size_threshold=0)
        data = Path(tmp) / location
        if data.exists():
            os.replace(data, folder / location)
        os.replace(staged, target)


def _converted(source: onnx.ModelProto, planning: dict, check: str):
    """autocast_onnx.convert with the planning keywords the drop-in's keywords became, on a copy
    of `source` (never edited); returns the ConversionResult.

    The copy is made as the pipeline makes one, by encoding the model and reading it back. A model
    that protobuf cannot encode, over 2 GiB in memory (the peers, which edit it in place, convert
    it), takes the way a model file of that size takes: _through_files."""
    from .api import convert

    data = _encoded(source)
    if data is None:
        return _through_files(source, planning, check)
    try:
        copy = onnx.ModelProto.FromString(data)
    except DecodeError:  # nested deeper than protobuf reads back: the pipeline's own copy says so, in one line
        return convert(source, check=check, **planning)
    return convert(copy, copy=False, check=check, **planning)


def _encoded(model: onnx.ModelProto) -> bytes | None:
    """The model's encoding; None when protobuf refuses to encode it (over 2 GiB)."""
    try:
        return model.SerializeToString()
    except (EncodeError, ValueError):  # EncodeError (upb); ValueError from the C++ implementation
        return None


def _through_files(source: onnx.ModelProto, planning: dict, check: str):
    """Convert a model too big to encode: its main graph's initializers written as external data
    into a temporary folder beside the rest of the model (_save_external), that file converted as
    `autocast-onnx convert` converts a model of any size (pipeline.convert_file: the payloads stay
    on disk, the output is written with external data and checked from the files), and the result
    read back into memory, every payload in its tensor."""
    from .io import load_model
    from .pipeline import convert_file

    with tempfile.TemporaryDirectory(prefix="autocast-onnx-compat-") as tmp:
        path, out = Path(tmp) / "model.onnx", Path(tmp) / "converted.onnx"
        _save_external(source, path)
        try:
            result = convert_file(path, out, check=check, **planning)
            result.model = load_model(out).model
        except AutocastError as exc:
            if exc.where is None or tmp not in exc.where:
                raise
            said = (exc.what.replace(tmp, "<temporary folder>"), (exc.hint or "").replace(tmp, "<temporary folder>"))
            raise AutocastError(said[0], "model", said[1] or None) from None
    return result


# a smaller initializer stays in the model file (as io.EXTERNAL_MIN_BYTES keeps one in a saved model)
EXTERNAL_MIN_ELEMENTS = 1024


def _save_external(source: onnx.ModelProto, path: Path) -> None:
    """Write `source` to `path` with the raw payload of each main-graph initializer of
    EXTERNAL_MIN_ELEMENTS elements or more in `path.name + ".data"`, without encoding it whole or
    copying its payloads into another ModelProto: a copy of everything else, each payload written
    from the tensor itself."""
    lean = onnx.ModelProto()
    _copy_fields(lean, source, skip=("graph",))
    _copy_fields(lean.graph, source.graph, skip=("initializer",))
    data_name = path.name + ".data"
    offset = 0
    with open(path.parent / data_name, "wb") as fh:
        for tensor in source.graph.initializer:
            copy = lean.graph.initializer.add()
            stored = not tensor.HasField("raw_data") or tensor.data_location == onnx.TensorProto.EXTERNAL
            if stored or math.prod(tensor.dims) < EXTERNAL_MIN_ELEMENTS:
                copy.CopyFrom(tensor)
                continue
            _copy_fields(copy, tensor, skip=("raw_data", "data_location"))
            payload = tensor.raw_data
            fh.write(payload)
            copy.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", offset), ("length", len(payload))):
                copy.external_data.add(key=key, value=str(value))
            offset += len(payload)
            del payload
    data = _encoded(lean)
    if data is None:
        raise AutocastError(
            "the model is over 2 GiB in memory even without its main graph's initializers' raw payloads "
            "(tensors in Constant nodes, subgraphs or typed fields such as float_data), more than protobuf encodes",
            "model",
            "keep the large tensors as raw_data in the main graph's initializers (onnx.numpy_helper.from_array)",
        )
    path.write_bytes(data)


def _copy_fields(dst, src, skip: tuple) -> None:
    """Copy the fields of protobuf message `src` that are set into `dst`, but those in `skip`
    (never read: reading a bytes field copies it)."""
    for fd in src.DESCRIPTOR.fields:
        if fd.name in skip:
            continue
        if _is_repeated(fd):
            if len(getattr(src, fd.name)):
                getattr(dst, fd.name).extend(getattr(src, fd.name))
        elif src.HasField(fd.name):
            if fd.type == fd.TYPE_MESSAGE:
                getattr(dst, fd.name).CopyFrom(getattr(src, fd.name))
            else:
                setattr(dst, fd.name, getattr(src, fd.name))


def _is_repeated(fd) -> bool:
    """Whether a field is repeated (protobuf 5 and later deprecate `label` for `is_repeated`)."""
    repeated = getattr(fd, "is_repeated", None)
    return bool(repeated) if repeated is not None else fd.label == fd.LABEL_REPEATED


def _issue_warnings(result) -> None:
    """The plan's warnings as Python warnings, at the caller of the drop-in (which calls this)."""
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
    if given["force_fp16_inputs"] is not None and not isinstance(given["force_fp16_inputs"], (dict, list)):
        raise AutocastError(
            f"force_fp16_inputs={given['force_fp16_inputs']!r} is not a mapping of op types to input indices",
            "force_fp16_inputs",
            "drop it",
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
    outputs = list(model.graph.output)
    if any(v.type.WhichOneof("value") in (None, "tensor_type") and not v.type.tensor_type.elem_type for v in outputs):
        outputs = _typed_outputs(model)
    values = [v for v in model.graph.input if v.name not in constants] + outputs
    return list(dict.fromkeys(v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT))


def _typed_outputs(model: onnx.ModelProto) -> list:
    """The main graph's outputs as the conversion's load types them: an output declared without a
    type gets the one ONNX type inference gives it (graph/sanity.type_untyped_outputs, on a copy)."""
    from .graph.sanity import type_untyped_outputs

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    type_untyped_outputs(copy)
    return list(copy.graph.output)


def _io_options(model: onnx.ModelProto, keep_io_types) -> dict:
    """keep_io_types (True, False or a list of names) as autocast-onnx's keep_io_types and
    low_precision_io: the model's types kept, but for the float32 inputs and outputs that take
    the low type, named whole in one regex."""
    names = _float_io(model)
    if isinstance(keep_io_types, (bool, np.bool_)):
        lowered = [] if keep_io_types else names
    elif isinstance(keep_io_types, list) and all(isinstance(n, str) for n in keep_io_types):
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


def _materialised(**given) -> dict:
    """Each keyword's value with every iterable read into a list, once, before anything looks at
    it: a generator or an iterator that one check went through would be empty for the next, and
    its names would do nothing. A mapping gives its keys (force_fp16_inputs, a mapping itself, is
    kept as one); a string, bytes, None, a bool or any other value stays as it is, for the
    keyword's own check to accept or refuse."""
    out = {}
    for keyword, value in given.items():
        if isinstance(value, Mapping):
            value = dict(value) if keyword == "force_fp16_inputs" else list(value)
        elif isinstance(value, Iterable) and not isinstance(value, (str, bytes, bytearray)):
            value = list(value)
        out[keyword] = value
    return out


def _names(value, keyword: str) -> list[str]:
    """A list of names given to `keyword` (None: none), materialised already (_materialised)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AutocastError(f"{keyword}={value!r} is not a list of names", keyword, f'e.g. {keyword}=["Softmax"]')
    return value


def _block_ops(model: onnx.ModelProto, op_block_list, keyword: str = "op_block_list") -> list[str]:
    """op_block_list as exclude_ops: each op type as the model's nodes spell it, in any domain
    (the peers compare op_type alone). An op type no node has is dropped, as the peers' lists are
    meant for any model; one that no ONNX schema or runtime knows is refused as a misspelling."""
    wanted = _names(op_block_list, keyword)
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
                keyword,
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
