"""Regression tests for failures found by the property-based tests (tests/contracts/test_properties.py).

Each test is the shrunk failing example rewritten as a minimal explicit graph, asserting the
correct behaviour. See docs/robustness.md, "Fuzzing", for how they are made."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import F32, init, model, tensor
from onnx import TensorProto, helper

import autocast_onnx

PRECISIONS = ["fp16", "bf16"]


def node(op, inputs, outputs, name, **kw):
    return helper.make_node(op, inputs, outputs, name=name, **kw)


def branch(name, op, src, out):
    """A body of two nodes, op(src) -> Identity -> out: the intermediate has no declared type."""
    return helper.make_graph(
        [node(op, [src], [out + "_mid"], f"{name}_{op}"), node("Identity", [out + "_mid"], [out], f"{name}_Identity")],
        name,
        [],
        [tensor(out, F32, [2, 8])],
    )


# 1. A body that reads an outer tensor produced after an earlier control-flow node ------------------
def second_if_reads_late_outer_tensor():
    """main: If #1 (reads x), then MatMul -> mm, then If #2 whose branches read mm:
    then: Softmax(mm) -> Identity; else: Relu(mm) -> Identity.
    Found by the fuzzer as: If, Relu chain, If with a Softmax body."""
    nodes = [
        node(
            "If",
            ["cond"],
            ["first"],
            "if_first",
            then_branch=branch("then1", "Relu", "x", "a1"),
            else_branch=branch("else1", "Neg", "x", "b1"),
        ),
        node("MatMul", ["x", "W"], ["mm"], "matmul"),
        node(
            "If",
            ["cond"],
            ["second"],
            "if_second",
            then_branch=branch("then2", "Softmax", "mm", "a2"),
            else_branch=branch("else2", "Relu", "mm", "b2"),
        ),
        node("Add", ["first", "second"], ["y"], "join"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("W", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)), init("cond", np.array(True))],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("precision", PRECISIONS)
def test_body_reading_tensor_produced_after_an_earlier_if_is_typed(precision):
    """Observed: the nodes of If #2's branches are planned "unchanged" with reason and warning
    "unknown-type" (so the keep_fp32 Softmax is not planned fp32 and the Relu fed by the low
    MatMul does not follow it), although every tensor of the model has a known type. The index
    types a body when it is built, while the outer graph is still being read: once the outer graph
    has met a node with subgraphs it stops typing nodes on the way, so `mm` has no type yet when
    If #2's bodies are built, and the bodies, marked typed, are never typed again.
    Expected: no unknown-type warning; Softmax fp32 (in the portable plan: for CUDA its
    kernel computes in fp32 and it may run low, plan/kernel_io.py); Relu in the target type."""
    result = autocast_onnx.convert(second_if_reads_late_outer_tensor(), precision=precision, runtime="any")
    onnx.checker.check_model(result.model, full_check=True)
    assert not [w.message for w in result.plan.warnings if w.code == "unknown-type"]
    plans = {n.name: n for n in result.plan.nodes}
    assert plans["then2_Softmax"].precision == "fp32"
    assert plans["else2_Relu"].precision == precision
    for entry in result.plan.nodes:
        assert "unknown-type" not in [r.code for r in entry.reasons], entry.name


# 2. An initializer that is also a graph input, with keep_io_types=False -------------------------
def matmul_with_overridable_weight():
    """y = MatMul(x, W) where W is an initializer AND a graph input (a default value the caller
    may override; allowed since IR version 4). Found by the fuzzer as: Log, Relu chain, MatMul
    whose weight was also declared as a graph input."""
    m = model(
        [node("MatMul", ["x", "W"], ["y"], "matmul")],
        [tensor("x", F32, [2, 8]), tensor("W", F32, [8, 8])],
        [tensor("y", F32, [2, 8])],
        [init("W", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("precision", PRECISIONS)
def test_initializer_that_is_also_an_input_keeps_one_type_without_keep_io_types(precision):
    """Observed: with keep_io_types=False the graph input W is declared float16/bfloat16 while
    its initializer (the default value) keeps float32 data, so the model fails
    onnx.checker full_check ("Inferred elem type differs from existing elem type: (1) vs (10)")
    and ONNX Runtime refuses to load it ("Data in initializer 'W' has element type tensor(float)
    but usage of initializer in graph expects tensor(float16)"). The default check level
    ("basic") does not see it. Expected: the declared type of W and the type of its initializer
    agree (both converted, or both left fp32 with a cast), and the model passes the full check."""
    result = autocast_onnx.convert(matmul_with_overridable_weight(), precision=precision, keep_io_types=False)
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in result.model.graph.input}
    stored = {t.name: t.data_type for t in result.model.graph.initializer}
    assert declared["W"] == stored["W"], (declared["W"], stored["W"])
    onnx.checker.check_model(result.model, full_check=True)
    if precision == "fp16":
        import onnxruntime as ort

        x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
        feeds = {"x": x.astype(np.float16) if declared["x"] == TensorProto.FLOAT16 else x}
        sess = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, feeds)


# 3. EyeLike (keep_fp32) feeding a low-precision MatMul ---------------------------------------------
def matmul_by_eyelike():
    """y = MatMul(x, EyeLike(W)). Found by the fuzzer as a single EyeLike step."""
    m = model(
        [node("EyeLike", ["W"], ["eye"], "eyelike"), node("MatMul", ["x", "eye"], ["y"], "matmul")],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("W", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("precision", PRECISIONS)
def test_eyelike_stays_fp32_when_its_consumer_is_low(precision):
    """Observed: EyeLike, in category keep_fp32 (rules/default.toml: no float16 kernel in ONNX
    Runtime), is planned fp16/bf16 with reason "consumers-need" and gets dtype=FLOAT16: painting's
    pass 5 (type-setting nodes take the type their consumers need) overrides the keep_fp32 seed.
    ONNX Runtime's CPU provider then refuses the fp16 model ("Could not find an implementation for
    EyeLike(9)"). Expected: EyeLike planned fp32, its output cast for the MatMul, and the fp16
    model runs."""
    result = autocast_onnx.convert(matmul_by_eyelike(), precision=precision)
    onnx.checker.check_model(result.model, full_check=True)
    plans = {n.name: n for n in result.plan.nodes}
    assert plans["eyelike"].precision == "fp32"
    assert plans["matmul"].precision == precision
    if precision == "fp16":
        import onnxruntime as ort

        x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
        sess = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, x, atol=2e-3 * np.abs(x).max())


# 4. validate on a bf16 model whose inputs and outputs are bf16 (keep_io_types=False) -------------
@pytest.mark.parametrize("precision", PRECISIONS)
def test_validate_compares_a_model_with_low_precision_inputs_and_outputs(precision):
    """Observed (bf16 only): validate(model, converted) raises AutocastError "ONNX Runtime failed
    to run the model: Numpy_type 256 can't be converted to MLDataType. (check the input shapes
    (--dim) and values (--input-range))": it feeds the emulation model, whose inputs keep their
    declared bfloat16 type, NumPy (ml_dtypes) bfloat16 arrays, which ONNX Runtime's Python API
    does not take (nor does it return bfloat16 outputs). The message blames the user's inputs.
    Not a violation of the fuzzing property (only AutocastError escapes), but found by its
    statistics ("validate raised AutocastError" on every bf16 conversion with keep_io_types=False).
    Expected: the emulated comparison runs, as it does for fp16 and for bf16 with fp32 I/O."""
    from autocast_onnx.validate.core import ValidateOptions, validate

    m = model(
        [node("MatMul", ["x", "W"], ["y"], "matmul")],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("W", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )
    converted = autocast_onnx.convert(m, precision=precision, keep_io_types=False).model
    low = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[precision]
    assert converted.graph.input[0].type.tensor_type.elem_type == low
    report = validate(m, converted, ValidateOptions(speed=False))
    assert report["numerics"] == "emulate"
    assert report["passed"], report["outputs"]


# 5. The Mean output of LayerNormalization read by another node, no value_info -------------------
def layernorm_mean_joined_with_matmul():
    """y = Add(MatMul(x, W), Mean) with ln, Mean, InvStdDev = LayerNormalization(x, g, b), and no
    value_info in the model. Found by the fuzzer as: Gemm, LayerNormalization whose Mean output is
    added to its Y output, Relu chain (with --exclude-op Add)."""
    rng = np.random.default_rng(0)
    nodes = [
        node("LayerNormalization", ["x", "g", "b"], ["ln", "mean", "inv"], "ln", axis=-1),
        node("MatMul", ["x", "W"], ["mm"], "matmul"),
        node("Add", ["mm", "mean"], ["y"], "add"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [
            init("g", np.ones(8, np.float32)),
            init("b", np.zeros(8, np.float32)),
            init("W", rng.standard_normal((8, 8)).astype(np.float32)),
        ],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("exclude_ops", [(), ("Add",)])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_layernorm_mean_output_has_a_type(precision, exclude_ops):
    """Observed: node `add` is planned "unchanged" with reason and warning "unknown-type" ("has
    tensors of unknown type; it is left as it is"): the index gives LayerNormalization's outputs
    1 and 2 (Mean, InvStdDev: type parameter U, set by the stash_type attribute, default float)
    no type unless the model carries value_info for them. With --exclude-op Add the excluded node
    is not planned fp32 either. Expected: Mean and InvStdDev are float (stash_type 1), no
    unknown-type warning, and `add` (fed by the fp32 LayerNormalization) planned fp32."""
    result = autocast_onnx.convert(layernorm_mean_joined_with_matmul(), precision=precision, exclude_ops=exclude_ops)
    onnx.checker.check_model(result.model, full_check=True)
    assert not [w.message for w in result.plan.warnings if w.code == "unknown-type"]
    plans = {n.name: n for n in result.plan.nodes}
    assert plans["ln"].precision == "fp32"
    assert plans["matmul"].precision == precision
    assert plans["add"].precision == "fp32"


# 6. Out-of-range default values of initializers that are also graph inputs -------------------------
def masked_scores_with_overridable_constants(as_inputs: bool):
    """y = Softmax(MatMul(x, W) + M): W holds one value beyond fp16 (7e4), M is a -1e9 attention
    mask. With as_inputs, W and M are initializers AND graph inputs, as exporters wrote them before
    IR version 4 (torch.onnx.export(keep_initializers_as_inputs=True)). Found by the fuzzer as:
    Relu chain, MatMul by a weight with a 7e4 outlier that was also declared as a graph input, Tanh."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
    w[0, 0] = 7e4
    mask = np.zeros(8, np.float32)
    mask[5:] = -1e9
    nodes = [
        node("MatMul", ["x", "W"], ["mm"], "matmul"),
        node("Add", ["mm", "M"], ["masked"], "mask_add"),
        node("Softmax", ["masked"], ["y"], "softmax", axis=-1),
    ]
    inputs = [tensor("x", F32, [2, 8])] + ([tensor("W", F32, [8, 8]), tensor("M", F32, [8])] if as_inputs else [])
    m = model(nodes, inputs, [tensor("y", F32, [2, 8])], [init("W", w), init("M", mask)])
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("precision", PRECISIONS)
def test_data_rules_check_the_default_values_of_inputs(precision):
    """Observed (fp16): when W and M are also graph inputs, classify sends only initializers and
    Constant outputs through the data rules (value.kind == "initializer"), so neither 7e4 nor -1e9
    is seen: MatMul and the mask Add are planned fp16, W is cast to fp16 at run time (7e4 -> inf)
    and the emulated output is all NaN where the fp32 model's is finite. Without the graph-input
    declarations the same model keeps both nodes fp32 ("data-range"). Expected: the same plan
    either way (the default value is what runs unless the caller overrides it), and emulated
    output equal to fp32 within fp16 rounding."""
    import onnxruntime as ort

    from autocast_onnx.validate.emulate import emulation_model

    plain = autocast_onnx.convert(masked_scores_with_overridable_constants(False), precision=precision)
    m = masked_scores_with_overridable_constants(True)
    result = autocast_onnx.convert(m, precision=precision)
    onnx.checker.check_model(result.model, full_check=True)
    assert {n.name: n.precision for n in result.plan.nodes} == {n.name: n.precision for n in plain.plan.nodes}
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (ref,) = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (emu,) = ort.InferenceSession(
        emulation_model(result.model).SerializeToString(), so, providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(emu, ref, atol=2e-2)


# 7. A Loop body reading, through a converter cast, a float16 input the author cast to float ------
def loop_reads_author_cast_of_fp16_input():
    """z (float16 input) -> Cast(to=FLOAT) -> zf; Loop(2) whose body computes v + MatMul(zf, W).
    Found by the fuzzer as: a float16 graph input cast to float, Conv, nested Loops whose inner
    body concatenates the cast input."""
    body = helper.make_graph(
        [
            node("MatMul", ["zf", "W"], ["mm"], "body_matmul"),
            node("Add", ["v", "mm"], ["v_out"], "body_add"),
            node("Identity", ["c"], ["c_out"], "body_cond"),
        ],
        "body",
        [tensor("i", TensorProto.INT64, []), tensor("c", TensorProto.BOOL, []), tensor("v", F32, [2, 8])],
        [tensor("c_out", TensorProto.BOOL, []), tensor("v_out", F32, [2, 8])],
    )
    nodes = [
        node("Cast", ["z"], ["zf"], "to_float", to=TensorProto.FLOAT),
        node("Loop", ["trips", "", "zf"], ["y"], "loop", body=body),
    ]
    m = model(
        nodes,
        [tensor("z", TensorProto.FLOAT16, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [
            init("W", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)),
            init("trips", np.array(2, np.int64)),
        ],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


def test_converted_loop_reading_a_cast_back_to_fp16_runs():
    """Observed: the converter gives the body's MatMul its fp16 operand as zf_fp16 =
    Cast(Cast(z, FLOAT), FLOAT16), defined in the main graph and read by the body as an outer
    value. The model is valid (onnx.checker passes) and the fp32 original runs, but ONNX Runtime
    1.31 fails at run time: "Non-zero status code returned while running MatMul node ... Missing
    Input: zf_fp16". Its pass that removes a pair of casts that undo each other (fp16 -> fp32 ->
    fp16 is exact) does not rename the implicit input of the Loop body; it does the same to any
    such pair (float -> float -> float, float -> double -> float) read inside a body, even with
    optimizations disabled. Expected: the converted model runs on ONNX Runtime's CPU provider
    (e.g. the converter feeds the body the float16 tensor z itself instead of casting the exact
    float copy of z back to float16) and matches the fp32 model."""
    import onnxruntime as ort

    m = loop_reads_author_cast_of_fp16_input()
    result = autocast_onnx.convert(m, precision="fp16")
    onnx.checker.check_model(result.model, full_check=True)
    z = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float16)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    (ref,) = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"z": z})
    (out,) = ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"z": z}
    )
    np.testing.assert_allclose(out, ref, atol=5e-2 * max(1.0, float(np.abs(ref).max())))


# 8. An out-of-range constant that reaches a low-precision op through a clear op ------------------
@pytest.mark.parametrize("via", ["Transpose", "Identity", "Reshape"])
def test_out_of_range_weight_through_a_clear_op_keeps_the_matmul_fp32(via):
    """y = MatMul(x, via(W)) where W holds one value beyond the fp16 range (7e4). Found by
    validate's generated inputs during the fuzzing (NaN in an attention output): a weight of the
    activations' shape with a 7e4 outlier, Transpose, MatMul, scaled and masked scores, Softmax.
    Observed: the data rule keeps the clear op fp32 ("data-range"), but the MatMul it feeds is
    planned fp16, so its operand is cast to fp16 at run time (7e4 -> inf) and the emulated output
    is inf/NaN where the fp32 model's is finite. With MatMul(x, W) the MatMul itself is kept fp32.
    Expected: a constant that only passes through clear ops (Transpose, Identity, Reshape, ...) is
    judged by the data rules at the op that computes with it: the MatMul stays fp32, and the
    emulated output is finite and matches fp32."""
    import onnxruntime as ort

    from autocast_onnx.validate.emulate import emulation_model

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
    w[0, 0] = 7e4
    attrs = {"perm": [1, 0]} if via == "Transpose" else {}
    inputs = ["W", "shape"] if via == "Reshape" else ["W"]
    nodes = [node(via, inputs, ["w_moved"], "move", **attrs), node("MatMul", ["x", "w_moved"], ["y"], "matmul")]
    m = model(
        nodes,
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("W", w), init("shape", np.array([8, 8], np.int64))],
    )
    onnx.checker.check_model(m, full_check=True)
    result = autocast_onnx.convert(m, precision="fp16")
    onnx.checker.check_model(result.model, full_check=True)
    assert {n.name: n.precision for n in result.plan.nodes}["matmul"] == "fp32"
    x = rng.standard_normal((2, 8)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (ref,) = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (emu,) = ort.InferenceSession(
        emulation_model(result.model).SerializeToString(), so, providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})
    assert np.isfinite(ref).all() and np.isfinite(emu).all()
    np.testing.assert_allclose(emu, ref, rtol=1e-2, atol=1e-2 * float(np.abs(ref).max()))


# 9. An out-of-range constant that enters a Loop/Scan body as a loop-carried or scanned input -----
def body_matmul_on_constant_entering_a_body(kind):
    """Loop(1 trip) carrying S, or Scan over the rows of S; the body computes MatMul(value, W)
    and returns it. S (an initializer of the activations' shape) holds one value beyond fp16
    (7e4); the products stay within fp16 (|y| <= 1.3e4)."""
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 8)).astype(np.float32)
    s[0, 0] = 7e4
    w = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
    if kind == "Loop":
        body = helper.make_graph(
            [
                node("MatMul", ["v", "W"], ["mm"], "body_matmul"),
                node("Identity", ["mm"], ["v_out"], "body_out"),
                node("Identity", ["c"], ["c_out"], "body_cond"),
            ],
            "body",
            [tensor("i", TensorProto.INT64, []), tensor("c", TensorProto.BOOL, []), tensor("v", F32, [2, 8])],
            [tensor("c_out", TensorProto.BOOL, []), tensor("v_out", F32, [2, 8])],
        )
        nodes = [node("Loop", ["trips", "", "S"], ["y"], "loop", body=body)]
    else:
        body = helper.make_graph(
            [
                node("MatMul", ["row", "W"], ["mm"], "body_matmul"),
                node("Identity", ["mm"], ["out"], "body_out"),
                node("Identity", ["st"], ["st_out"], "body_state"),
            ],
            "body",
            [tensor("st", F32, [8]), tensor("row", F32, [8])],
            [tensor("st_out", F32, [8]), tensor("out", F32, [8])],
        )
        nodes = [node("Scan", ["s0", "S"], ["st_final", "y"], "scan", body=body, num_scan_inputs=1)]
    m = model(
        nodes,
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("S", s), init("W", w), init("trips", np.array(1, np.int64)), init("s0", np.zeros(8, np.float32))],
    )
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("kind", ["Loop", "Scan"])
def test_out_of_range_constant_entering_a_body_keeps_its_consumer_fp32(kind):
    """Found by the fuzzer as: Scan over a weight of the activations' shape holding 7e4, Tanh
    (shrunk; the Loop form is the same defect). Observed: the body's MatMul is planned fp16 and
    its operand, the constant's slice or copy, is cast to fp16 inside the body (7e4 -> inf): the
    emulated output is +-inf where the fp32 model gives values within +-1.3e4. The data rules see
    only constants that feed a node directly; here the constant reaches the MatMul through the
    Loop's loop-carried input (the Scan's scanned input). Expected: the body's MatMul stays fp32
    (like MatMul(S, W) in the main graph, which the data rule keeps fp32) and the emulated output
    matches fp32."""
    import onnxruntime as ort

    from autocast_onnx.validate.emulate import emulation_model

    m = body_matmul_on_constant_entering_a_body(kind)
    result = autocast_onnx.convert(m, precision="fp16")
    onnx.checker.check_model(result.model, full_check=True)
    assert {n.name: n.precision for n in result.plan.nodes}["body_matmul"] == "fp32"
    x = np.zeros((2, 8), np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (ref,) = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (emu,) = ort.InferenceSession(
        emulation_model(result.model).SerializeToString(), so, providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})
    assert np.isfinite(ref).all() and np.isfinite(emu).all()
    np.testing.assert_allclose(emu, ref, rtol=1e-2, atol=1e-2 * float(np.abs(ref).max()))
