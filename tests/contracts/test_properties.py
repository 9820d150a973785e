"""Property-based tests: random valid fp32 models (tests/strategies.py) through convert, lint and
validate. See docs/robustness.md, "Fuzzing".

For every generated model and a drawn precision (fp16/bf16), keep_io_types and exclude_ops,
`convert` either raises AutocastError (one line) or returns a model that
  * passes onnx.checker.check_model(full_check=True);
  * loads and runs on ONNX Runtime's CPU provider (fp16; the CPU provider has no bf16 kernels,
    so bf16 models are checked through the checker and emulation only);
  * keeps every keep_fp32 node (and every node of an excluded op type) in fp32: plan precision
    "fp32", and every float tensor it reads or writes is float32 in the converted model;
  * matches the fp32 model under faithful low-precision emulation (validate.emulate, run on the
    CPU provider with graph optimizations off): max|emulated - reference| <= TOLERANCE *
    max(1, max|reference|) for every output whose reference is finite;
  * converts to itself: converting it again adds no cast and gives the same bytes.
`lint` on the model and on its conversion, and `validate(model, converted)`, raise nothing but
AutocastError, and `lint` of the conversion reports no error (the converter and the linter share
one judgement of unsafe constants: autocast_onnx/hazards.py).

Profiles (hypothesis settings registered in tests/strategies.py, FUZZ): "quick" (the default, CI: 25 examples per
test, derandomized so every run tests the same graphs) and "long" (1000 examples per test,
random):

    AUTOCAST_ONNX_FUZZ=long .venv/bin/python -m pytest tests/contracts/test_properties.py --hypothesis-show-statistics

AUTOCAST_ONNX_FUZZ_EXAMPLES=N overrides the number of examples of either profile.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from strategies import FUZZ, onnx_models

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.graph import build_index
from autocast_onnx.lint.engine import LintOptions, lint
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.emulate import emulation_model

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
MIXABLE = {F32, F16, BF16}

# Largest error allowed, relative to max(1, max|reference|) of each output. Every pool tensor of
# a generated graph is bounded by strategies.LIMIT, so each rounding to fp16 costs at most
# LIMIT * 2**-11 = 4e-3 absolute (bf16: 2**-8 relative, 3e-2 absolute) and a dozen steps stay far
# under these limits; a converter bug (a keep_fp32 op run low, an overflowed constant, a lost
# cast, a wrong branch) shows up as an error of order 1 or as inf/NaN.
TOLERANCE = {"fp16": 5e-2, "bf16": 1e-1}

precisions = st.sampled_from(["fp16", "bf16"])
keep_io = st.sampled_from([True, True, False])
# --exclude-op: usually none; sometimes ops of every category
exclude = st.one_of(
    st.just(()),
    st.just(()),
    st.just(()),
    st.lists(
        st.sampled_from(
            [
                "MatMul",
                "Gemm",
                "Conv",
                "Add",
                "Mul",
                "Relu",
                "Where",
                "Transpose",
                "Reshape",
                "Concat",
                "Softmax",
                "LayerNormalization",
            ]
        ),
        min_size=1,
        max_size=2,
        unique=True,
    ).map(tuple),
)


# ---- helpers -----------------------------------------------------------------------------
FEED_SUFFIX = "__fp32_feed"


def session(m: onnx.ModelProto, optimize: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


NP_TYPE = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def feeds_for(sess, feeds: dict) -> dict:
    """The feeds a session takes: each value in the element type the model declares for it (a
    model converted with keep_io_types=False can take float16 where the original took float);
    inputs renamed by fp32_io take the value of the original input."""
    out = {}
    for i in sess.get_inputs():
        value = feeds[i.name.removesuffix(FEED_SUFFIX)]
        out[i.name] = value.astype(NP_TYPE[i.type]) if i.type in NP_TYPE else value
    return out


def fp32_io(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with fp32 graph inputs/outputs wherever it declares fp16/bf16 (NumPy has no
    bf16 and ONNX Runtime takes no ml_dtypes arrays): a Cast from a new fp32 input NAME__fp32_feed,
    a Cast to a new fp32 output. Casting the fp32 feed to the low type is the rounding the caller would do."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    head, tail = [], []
    for vi in g.input:
        t = vi.type.tensor_type.elem_type
        if t in (F16, BF16):
            wide = vi.name + FEED_SUFFIX
            head.append(helper.make_node("Cast", [wide], [vi.name], to=t, name=wide + "_cast"))
            vi.name = wide
            vi.type.tensor_type.elem_type = F32
    for vi in g.output:
        t = vi.type.tensor_type.elem_type
        if t in (F16, BF16):
            wide = vi.name + "__fp32_out"
            tail.append(helper.make_node("Cast", [vi.name], [wide], to=F32, name=wide + "_cast"))
            vi.name = wide
            vi.type.tensor_type.elem_type = F32
    nodes = head + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)
    return out


def all_nodes(graph):
    """Every NodeProto of a graph and of its bodies."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from all_nodes(sub)


def data_tensors(node) -> list:
    """The node's inputs and outputs whose schema type is its first input's (LayerNormalization's
    Mean and InvStdDev are of type U, float whatever the data's type, so they are not among them)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, domain=node.domain)
    except onnx.defs.SchemaError:
        return list(node.input) + list(node.output)
    formal = [p.type_str for p in schema.inputs][:1]
    if not formal:
        return list(node.input) + list(node.output)

    def tied(params, names):
        variadic = params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        out = []
        for k, name in enumerate(names):
            param = params[min(k, len(params) - 1)] if variadic or k < len(params) else None
            if param is not None and param.type_str == formal[0]:
                out.append(name)
        return out

    return tied(schema.inputs, node.input) + tied(schema.outputs, node.output)


def tensor_types(m: onnx.ModelProto) -> dict:
    """tensor name -> elem type, every graph, after strict ONNX shape inference (independent of
    autocast-onnx's own typing). Tensor names of generated and converted models are unique
    across graphs, so one dict serves all scopes."""
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {}

    def walk(graph):
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in graph.initializer:
            types[t.name] = t.data_type
        for node in graph.node:
            for a in node.attribute:
                if node.op_type == "Constant" and a.name == "value":
                    types[node.output[0]] = a.t.data_type
                elif node.op_type == "Constant" and a.name in ("value_float", "value_floats"):
                    types[node.output[0]] = F32
                elif a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        walk(sub)

    walk(inferred.graph)
    return types


def model_text(m: onnx.ModelProto) -> str:
    """The model in ONNX text form, long tensor values elided (printed for a failing example)."""
    return re.sub(r"\{[-+0-9.,eE naif]{60,}\}", "{...}", onnx.printer.to_text(m))


def assert_one_line(exc: AutocastError) -> None:
    line = exc.line()
    assert line and "\n" not in line, f"AutocastError.line() is not one line: {line!r}"


def convert_or_error(model, precision, keep_io_types, exclude_ops=()):
    """The ConversionResult, or None when convert raised AutocastError (checked to be one line)."""
    try:
        return autocast_onnx.convert(model, precision=precision, keep_io_types=keep_io_types, exclude_ops=exclude_ops)
    except AutocastError as exc:
        assert_one_line(exc)
        event("convert raised AutocastError")
        note(f"AutocastError: {exc.line()}")
        return None


# ---- properties --------------------------------------------------------------------------
@FUZZ
@given(g=onnx_models(), precision=precisions, keep_io_types=keep_io, exclude_ops=exclude)
def test_convert_properties(g, precision, keep_io_types, exclude_ops):
    model = g.model
    note(f"steps: {g.steps}")
    note(model_text(model))
    # The strategy's promise: a valid model that runs.
    onnx.checker.check_model(model, full_check=True)
    ref_sess = session(model)
    ref_names = [o.name for o in ref_sess.get_outputs()]
    reference = ref_sess.run(None, g.feeds)

    result = convert_or_error(model, precision, keep_io_types, exclude_ops)
    if result is None:
        return
    converted = result.model
    event(f"{precision}, keep_io_types={keep_io_types}" + (", exclude_ops" if exclude_ops else ""))

    # 1. The converted model passes the full checker.
    onnx.checker.check_model(converted, full_check=True)

    # 2. It loads and runs on the CPU provider (fp16; the CPU provider has no bf16 kernels).
    if precision == "fp16":
        sess = session(converted)
        outs = sess.run(None, feeds_for(sess, g.feeds))
        assert [o.shape for o in outs] == [r.shape for r in reference]

    # 3. keep_fp32 nodes (and nodes of --exclude-op types) stay fp32, with fp32 tensors around them.
    #    Plan entry ids are positions in the converter's index of the model; the index is used
    #    here only to find each entry's NodeProto (unnamed nodes included), never for types.
    before, after = tensor_types(model), tensor_types(converted)
    protos = [n.proto for n in build_index(model).nodes]
    fp32_ops = {(e.domain, e.op_type) for e in result.plan.nodes if e.category == "keep_fp32"}
    fp32_ops |= {("", op) for op in exclude_ops}
    #    The one exception is pass 6 (plan/kernel_io.py): a keep_fp32 node whose runtime kernel
    #    computes in fp32 anyway, between low-precision neighbours, is planned low with the reason
    #    "kernel-fp32" (or "fast-plan"); such a node must then read and write no fp32 float tensor.
    kernel_low = set()
    for entry in result.plan.nodes:
        if (entry.domain, entry.op_type) not in fp32_ops or entry.category == "control_flow":
            continue
        names = [n for n in list(protos[entry.id].input) + list(protos[entry.id].output) if n]
        if entry.reasons and entry.reasons[-1].code in ("kernel-fp32", "fast-plan"):
            assert entry.category == "keep_fp32" and entry.precision == precision, entry
            kernel_low.update(protos[entry.id].output)
            continue
        if any(before.get(n) in MIXABLE for n in names):
            assert entry.precision == "fp32", (
                f"{entry.category} node {entry.label} ({entry.op_type}) planned {entry.precision}"
            )
    for n in all_nodes(converted.graph):
        if kernel_low.intersection(n.output):
            fp32 = [t for t in data_tensors(n) if t and after.get(t) == F32]
            assert not fp32, f"kernel-fp32 node {n.name or n.op_type} has fp32 tensors {fp32}"
            continue
        if (n.domain, n.op_type) in fp32_ops:
            wrong = [
                (t, onnx.helper.tensor_dtype_to_string(after[t]))
                for t in list(n.input) + list(n.output)
                if t and after.get(t) in MIXABLE and after[t] != F32
            ]
            assert not wrong, f"fp32 node {n.name or n.op_type} ({n.op_type}) has non-fp32 tensors {wrong}"

    # 4. Under emulation it matches the fp32 model within low-precision tolerance.
    emulated = fp32_io(emulation_model(converted))
    emu_sess = session(emulated, optimize=False)
    outputs = emu_sess.run(None, feeds_for(emu_sess, g.feeds))
    assert len(outputs) == len(ref_names)
    clamped = bool(result.plan.clamp_initializers) or result.stats.clamped_values > 0
    for name, ref, out in zip(ref_names, reference, outputs):
        assert out.shape == ref.shape, name
        if ref.dtype.kind != "f":
            np.testing.assert_array_equal(out, ref, err_msg=name)
            continue
        if not np.all(np.isfinite(ref)):
            event("output skipped: non-finite reference")
            continue
        if clamped:
            event("output skipped: the plan clamps constants")
            continue
        scale = max(1.0, float(np.abs(ref).max()))
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        error = float(diff.max()) / scale if np.all(np.isfinite(diff)) else float("inf")
        note(f"output {name}: error {error:.3g} (max|ref| {scale:.3g})")
        assert error <= TOLERANCE[precision], (
            f"output {name}: emulated {precision} differs from fp32 by {error:.3g} x max(1, max|ref|) "
            f"(tolerance {TOLERANCE[precision]}); worst element at "
            f"{np.unravel_index(np.argmax(np.nan_to_num(diff, nan=np.inf)), diff.shape) if diff.size else ()}"
        )

    # 5. Converting again changes nothing.
    again = autocast_onnx.convert(converted, precision=precision, keep_io_types=keep_io_types, exclude_ops=exclude_ops)
    assert again.stats.casts_added == 0, f"second conversion added {again.stats.casts_added} casts"
    assert again.model.SerializeToString() == converted.SerializeToString(), "second conversion changed the model"


@FUZZ
@given(g=onnx_models(), precision=precisions, keep_io_types=keep_io)
def test_lint_and_validate_raise_only_autocast_errors(g, precision, keep_io_types):
    note(f"steps: {g.steps}")
    model = g.model
    for label, m, options in (("model", model, LintOptions(precision=precision)), ("converted", None, None)):
        if label == "converted":
            result = convert_or_error(model, precision, keep_io_types)
            if result is None:
                return
            m, options = result.model, LintOptions()
        try:
            linted = lint(m, options)
        except AutocastError as exc:
            assert_one_line(exc)
            event(f"lint({label}) raised AutocastError")
            continue
        if label == "converted":
            # converter and linter share one judgement (hazards.py): a default conversion lints clean
            errors = [f"{d.code} {d.node}: {d.message}" for d in linted.diagnostics if d.severity == "error"]
            assert not errors, errors
    try:
        # the generated graphs hold the batch size in constants (Reshape shapes, ...): give it
        symbolic = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
        report = validate(model, result.model, ValidateOptions(speed=False, dims=dict.fromkeys(symbolic, 2)))
        event(f"validate passed={report['passed']}")
    except AutocastError as exc:
        assert_one_line(exc)
        event("validate raised AutocastError")


def test_profiles_are_registered():
    """The quick profile is what CI runs; the long one is documented in docs/robustness.md."""
    quick = settings.get_profile("autocast_onnx_quick")
    long = settings.get_profile("autocast_onnx_long")
    assert quick.max_examples <= 50 and quick.derandomize and quick.deadline is None
    assert long.max_examples >= 1000


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
