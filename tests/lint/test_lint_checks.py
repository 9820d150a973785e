"""Lint checks (rules/lint.toml, autocast_onnx/lint): for every check, a minimal model that
triggers it and one that does not; the fields of each finding; prospective linting of fp32
models (protected findings are info); converted models; suppressions and selection.

The "bad" models are built directly in fp16, the way a naive converter leaves them: constants
stored with np.float16 (so 1e5 and -1e9 are already inf, 1e-12 is already 0), or kept fp32 behind
a Cast. The "good" models still contain fp16 tensors, so they are linted in "actual" mode too (a
pure fp32 model is linted prospectively and reports every risky node as info)."""

from __future__ import annotations

from pathlib import Path

import helpers as H
import lint_helpers as L
import numpy as np
import pytest
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.lint import LintOptions, lint
from autocast_onnx.lint.engine import METADATA_KEY, Suppression
from autocast_onnx.plan.options import PlanOptions

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "examples" / "models").glob("*.onnx"))
BERT = ROOT / "examples" / "models" / "bert_tiny.onnx"
F32, F16, BF16 = H.F32, H.F16, H.BF16
FP16_TINY = 2.0**-25  # nonzero magnitudes below this become 0 in fp16


# ---- catalog -----------------------------------------------------------------------------
def test_catalog_has_the_checks_under_test():
    for code in (
        "AC101",
        "AC102",
        "AC103",
        "AC104",
        "AC105",
        "AC201",
        "AC202",
        "AC203",
        "AC204",
        "AC301",
        "AC302",
        "AC303",
        "AC401",
        "AC402",
        "AC403",
        "AC901",
    ):
        assert code in L.CATALOG
    assert "EyeLike" in L.CATALOG["AC401"].params["ops"]
    assert "Mean" in L.CATALOG["AC401"].params["ops"]
    assert "Add" not in L.CATALOG["AC401"].params["ops"]
    assert L.CATALOG["AC402"].params["multiple"] == 8
    assert L.CATALOG["AC403"].params["max_depth"] < 9000


# ---- AC1xx and AC401: ops computed in low precision ---------------------------------------
OP_FAMILY = [
    # (code, op, domain, shape, attrs, extras)
    ("AC101", "Softmax", "", (2, 8), {"axis": -1}, ()),
    ("AC101", "LogSoftmax", "", (2, 8), {"axis": -1}, ()),
    ("AC101", "BiasSoftmax", "com.microsoft", (2, 8), {"axis": 1}, (("bias", np.zeros((2, 8))),)),
    (
        "AC102",
        "LayerNormalization",
        "",
        (2, 8),
        {"axis": -1, "epsilon": 1e-5},
        (("gamma", np.ones(8)), ("beta", np.zeros(8))),
    ),
    (
        "AC102",
        "BatchNormalization",
        "",
        (2, 8),
        {"epsilon": 1e-9},  # a variance stored as 0 beside a tiny epsilon: it flushed (plan/batchnorm.py)
        (("scale", np.ones(8)), ("bias", np.zeros(8)), ("mean", np.zeros(8)), ("var", np.zeros(8))),
    ),
    ("AC102", "InstanceNormalization", "", (2, 8, 4), {}, (("scale", np.ones(8)), ("bias", np.zeros(8)))),
    ("AC103", "ReduceSum", "", (2, 8), {"keepdims": 1}, ()),
    ("AC103", "ReduceMean", "", (2, 8), {"axes": [-1]}, ()),
    ("AC103", "CumSum", "", (2, 8), {}, (("axis", np.array(1, np.int64)),)),
    ("AC104", "Exp", "", (2, 8), {}, ()),
    ("AC104", "Log", "", (2, 8), {}, ()),
    ("AC104", "Sqrt", "", (2, 8), {}, ()),
    ("AC104", "Reciprocal", "", (2, 8), {}, ()),
    ("AC104", "Pow", "", (2, 8), {}, (("three", np.array(3.0)),)),
    ("AC105", "SoftmaxCrossEntropyLoss", "", (2, 5), {}, (("labels", np.array([1, 3], np.int64)),)),
    ("AC105", "NegativeLogLikelihoodLoss", "", (2, 5), {}, (("labels", np.array([1, 3], np.int64)),)),
    ("AC401", "EyeLike", "", (4, 4), {}, ()),
    ("AC401", "Mean", "", (2, 8), {}, (("other", np.ones((2, 8))),)),
    ("AC401", "Sinh", "", (2, 8), {}, ()),
]


def _op_model(case, low):
    _code, op, domain, shape, attrs, extras = case
    opsets = [(domain, 1)] if domain else ()
    return L.wrap_op(
        op, shape=shape, attrs=attrs, domain=domain, extras=extras, low=low, name=f"n/{op}", extra_opsets=opsets
    )


@pytest.mark.parametrize("case", OP_FAMILY, ids=[f"{c[0]}-{c[1]}" for c in OP_FAMILY])
def test_op_family_bad(case):
    code, op = case[0], case[1]
    m = _op_model(case, low=True)
    diags = L.findings(m, code)
    assert len(diags) == 1, [(d.code, d.node) for d in diags]
    L.assert_diag(diags[0], code, node=f"n/{op}", op_type=op, words=(op, "computed in fp16"))
    assert diags[0].node_index == 0
    assert diags[0].model is None
    # The same finding in the default selection.
    full = lint(m)
    assert full.mode == "actual" and full.precision == "fp16"
    assert any(d.code == code and d.node == f"n/{op}" for d in full.diagnostics)


@pytest.mark.parametrize("case", OP_FAMILY, ids=[f"{c[0]}-{c[1]}" for c in OP_FAMILY])
def test_op_family_good_when_computed_in_fp32(case):
    code = case[0]
    m = _op_model(case, low=False)
    result = L.run_check(m, code)
    assert result.mode == "actual"
    assert code not in L.codes(result)
    assert code not in L.codes(lint(m))


def test_ac401_add_in_fp16_is_fine():
    m = L.wrap_op("Add", extras=(("other", np.ones((2, 8))),), name="n/Add")
    assert lint(m).mode == "actual"
    assert L.findings(m, "AC401") == []


def test_ac101_inside_an_if_body_names_the_subgraph():
    then_g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["t"], name="inner_softmax", axis=-1)],
        "then",
        [],
        [H.tensor("t", F16, [2, 8])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="inner_identity")], "else", [], [H.tensor("e", F16, [2, 8])]
    )
    nodes = [
        helper.make_node("If", ["c"], ["r"], name="branch", then_branch=then_g, else_branch=else_g),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    m = H.model(nodes, [H.tensor("c", TensorProto.BOOL, []), H.tensor("x", F16, [2, 8])], [H.tensor("y", F32, [2, 8])])
    H.check(m)
    diags = L.findings(m, "AC101")
    assert len(diags) == 1
    L.assert_diag(
        diags[0],
        "AC101",
        node="inner_softmax",
        op_type="Softmax",
        graph="main/branch.then_branch",
        words=("Softmax", "fp16"),
    )
    assert diags[0].node_index == 0


# ---- AC102: decomposed LayerNorm ----------------------------------------------------------
def test_ac102_sees_through_a_decomposed_layernorm_in_fp16():
    m = L.layernorm_decomposed(1e-5)
    H.check(m)
    diags = L.findings(m, "AC102")
    assert [d.node for d in diags] == L.LN_NODES
    for d, op in zip(diags, L.LN_OPS):
        L.assert_diag(d, "AC102", node=d.node, op_type=op, words=("decomposed LayerNorm", "fp16"))


def test_ac102_decomposed_layernorm_in_fp32_is_fine():
    m = L.layernorm_decomposed(1e-5, dtype=F32, fp16_input=True)
    H.check(m)
    result = L.run_check(m, "AC102")
    assert result.mode == "actual"
    assert "AC102" not in L.codes(result)


def test_ac102_fused_layernorm_in_fp32_is_fine():
    m = L.layernorm_fused(1e-12, dtype=F32)
    # make it an "actual" model: an fp16 side output
    m.graph.node.append(helper.make_node("Cast", ["x"], ["x16"], name="side", to=F16))
    m.graph.node.append(helper.make_node("Cast", ["x16"], ["x32"], name="side_back", to=F32))
    m.graph.output.append(H.tensor("x32", F32, [2, 8]))
    result = lint(m, LintOptions(select=["AC102", "AC204"]))
    assert result.mode == "actual"
    assert not {"AC102", "AC204"} & L.codes(result)


# ---- AC201: constants out of range --------------------------------------------------------
def _scaled(c_storage, c):
    """x (fp16) * c -> Cast -> y. c_storage: "fp16" (np.float16(c) initializer), "fp32-cast" (fp32
    initializer -> Cast(FLOAT16)), "fp32-compute" (the Mul in fp32)."""
    nodes, inits = [], []
    a, b = "x", "c"
    if c_storage == "fp16":
        inits.append(H.init("c", L.f16(np.full((8,), c))))
    elif c_storage == "fp32-cast":
        inits.append(H.init("c32", np.full((8,), c, np.float32)))
        nodes.append(helper.make_node("Cast", ["c32"], ["c"], name="c_cast", to=F16))
    else:
        inits.append(H.init("c", np.full((8,), c, np.float32)))
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], name="to_fp32", to=F32))
        a = "x32"
    out = "y" if c_storage == "fp32-compute" else "r"
    nodes.append(helper.make_node("Mul", [a, b], [out], name="scale_mul"))
    if out == "r":
        nodes.append(helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32))
    m = H.model(nodes, [H.tensor("x", F16, [2, 8])], [H.tensor("y", F32, [2, 8])], inits)
    H.check(m)
    return m


def test_ac201_leaves_an_inf_in_an_fp16_constant_to_the_fp32_original():
    # np.float16(1e5) is inf, and so is np.float16(-inf): stored in fp16 the two cannot be told
    # apart, and an infinity converts exactly (hazards.py), so only the fp32 constant is judged.
    assert L.findings(_scaled("fp16", 1e5), "AC201") == []
    assert len(L.findings(_scaled("fp32-cast", 1e5), "AC201")) == 1


@pytest.mark.parametrize("c", [1e5, 65520.0])  # 65520 is the first value that rounds to inf in fp16
def test_ac201_fp32_constant_cast_to_fp16(c):
    m = _scaled("fp32-cast", c)
    diags = L.findings(m, "AC201")
    assert len(diags) == 1
    d = diags[0]
    L.assert_diag(d, "AC201", node="c_cast", op_type="Cast", words=("'c32'", "fp16", f"{c:.4g}"))
    assert d.value == pytest.approx(c)
    assert d.tensor == "c32"


@pytest.mark.parametrize(
    "storage,c", [("fp16", 1e4), ("fp16", 65504.0), ("fp32-cast", 6e4), ("fp32-cast", 65519.0), ("fp32-compute", 1e5)]
)
def test_ac201_good(storage, c):
    m = _scaled(storage, c)
    result = L.run_check(m, "AC201")
    assert result.mode == "actual"
    assert "AC201" not in L.codes(result)


# ---- AC202: weights that flush to zero ----------------------------------------------------
def _weights(w32, cast=True):
    """x (fp16) @ W; W is an fp32 initializer cast to fp16 (cast=True) or used by an fp32 MatMul."""
    if cast:
        nodes = [
            helper.make_node("Cast", ["w32"], ["w"], name="w_cast", to=F16),
            helper.make_node("MatMul", ["x", "w"], ["r"], name="mm"),
            helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
        ]
    else:
        nodes = [
            helper.make_node("Cast", ["x"], ["x32"], name="to_fp32", to=F32),
            helper.make_node("MatMul", ["x32", "w32"], ["y"], name="mm"),
        ]
    m = H.model(nodes, [H.tensor("x", F16, [2, 8])], [H.tensor("y", F32, [2, 8])], [H.init("w32", w32)])
    H.check(m)
    return m


def test_ac202_weights_that_flush_in_fp16():
    w = np.ones((8, 8), np.float32)
    w[0, :4] = 1e-9
    diags = L.findings(_weights(w), "AC202")
    assert len(diags) == 1
    d = diags[0]
    L.assert_diag(d, "AC202", node="w_cast", op_type="Cast", words=("4 of 64", "'w32'", "fp16"))
    assert d.value == pytest.approx(4 / 64)
    assert d.tensor == "w32"


@pytest.mark.parametrize("cast", [True, False])
def test_ac202_good(cast):
    w = np.full((8, 8), 1e-3, np.float32)
    w[0, 0] = 0.0  # exact zeros do not flush
    if not cast:
        w[1, :4] = 1e-9  # tiny values are fine in an fp32 MatMul
    m = _weights(w, cast)
    result = L.run_check(m, "AC202")
    assert result.mode == "actual"
    assert "AC202" not in L.codes(result)


# ---- AC203: masking constants ------------------------------------------------------------
# The shared judgement (hazards.py): a mask is reported when it has no headroom in fp16, that is
# when its fp32 value becomes -inf (-3.4e38, -1e9) or the lowest finite value (-65504), or when it
# is stored in fp16 at -65504. An infinity converts exactly and is never reported.
FP32_STORAGES = ["fp32-cast", "fp32-where-cast"]
FP16_STORAGES = ["fp16-constant", "fp16-initializer"]


@pytest.mark.parametrize("storage", FP32_STORAGES)
@pytest.mark.parametrize(
    "mask", [-3.4028235e38, -1e9, -65504.0, -65490.0], ids=["f32-lowest", "-1e9", "-65504", "-65490"]
)
def test_ac203_fp32_mask_reaching_fp16(mask, storage):
    m = L.attention(mask, storage)
    H.check(m)
    diags = L.findings(m, "AC203")
    assert len(diags) == 1, [(d.node, d.value) for d in diags]
    d = diags[0]
    # the fp32 constant reaches the fp16 Add through a Cast (and, for fp32-where-cast, a Where)
    tensor = "neg32" if storage == "fp32-cast" else "neg"
    fate = "-inf there" if mask < -65520 else "lowest finite value there"
    L.assert_diag(d, "AC203", node="attn/mask_cast", op_type="Cast", words=(f"'{tensor}'", fate))
    assert d.value == float(np.float32(mask))
    assert d.tensor == tensor


@pytest.mark.parametrize("storage", FP16_STORAGES)
def test_ac203_fp16_mask_at_the_lowest_finite_value(storage):
    m = L.attention(-65504.0, storage)
    H.check(m)
    diags = L.findings(m, "AC203")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC203", node="attn/mask_where", op_type="Where", words=("'neg'", "lowest finite value"))
    assert diags[0].value == -65504.0 and diags[0].tensor == "neg"


@pytest.mark.parametrize(
    "mask,storage",
    [
        (-1e4, "fp16-constant"),
        (-1e4, "fp16-initializer"),
        (-1e4, "fp32-cast"),
        (-65488.0, "fp32-cast"),  # rounds to -65472: one step of headroom is left
        (-3.4028235e38, "fp32-softmax"),
        (float("-inf"), "fp32-softmax"),
        # -inf is -inf in fp16 too: converted exactly, so not the conversion's hazard
        (float("-inf"), "fp32-cast"),
        (float("-inf"), "fp32-where-cast"),
        (float("-inf"), "fp16-constant"),
        (float("-inf"), "fp16-initializer"),
        # stored in fp16, -1e9 is inf as well: only its fp32 original tells (see AC201)
        (-1e9, "fp16-initializer"),
    ],
)
def test_ac203_good(mask, storage):
    m = L.attention(mask, storage)
    H.check(m)
    result = L.run_check(m, "AC203")
    assert result.mode == "actual"
    assert "AC203" not in L.codes(result)


# ---- AC204: epsilons that flush ----------------------------------------------------------
def test_ac204_fused_layernorm_epsilon_1e12_in_fp16():
    m = L.layernorm_fused(1e-12)
    H.check(m)
    diags = L.findings(m, "AC204")
    assert len(diags) == 1
    d = diags[0]
    L.assert_diag(d, "AC204", node="ln", op_type="LayerNormalization", words=("1e-12", "fp16"))
    assert d.value == pytest.approx(1e-12, rel=1e-6)


def test_ac204_decomposed_layernorm_epsilon_1e12_cast_to_fp16():
    """The epsilon kept fp32 and cast to fp16 right before the Add: it is 0 in fp16."""
    m = L.layernorm_decomposed(1e-12, eps_storage="cast")
    H.check(m)
    diags = L.findings(m, "AC204")
    assert len(diags) == 1, "AC204 misses the 1e-12 epsilon (fp32 constant -> Cast(FLOAT16) -> Add) of a fp16 LayerNorm"
    d = diags[0]
    L.assert_diag(d, "AC204", node="ln/add_eps", op_type="Add", words=("1e-12", "fp16"))
    assert d.value == pytest.approx(1e-12, rel=1e-6)


def test_ac204_decomposed_layernorm_epsilon_1e12_stored_in_fp16():
    """A naive converter stores np.float16(1e-12), which is 0: the epsilon has flushed already."""
    assert float(L.f16(1e-12)) == 0.0
    m = L.layernorm_decomposed(1e-12)
    H.check(m)
    diags = L.findings(m, "AC204")
    assert len(diags) == 1, "AC204 misses the flushed (now 0) epsilon of a decomposed fp16 LayerNorm"
    d = diags[0]
    L.assert_diag(d, "AC204", node="ln/add_eps", op_type="Add", words=("fp16",))
    assert d.value is not None and 0.0 <= d.value < FP16_TINY


def test_ac204_naive_conversion_of_a_decomposed_layernorm():
    """autocast-onnx's own all-fp16 conversion (include_nodes=[".*"]) of a fp32 decomposed LayerNorm
    with epsilon 1e-12 writes the epsilon as fp16 0: the lint must flag it."""
    converted = autocast_onnx.convert(L.layernorm_decomposed(1e-12, dtype=F32), include_nodes=[".*"])
    assert H.precision(converted, "ln/add_eps") == "fp16"
    result = lint(converted.model)
    assert result.mode == "actual"
    assert "AC102" in L.codes(result)
    eps = [d for d in result.diagnostics if d.code == "AC204"]
    assert [d.node for d in eps] == ["ln/add_eps"], "AC204 misses the epsilon of the naive fp16 LayerNorm"
    assert eps[0].severity == "error"


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: L.layernorm_fused(1e-5), id="fused-1e-5"),
        pytest.param(lambda: L.layernorm_decomposed(1e-5), id="decomposed-1e-5"),
        pytest.param(lambda: L.layernorm_decomposed(1e-5, eps_storage="cast"), id="decomposed-cast-1e-5"),
        pytest.param(lambda: L.layernorm_decomposed(1e-12, dtype=F32, fp16_input=True), id="decomposed-fp32-1e-12"),
        pytest.param(
            lambda: L.wrap_op(
                "BatchNormalization",
                attrs={"epsilon": 1e-5},
                name="bn",
                out_shape=(2, 8),
                extras=(("scale", np.ones(8)), ("bias", np.zeros(8)), ("mean", np.zeros(8)), ("var", np.ones(8))),
            ),
            id="bn-1e-5",
        ),
    ],
)
def test_ac204_good(model):
    m = model()
    H.check(m)
    result = L.run_check(m, "AC204")
    assert result.mode == "actual"
    assert "AC204" not in L.codes(result)


# ---- AC301: lossy round trips ------------------------------------------------------------
def _round_trip(low_type=F16):
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], name="to_half", to=low_type),
        helper.make_node("Cast", ["h"], ["x2"], name="to_float", to=F32),
        helper.make_node("Softmax", ["x2"], ["y"], name="sm", axis=-1),
    ]
    m = H.model(nodes, [H.tensor("x", F32, [2, 8])], [H.tensor("y", F32, [2, 8])])
    H.check(m)
    return m


@pytest.mark.parametrize("low_type,word", [(F16, "fp16"), (BF16, "bf16")])
def test_ac301_round_trip(low_type, word):
    m = _round_trip(low_type)
    diags = L.findings(m, "AC301")
    assert len(diags) == 1
    d = diags[0]
    L.assert_diag(d, "AC301", node="to_half", op_type="Cast", words=("'x'", word, "to_float"))
    assert d.tensor == "x"


def test_ac301_cast_feeding_an_fp16_matmul_is_fine():
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], name="to_half", to=F16),
        helper.make_node("MatMul", ["h", "w"], ["r"], name="mm"),
        helper.make_node("Cast", ["r"], ["y"], name="to_float", to=F32),
    ]
    m = H.model(
        nodes, [H.tensor("x", F32, [2, 8])], [H.tensor("y", F32, [2, 8])], [H.init("w", np.ones((8, 8), np.float16))]
    )
    H.check(m)
    result = L.run_check(m, "AC301")
    assert result.mode == "actual"
    assert "AC301" not in L.codes(result)


# ---- AC302: low-precision model outputs ---------------------------------------------------
def _relu_out(out_type):
    nodes = [helper.make_node("Relu", ["x"], ["r" if out_type == F32 else "y"], name="relu")]
    if out_type == F32:
        nodes.append(helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32))
    m = H.model(nodes, [H.tensor("x", F16, [2, 8])], [H.tensor("y", out_type, [2, 8])])
    H.check(m)
    return m


def test_ac302_fp16_output():
    diags = L.findings(_relu_out(F16), "AC302")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC302", node="relu", op_type="Relu", words=("'y'", "fp16"))
    assert diags[0].tensor == "y"


def test_ac302_fp32_output_is_fine():
    result = L.run_check(_relu_out(F32), "AC302")
    assert result.mode == "actual"
    assert "AC302" not in L.codes(result)


# ---- AC303: unknown tensor types ---------------------------------------------------------
def _custom(with_value_info):
    nodes = [
        helper.make_node("Foo", ["x"], ["t"], name="foo", domain="my.domain"),
        helper.make_node("Cast", ["t"], ["y"], name="cast", to=F32),
    ]
    vi = [H.tensor("t", F16, [2, 8])] if with_value_info else []
    return H.model(
        nodes,
        [H.tensor("x", F16, [2, 8])],
        [H.tensor("y", F32, [2, 8])],
        extra_opsets=[("my.domain", 1)],
        value_info=vi,
    )


def test_ac303_custom_op_without_value_info():
    diags = L.findings(_custom(False), "AC303")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC303", node="foo", op_type="Foo", words=("'t'", "unknown"))
    assert diags[0].tensor == "t"


def test_ac303_custom_op_with_value_info_is_fine():
    result = L.run_check(_custom(True), "AC303")
    assert "AC303" not in L.codes(result)


# ---- AC402: tensor-core alignment --------------------------------------------------------
def test_ac402_matmul_unaligned():
    diags = L.findings(L.matmul_weight(60, 30), "AC402")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC402", node="mm", op_type="MatMul", words=("K=60", "N=30", "multiple of 8"))


def test_ac402_conv_unaligned():
    diags = L.findings(L.conv_weight(30, 3, 3, 3), "AC402")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC402", node="conv", op_type="Conv", words=("C_out=30", "multiple of 8"))


def test_ac402_gemm_trans_b_uses_the_right_dimension():
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["r"], name="gemm", transB=1),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    m = H.model(
        nodes,
        [H.tensor("x", F16, [2, 64])],
        [H.tensor("y", F32, [2, 60])],
        [H.init("w", np.ones((60, 64), np.float16))],
    )
    H.check(m)
    diags = L.findings(m, "AC402")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC402", node="gemm", op_type="Gemm", words=("N=60",))
    assert "K=" not in diags[0].message


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: L.matmul_weight(64, 64), id="matmul-64x64"),
        pytest.param(lambda: L.conv_weight(32, 8, 3, 3), id="conv-32x8x3x3"),
    ],
)
def test_ac402_aligned_is_fine(model):
    m = model()
    H.check(m)
    result = L.run_check(m, "AC402")
    assert result.mode == "actual"
    assert "AC402" not in L.codes(result)


# ---- AC403: deep reductions --------------------------------------------------------------
def test_ac403_matmul_deep_k():
    k = L.CATALOG["AC403"].params["max_depth"] + 808  # 9000
    m = L.matmul_weight(k, 8)
    diags = L.findings(m, "AC403")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC403", node="mm", op_type="MatMul", words=(str(k),))
    assert diags[0].value == k


def test_ac403_conv_depth_is_c_in_times_kernel():
    m = L.conv_weight(8, 1024, 3, 3)  # 1024 * 3 * 3 = 9216 products per output
    diags = L.findings(m, "AC403")
    assert len(diags) == 1
    L.assert_diag(diags[0], "AC403", node="conv", op_type="Conv", words=("9216",))
    assert diags[0].value == 9216


@pytest.mark.parametrize("k", [64, 8192])
def test_ac403_shallow_is_fine(k):
    assert k <= L.CATALOG["AC403"].params["max_depth"]
    result = L.run_check(L.matmul_weight(k, 8), "AC403")
    assert result.mode == "actual"
    assert "AC403" not in L.codes(result)


# ---- full default selection --------------------------------------------------------------
def test_full_selection_on_a_naive_fp16_attention():
    m = L.attention(-3.4028235e38, "fp32-cast")
    result = lint(m)
    assert result.mode == "actual" and result.precision == "fp16"
    assert "AC901" in result.checks and len(result.checks) == len(L.CATALOG)
    found = sorted((d.code, d.node, d.severity) for d in result.diagnostics)
    assert found == [
        ("AC101", "attn/softmax", "error"),
        ("AC201", "attn/mask_cast", "error"),
        ("AC203", "attn/mask_cast", "error"),
    ]
    assert result.failed("error")
    assert result.suppressed == 0


def test_full_selection_on_a_well_converted_attention_is_clean():
    # Clean of every hazard; the one finding is AC305 (info): the Cast after the fp16 score MatMul
    # splits MatMul -> scalar Mul, which ONNX Runtime's CUDA provider fuses into FusedMatMul.
    result = lint(L.attention(-3.4028235e38, "fp32-softmax"))
    assert result.mode == "actual"
    assert [(d.code, d.node) for d in result.diagnostics] == [("AC305", "attn/scores_cast")]
    assert not result.failed("warning")


def test_full_selection_on_a_naive_decomposed_layernorm():
    result = lint(L.layernorm_decomposed(1e-5))
    by_code = {}
    for d in result.diagnostics:
        by_code.setdefault(d.code, []).append(d.node)
    assert by_code["AC102"] == L.LN_NODES
    assert by_code["AC103"] == ["ln/mean", "ln/var"]
    assert by_code["AC104"] == ["ln/pow", "ln/sqrt"]
    assert set(by_code) == {"AC102", "AC103", "AC104"}
    # sorted by catalog order, then position
    order = [d.code for d in result.diagnostics]
    assert order == sorted(order)


# ---- prospective mode (pure fp32 models) -------------------------------------------------
ANY_RUNTIME = PlanOptions(runtime="any")  # lint counts on no runtime's kernels: AC101-AC104 as before issue 37


@pytest.fixture(scope="module")
def bert_prospective():
    return lint(str(BERT))


@pytest.fixture(scope="module")
def bert_prospective_any_runtime():
    return lint(str(BERT), LintOptions(plan=ANY_RUNTIME))


def _check_prospective_bert(result):
    """What every prospective lint of bert_tiny says, whichever runtime it counts on: every finding
    protected, the mask and epsilon findings. Returns a picker of findings by code and op type."""
    assert result.mode == "prospective"
    assert result.precision == "fp16"
    assert result.model == str(BERT)
    assert result.diagnostics
    for d in result.diagnostics:
        assert d.protected is True, (d.code, d.node)
        assert d.severity == "info"
        assert "would be computed in" in d.message or d.code in ("AC201", "AC203", "AC204")
        assert "keep this fp32" in d.message or "stores the mask constant" in d.message
        assert d.model == str(BERT)
    assert not result.failed("warning")

    def pick(code, op_type):
        found = [d for d in result.diagnostics if d.code == code and d.op_type == op_type]
        assert found, f"no {code} on {op_type}"
        return found

    masks = [d for d in result.diagnostics if d.code == "AC203"]
    assert masks and all(d.value <= -3.4e38 for d in masks)
    assert any(d.op_type == "Where" for d in masks)
    return pick


def test_prospective_bert_tiny_findings_are_protected(bert_prospective):
    # By default an fp32 model is linted for the default conversion's runtime, ONNX Runtime's CUDA
    # provider, whose Softmax and LayerNormalization kernels compute in fp32 and round once at
    # fp16: AC101 and AC102 are not reported on them (the conversion runs them low, kernel-fp32).
    result = bert_prospective
    _check_prospective_bert(result)
    assert not [d for d in result.diagnostics if d.code in ("AC101", "AC102", "AC103", "AC104")]
    # and no AC204: the epsilon attribute is a float, which the fp32-computing kernel adds in float
    assert {d.code for d in result.diagnostics} == {"AC201", "AC203"}


def test_prospective_bert_tiny_any_runtime_findings_are_protected(bert_prospective, bert_prospective_any_runtime):
    # Counting on no runtime (--runtime any) the Softmax and LayerNormalization findings are there,
    # and protected: the plan for no runtime keeps them fp32.
    result = bert_prospective_any_runtime
    pick = _check_prospective_bert(result)
    softmax = pick("AC101", "Softmax")
    assert len(softmax) == 2
    assert all(d.name == "softmax-in-low-precision" for d in softmax)
    assert len(pick("AC102", "LayerNormalization")) == 5
    eps = pick("AC204", "LayerNormalization")
    assert len(eps) == 5
    assert all(d.value == pytest.approx(1e-12, rel=1e-6) for d in eps)
    # the rest is what the default lint reports
    rest = [(d.code, d.node) for d in result.diagnostics if d.code not in ("AC101", "AC102", "AC204")]
    assert rest == [(d.code, d.node) for d in bert_prospective.diagnostics]


def _fp32_attention_head(name="head/softmax"):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="head/mm"),
        helper.make_node("Softmax", ["s"], ["y"], name=name, axis=-1),
    ]
    m = H.model(
        nodes,
        [H.tensor("x", F32, [2, 8])],
        [H.tensor("y", F32, [2, 8])],
        [H.init("w", np.full((8, 8), 0.1, np.float32))],
    )
    H.check(m)
    return m


def test_prospective_protected_by_default_rules():
    # the point is the protected flag: linted for no runtime, so that AC101 is reported at all (for
    # CUDA, the default, its Softmax kernel computes in fp32 and it is not)
    assert L.findings(_fp32_attention_head(), "AC101") == []
    diags = L.findings(_fp32_attention_head(), "AC101", plan=ANY_RUNTIME)
    assert len(diags) == 1
    L.assert_diag(
        diags[0],
        "AC101",
        node="head/softmax",
        op_type="Softmax",
        severity="info",
        protected=True,
        words=("would be computed in fp16", "keep this fp32"),
    )


@pytest.mark.parametrize("category", ["follow", "low_precision"])
def test_prospective_unprotected_keeps_catalog_severity(tmp_path, category):
    rules = tmp_path / "softmax_low.toml"
    rules.write_text(f'[ops.{category}]\nSoftmax = "test: let softmax go low"\n')
    converted = autocast_onnx.convert(_fp32_attention_head(), rules=[str(rules)])
    assert H.precision(converted, "head/softmax") != "fp32"  # the rule file really moves it low
    diags = L.findings(_fp32_attention_head(), "AC101", rules=[str(rules)], plan=ANY_RUNTIME)  # see above
    assert len(diags) == 1
    L.assert_diag(
        diags[0],
        "AC101",
        node="head/softmax",
        op_type="Softmax",
        severity="error",
        protected=False,
        words=("would be computed in fp16", "would NOT protect"),
    )


def test_prospective_deep_matmul_is_not_protected():
    k = 9000
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    m = H.model(
        nodes,
        [H.tensor("x", F32, [2, k])],
        [H.tensor("y", F32, [2, 8])],
        [H.init("w", np.full((k, 8), 0.01, np.float32))],
    )
    diags = L.findings(m, "AC403")
    assert len(diags) == 1
    L.assert_diag(
        diags[0],
        "AC403",
        node="mm",
        op_type="MatMul",
        severity="warning",
        protected=False,
        words=("9000", "would NOT protect"),
    )
    assert diags[0].value == k


@pytest.mark.parametrize("n_tiny,protected", [(1, False), (500, True)])
def test_prospective_weight_flush_threshold(n_tiny, protected):
    w = np.ones((1000, 8), np.float32)
    w.reshape(-1)[:n_tiny] = 1e-9  # max_flush_fraction = 0.01 decides whether MatMul stays fp32
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    m = H.model(nodes, [H.tensor("x", F32, [2, 1000])], [H.tensor("y", F32, [2, 8])], [H.init("w", w)])
    diags = L.findings(m, "AC202")
    assert len(diags) == 1
    L.assert_diag(
        diags[0], "AC202", node="mm", op_type="MatMul", protected=protected, severity="info" if protected else "warning"
    )
    assert diags[0].value == pytest.approx(n_tiny / 8000)


def test_prospective_precision_bf16_keeps_tiny_epsilon():
    m = L.layernorm_fused(1e-12, dtype=F32)
    fp16 = L.run_check(m, "AC204", plan=ANY_RUNTIME)
    assert fp16.mode == "prospective" and fp16.precision == "fp16"
    assert [d.node for d in fp16.diagnostics] == ["ln"]
    assert L.run_check(m, "AC204").diagnostics == []  # CUDA's kernel adds the float epsilon in float
    bf16 = L.run_check(m, "AC204", precision="bf16", plan=ANY_RUNTIME)
    assert bf16.precision == "bf16"
    assert bf16.diagnostics == []


# ---- converted models --------------------------------------------------------------------
@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_converted_examples_have_no_errors(path):
    converted = autocast_onnx.convert(str(path)).model
    result = lint(converted)
    assert result.mode == "actual"
    errors = [(d.code, d.node, d.message) for d in result.diagnostics if d.severity == "error"]
    assert errors == []
    assert not result.failed("error")


def _errors(result) -> dict:
    errors = {}
    for d in result.diagnostics:
        if d.severity == "error":
            errors.setdefault(d.code, []).append(d)
    return errors


def test_naive_all_fp16_conversion_of_bert_is_flagged():
    converted = autocast_onnx.convert(str(BERT), include_nodes=[".*"])
    naive = converted.model
    # the mask's -3.4e38 is an attention-mask sentinel: retargeted to -49152, not overflowed to -inf,
    # even with every node forced low (so no AC201/AC203 on the converted model)
    assert converted.plan.mask_sentinels == {"val_63": -49152.0}
    # Linted without --runtime, a model autocast-onnx converted is linted for the runtime its
    # provenance records (CUDA, the default), whose Softmax and LayerNormalization kernels compute
    # in fp32 and round once, and add their float epsilon in float: nothing is left.
    result = lint(naive)
    assert result.mode == "actual"
    assert result.provenance["runtime"] == "cuda"
    assert _errors(result) == {}
    # Counting on no runtime (--runtime any), the fp16 Softmax and LayerNormalization are reported.
    result = lint(naive, LintOptions(plan=ANY_RUNTIME))
    assert result.mode == "actual"
    errors = _errors(result)
    assert set(errors) == {"AC101", "AC102", "AC204"}
    assert len(errors["AC101"]) == 2
    assert all(d.op_type == "Softmax" for d in errors["AC101"])
    assert len(errors["AC102"]) == 5
    assert all(d.op_type == "LayerNormalization" for d in errors["AC102"])
    assert not errors.get("AC203") and not errors.get("AC201")
    assert result.failed("error")


# ---- suppressions ------------------------------------------------------------------------
def _softmax_model(name="attn/softmax", metadata=None):
    m = L.wrap_op("Softmax", attrs={"axis": -1}, name=name)
    if metadata is not None:
        node = H.node_by_name(m, name)
        prop = node.metadata_props.add()
        prop.key, prop.value = METADATA_KEY, metadata
    return m


def test_suppression_by_node_regex():
    m = _softmax_model()
    result = lint(m, LintOptions(suppress=[Suppression(code="AC101", node="^attn", source="test")]))
    assert "AC101" not in L.codes(result)
    assert result.suppressed == 1
    assert "AC901" not in L.codes(result)


@pytest.mark.parametrize("selector", ["AC1", "softmax-in-low-precision", "all"])
def test_suppression_by_prefix_or_name(selector):
    m = _softmax_model()
    result = lint(m, LintOptions(suppress=[Suppression(code=selector, node="softmax$", source="test")]))
    assert "AC101" not in L.codes(result)
    assert result.suppressed == 1


def test_suppression_of_another_code_does_not_hide():
    m = _softmax_model()
    sup = Suppression(code="AC104", node="^attn", source="lint.toml:7")
    result = lint(m, LintOptions(suppress=[sup]))
    assert "AC101" in L.codes(result)
    assert result.suppressed == 0
    unused = [d for d in result.diagnostics if d.code == "AC901"]
    assert len(unused) == 1
    d = unused[0]
    assert d.name == "unused-suppression" and d.severity == L.CATALOG["AC901"].severity
    assert "lint.toml:7" in d.message and "AC104" in d.message and "^attn" in d.message


def test_unused_suppression_reports_its_source():
    m = _softmax_model()
    result = lint(m, LintOptions(suppress=[Suppression(code="AC101", node="^mlp/", source="my-config.toml:3")]))
    assert "AC101" in L.codes(result)
    unused = [d for d in result.diagnostics if d.code == "AC901"]
    assert len(unused) == 1
    assert "my-config.toml:3" in unused[0].message
    assert unused[0].severity == "warning"
    assert result.suppressed == 0


def test_suppression_by_node_metadata():
    m = _softmax_model(metadata="AC101")
    result = lint(m)
    assert "AC101" not in L.codes(result)
    assert result.suppressed == 1
    assert "AC901" not in L.codes(result)


def test_unused_metadata_suppression():
    m = _softmax_model(metadata="AC101, AC204")
    result = lint(m)
    assert "AC101" not in L.codes(result)
    unused = [d for d in result.diagnostics if d.code == "AC901"]
    assert len(unused) == 1
    assert "AC204" in unused[0].message and "metadata of node attn/softmax" in unused[0].message


def test_unused_suppression_needs_ac901_selected():
    m = _softmax_model()
    sup = Suppression(code="AC101", node="^mlp/", source="test")
    assert L.codes(lint(m, LintOptions(select=["AC101"], suppress=[sup]))) == {"AC101"}
    sup2 = Suppression(code="AC101", node="^mlp/", source="test")
    assert L.codes(lint(m, LintOptions(select=["AC101", "AC901"], suppress=[sup2]))) == {"AC101", "AC901"}


def test_suppression_state_does_not_leak_between_lint_calls():
    """lint() with the same options must give the same result whatever was linted before: a
    suppression used by an earlier model is still unused (AC901) for a model it does not match."""
    options = LintOptions(suppress=[Suppression(code="AC101", node="^attn", source="cfg")])
    matching = _softmax_model("attn/softmax")
    other = L.wrap_op("Relu", name="mlp/relu")
    fresh = lint(other, LintOptions(suppress=[Suppression(code="AC101", node="^attn", source="cfg")]))
    assert L.codes(fresh) == {"AC901"}
    assert lint(matching, options).suppressed == 1
    again = lint(other, options)
    assert L.codes(again) == {"AC901"}, "the suppression's use count carried over from the previous lint() call"


def test_suppression_with_a_bad_regex_is_refused():
    with pytest.raises(AutocastError):
        lint(_softmax_model(), LintOptions(suppress=[Suppression(code="AC101", node="(", source="test")]))


# ---- selection ---------------------------------------------------------------------------
def test_select_by_prefix():
    m = L.layernorm_decomposed(1e-5)
    result = lint(m, LintOptions(select=["AC1"]))
    assert result.checks == [c for c in L.CATALOG if c.startswith("AC1")]
    assert L.codes(result) == {"AC102", "AC103", "AC104"}


def test_ignore_by_prefix():
    m = L.layernorm_decomposed(1e-5)
    result = lint(m, LintOptions(ignore=["AC1"]))
    assert not any(c.startswith("AC1") for c in result.checks)
    assert "AC201" in result.checks
    assert not any(c.startswith("AC1") for c in L.codes(result))


def test_select_and_ignore_by_name():
    m = _softmax_model()
    result = lint(m, LintOptions(select=["softmax-in-low-precision"]))
    assert result.checks == ["AC101"]
    assert L.codes(result) == {"AC101"}
    result = lint(m, LintOptions(ignore=["softmax-in-low-precision"]))
    assert "AC101" not in result.checks
    assert "AC101" not in L.codes(result)


@pytest.mark.parametrize(
    "options",
    [
        {"select": ["AC7"]},
        {"select": ["no-such-check"]},
        {"ignore": ["AC999"]},
        {"select": ["AC1", "softmax"]},
    ],
)
def test_selector_matching_no_check_is_refused(options):
    with pytest.raises(AutocastError, match="selects no check"):
        lint(_softmax_model(), LintOptions(**options))


@pytest.mark.parametrize("opset", [None, 21], ids=["as-is", "upgraded"])
def test_a_loaded_model_is_linted_as_its_file_and_left_as_it_was(opset):
    """A command reads its input once and lints what it read (io.LoadedModel): the findings are
    those of the file, named by the path as the caller spelled it, and the model is not edited,
    not even by the --opset upgrade the lint plans on."""
    from autocast_onnx.graph.sanity import load_checked

    options = LintOptions(plan=PlanOptions(opset=opset))
    given = f"{BERT.parent}/./{BERT.name}"  # a spelling the Path the loader keeps does not keep
    loaded = load_checked(given, load_external=False)
    assert str(loaded.path) != given and loaded.shown == given
    before = loaded.model.SerializeToString()
    from_file, from_loaded = lint(given, options), lint(loaded, options)
    assert loaded.model.SerializeToString() == before
    assert from_loaded.model == from_file.model == given
    assert [d.as_dict() for d in from_loaded.diagnostics] == [d.as_dict() for d in from_file.diagnostics]
    assert from_file.diagnostics and all(d.model == given for d in from_loaded.diagnostics)
