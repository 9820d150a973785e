"""Helpers for the lint-check tests (tests/lint/test_lint_checks.py): the check catalog, running one
check, asserting on a Diagnostic, and small fp16 graphs of the shapes a naive converter leaves
behind (attention with a mask, decomposed LayerNorm). Builds on tests/helpers.py, which stays
as it is."""

from __future__ import annotations

import helpers as H
import numpy as np
from onnx import TensorProto, helper

from autocast_onnx.lint import LintOptions, lint, load_checks

F32, F16, BF16 = H.F32, H.F16, H.BF16
NP = {F32: np.float32, F16: np.float16}

CATALOG = {c.code: c for c in load_checks()}


# ---- running checks ----------------------------------------------------------------------
def run_check(m, code, **options):
    """Lint `m` with only the check `code` selected."""
    return lint(m, LintOptions(select=[code], **options))


def findings(m, code, **options):
    """Diagnostics of check `code` alone (asserting the isolated run produced nothing else)."""
    result = run_check(m, code, **options)
    assert result.checks == [code]
    other = [d.code for d in result.diagnostics if d.code != code]
    assert not other, f"select=[{code}] reported {other}"
    return [d for d in result.diagnostics if d.code == code]


def codes(result):
    return {d.code for d in result.diagnostics}


def by_node(diags, node):
    found = [d for d in diags if d.node == node]
    assert found, f"no finding on node {node!r}: {[(d.code, d.node) for d in diags]}"
    return found


def assert_diag(d, code, *, node, op_type, graph="main", severity=None, words=(), protected=None):
    """The fields every finding must carry: code, the catalog's name, severity (the catalog's
    unless given), node, op type, graph, the catalog's fix and a message citing `words`."""
    check = CATALOG[code]
    assert d.code == code
    assert d.name == check.name
    assert d.severity == (severity or check.severity), (d.severity, d.message)
    assert d.node == node
    assert d.op_type == op_type
    assert d.graph == graph
    assert d.fix == check.fix
    assert isinstance(d.message, str) and len(d.message) > 10
    for word in words:
        assert word in d.message, f"{word!r} not in message {d.message!r}"
    assert d.protected is protected
    if d.node is not None:
        assert d.node_index is not None and d.node_index >= 0


# ---- graphs ------------------------------------------------------------------------------
def f16(value):
    """np.float16(value) the way a naive converter computes it: overflow gives inf, silently."""
    with np.errstate(over="ignore", under="ignore"):
        return np.asarray(value, dtype=np.float32).astype(np.float16)


def const_node(name, array):
    """A Constant node producing `name`."""
    return helper.make_node(
        "Constant", [], [name], name=f"{name}_const", value=H.init(name + "_value", np.asarray(array))
    )


def wrap_op(op, shape=(2, 8), attrs=None, domain="", extras=(), low=True, name="op", extra_opsets=(), out_shape=None):
    """x (fp16) -> `op`(x, *extras) -> y (fp32 output).

    low=True: the op computes in fp16 and its result is cast to fp32 (a naive converter's output).
    low=False: x is cast to fp32 first, so the op computes in fp32 (the fix) while the model still
    has fp16 tensors (it is linted in "actual" mode). `extras` are (name, array) initializers for
    the op's other inputs; float ones are stored in the op's compute type. The output's shape is
    `out_shape` (None: left out)."""
    nodes, inits = [], []
    src = "x"
    if not low:
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], name="to_fp32", to=F32))
        src = "x32"
    for extra_name, array in extras:
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array = f16(array) if low else array.astype(np.float32)
        inits.append(H.init(extra_name, array))
    out = "r" if low else "y"
    nodes.append(helper.make_node(op, [src, *[n for n, _ in extras]], [out], name=name, domain=domain, **(attrs or {})))
    if low:
        nodes.append(helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32))
    return H.model(
        nodes,
        [H.tensor("x", F16, list(shape))],
        [H.tensor("y", F32, None if out_shape is None else list(out_shape))],
        inits,
        extra_opsets=extra_opsets,
    )


def layernorm_fused(eps, dtype=F16, name="ln"):
    """x -> LayerNormalization(epsilon=eps), all in `dtype`, output cast to fp32."""
    np_dt = NP[dtype]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["r"], name=name, axis=-1, epsilon=eps),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    inits = [H.init("gamma", np.ones(8, np_dt)), H.init("beta", np.zeros(8, np_dt))]
    return H.model(nodes, [H.tensor("x", dtype, [2, 8])], [H.tensor("y", F32, [2, 8])], inits)


LN_NODES = ["ln/mean", "ln/sub", "ln/pow", "ln/var", "ln/add_eps", "ln/sqrt", "ln/div"]
LN_OPS = ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div"]


def layernorm_decomposed(eps, dtype=F16, eps_storage=None, fp16_input=False):
    """A LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div, computing in `dtype`.

    eps_storage: None stores the epsilon as a `dtype` initializer (for fp16 a naive converter's
    np.float16(eps)); "cast" stores it as an fp32 initializer cast to `dtype` by a Cast node.
    fp16_input: the model input is fp16 and is cast to `dtype` first (with dtype=F32: the fix, in a
    model that is still linted in "actual" mode)."""
    np_dt = NP[dtype]
    nodes = []
    src = "x"
    if fp16_input:
        nodes.append(helper.make_node("Cast", ["x"], ["xin"], name="to_compute", to=dtype))
        src = "xin"
    inits = [H.init("two", np.array(2.0, np_dt))]
    eps_name = "eps"
    if eps_storage == "cast":
        inits.append(H.init("eps32", np.array(eps, np.float32)))
        nodes.append(helper.make_node("Cast", ["eps32"], ["eps"], name="ln/eps_cast", to=dtype))
    else:
        inits.append(H.init("eps", f16(eps) if dtype == F16 else np.array(eps, np_dt)))
    nodes += [
        helper.make_node("ReduceMean", [src], ["mean"], name="ln/mean", axes=[-1]),
        helper.make_node("Sub", [src, "mean"], ["xc"], name="ln/sub"),
        helper.make_node("Pow", ["xc", "two"], ["sq"], name="ln/pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="ln/var", axes=[-1]),
        helper.make_node("Add", ["var", eps_name], ["ve"], name="ln/add_eps"),
        helper.make_node("Sqrt", ["ve"], ["std"], name="ln/sqrt"),
        helper.make_node("Div", ["xc", "std"], ["r"], name="ln/div"),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    return H.model(nodes, [H.tensor("x", F16 if fp16_input else dtype, [2, 8])], [H.tensor("y", F32, [2, 8])], inits)


def attention(mask_value, storage="fp16-constant"):
    """q @ k^T + mask -> Softmax -> @ v with mask = Where(cond, 0, mask_value).

    storage says how the mask constant reaches the fp16 Add:
      "fp16-constant"     Constant node holding np.float16(mask_value) (what a naive converter writes)
      "fp16-initializer"  initializer holding np.float16(mask_value)
      "fp32-cast"         fp32 initializer -> Cast(FLOAT16) -> Where (fp16)
      "fp32-where-cast"   Where computed in fp32 -> Cast(FLOAT16) -> Add (fp16)
      "fp32-softmax"      the fix: Where, Add and Softmax in fp32; only the MatMuls are fp16
    The nodes are named attn/qk, attn/mask_where, attn/mask_add, attn/softmax, attn/pv."""
    nodes, inits = [], []
    low = storage.startswith("fp16") or storage == "fp32-cast"
    if storage == "fp16-constant":
        nodes += [const_node("zero", np.array(0.0, np.float16)), const_node("neg", f16(mask_value))]
    elif storage == "fp16-initializer":
        inits += [H.init("zero", np.array(0.0, np.float16)), H.init("neg", f16(mask_value))]
    elif storage == "fp32-cast":
        inits += [H.init("zero", np.array(0.0, np.float16)), H.init("neg32", np.array(mask_value, np.float32))]
        nodes.append(helper.make_node("Cast", ["neg32"], ["neg"], name="attn/mask_cast", to=F16))
    else:
        inits += [H.init("zero", np.array(0.0, np.float32)), H.init("neg", np.array(mask_value, np.float32))]
    nodes.append(helper.make_node("MatMul", ["q", "k"], ["scores"], name="attn/qk"))
    where_out = "mask" if low or storage == "fp32-softmax" else "mask32"
    nodes.append(helper.make_node("Where", ["cond", "zero", "neg"], [where_out], name="attn/mask_where"))
    if storage == "fp32-where-cast":
        nodes.append(helper.make_node("Cast", ["mask32"], ["mask"], name="attn/mask_cast", to=F16))
    if storage == "fp32-softmax":
        nodes.append(helper.make_node("Cast", ["scores"], ["scores32"], name="attn/scores_cast", to=F32))
        nodes.append(helper.make_node("Add", ["scores32", "mask"], ["masked"], name="attn/mask_add"))
        nodes.append(helper.make_node("Softmax", ["masked"], ["probs32"], name="attn/softmax", axis=-1))
        nodes.append(helper.make_node("Cast", ["probs32"], ["probs"], name="attn/probs_cast", to=F16))
    else:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"], name="attn/mask_add"))
        nodes.append(helper.make_node("Softmax", ["masked"], ["probs"], name="attn/softmax", axis=-1))
    nodes.append(helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="attn/pv"))
    nodes.append(helper.make_node("Cast", ["ctx"], ["y"], name="to_output", to=F32))
    inputs = [
        H.tensor("q", F16, [1, 4, 8]),
        H.tensor("k", F16, [1, 8, 4]),
        H.tensor("v", F16, [1, 4, 8]),
        H.tensor("cond", TensorProto.BOOL, [1, 4, 4]),
    ]
    return H.model(nodes, inputs, [H.tensor("y", F32, [1, 4, 8])], inits)


def matmul_weight(k, n, dtype=F16, name="mm"):
    """x [2, k] (dtype) -> MatMul with an initializer weight [k, n] -> Cast -> y (fp32)."""
    w = np.full((k, n), 0.01, NP[dtype])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["r"], name=name),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    return H.model(nodes, [H.tensor("x", dtype, [2, k])], [H.tensor("y", F32, [2, n])], [H.init("w", w)])


def conv_weight(c_out, c_in, kh, kw, dtype=F16, name="conv"):
    """x [1, c_in, 8, 8] (dtype) -> Conv with an initializer weight [c_out, c_in, kh, kw] -> Cast -> y."""
    w = np.full((c_out, c_in, kh, kw), 0.01, NP[dtype])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["r"], name=name),
        helper.make_node("Cast", ["r"], ["y"], name="to_output", to=F32),
    ]
    out = [1, c_out, 9 - kh, 9 - kw]
    return H.model(nodes, [H.tensor("x", dtype, [1, c_in, 8, 8])], [H.tensor("y", F32, out)], [H.init("w", w)])
