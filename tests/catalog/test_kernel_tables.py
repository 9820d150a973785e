"""The CUDA kernel table (autocast_onnx/data/kernels_cuda.json) and its lookup, autocast_onnx.catalog.kernels.

The table is written by tools/kernel_tables.py from ONNX Runtime's registration sources; these tests check
its form, its recorded source, its ops against the op names of the onnxruntime-gpu wheel's CUDA provider
library (saved in tests/data/kernels/cuda_wheel_ops.txt), and has_kernel on real rows of the table.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from onnx import TensorProto

from autocast_onnx.catalog.kernels import has_kernel, kernel_table
from autocast_onnx.errors import AutocastError

WHEEL_OPS = Path(__file__).resolve().parents[1] / "data" / "kernels" / "cuda_wheel_ops.txt"
ONNX_TYPES = {TensorProto.DataType.Name(v).lower() for v in TensorProto.DataType.values()} - {"undefined"}

# Op names the onnxruntime-gpu 1.31.1 provider library holds that the table (read from an older commit, see
# source.commit) has no CUDA kernel for. Some are kernels added after that commit (RMSNormalization,
# TensorScatter, DeformConv, LinearAttention, ...); some are only the tail of another string (Mean of
# ReduceMean, Swish of HardSwish, LpPool of GlobalLpPool) or ops of other providers (Scaler, LabelEncoder).
KNOWN_WHEEL_ONLY = {
    "CausalConvWithState",
    "DeformConv",
    "GlobalLpPool",
    "HardSwish",
    "LabelEncoder",
    "LinearAttention",
    "LpNormalization",
    "LpPool",
    "MaxUnpool",
    "Mean",
    "RMSNormalization",
    "Scaler",
    "Swish",
    "TensorScatter",
}


def test_table_is_well_formed():
    kernels = kernel_table("cuda")["kernels"]
    assert len(kernels) > 300
    seen = set()
    for row in kernels:
        key = (row["domain"], row["op"], row["since"])
        assert key not in seen, key
        seen.add(key)
        assert row["domain"] in ("", "com.microsoft"), row
        assert isinstance(row["since"], int) and row["since"] >= 1, row
        assert row["until"] is None or row["until"] >= row["since"], row
        assert set(row["types"]) <= ONNX_TYPES, row
        assert row["types"] == sorted(set(row["types"])), row
        assert row["types"] or row.get("types_from") == "unknown", row
    assert [(r["domain"], r["op"], r["since"]) for r in kernels] == sorted(seen)


def test_version_ranges_of_an_op_do_not_overlap():
    by_op: dict[tuple[str, str], list[dict]] = {}
    for row in kernel_table("cuda")["kernels"]:
        by_op.setdefault((row["domain"], row["op"]), []).append(row)
    for key, rows in by_op.items():
        for before, after in itertools.pairwise(rows):
            if key == ("", "ThresholdedRelu"):  # the contrib file keeps a since-1 kernel beside the since-10 one
                continue
            assert before["until"] is not None and before["until"] < after["since"], key


def test_source_and_version_are_recorded():
    table = kernel_table("cuda")
    assert table["runtime"] == "cuda"
    assert re.fullmatch(r"\d+\.\d+\.\d+", table["onnxruntime"])
    assert re.fullmatch(r"[0-9a-f]{40}", table["source"]["commit"])
    assert table["source"]["repo"] == "microsoft/onnxruntime"
    assert "onnxruntime/core/providers/cuda/cuda_execution_provider.cc" in table["source"]["files"]
    assert table["generated_by"] == "tools/kernel_tables.py"


def test_table_ops_are_in_the_wheel_library_and_back():
    lines = WHEEL_OPS.read_text().splitlines()
    assert lines[0].startswith("# onnxruntime-gpu 1.31.1")
    wheel = set(lines[1:])
    ops = {row["op"] for row in kernel_table("cuda")["kernels"]}
    assert ops - wheel == set()
    assert wheel - ops == KNOWN_WHEEL_ONLY


@pytest.mark.parametrize(
    ("op", "opset", "elem_type", "expected"),
    [
        # GridSample: registered for float only.
        ("GridSample", 16, TensorProto.FLOAT, True),
        ("GridSample", 16, TensorProto.FLOAT16, False),
        # Conv: float16 but no bfloat16.
        ("Conv", 17, TensorProto.FLOAT16, True),
        ("Conv", 17, TensorProto.BFLOAT16, False),
        # MatMul: bfloat16 registered from opset 13 only.
        ("MatMul", 12, TensorProto.BFLOAT16, False),
        ("MatMul", 13, TensorProto.BFLOAT16, True),
        ("MatMul", 12, TensorProto.FLOAT16, True),
        # Opsets before the first registration.
        ("Gelu", 19, TensorProto.FLOAT16, False),
        ("Gelu", 20, TensorProto.FLOAT16, True),
    ],
)
def test_has_kernel_on_real_rows(op, opset, elem_type, expected):
    assert has_kernel("cuda", "", op, opset, elem_type) is expected


def test_has_kernel_contrib_domain_and_unknowns():
    assert has_kernel("cuda", "com.microsoft", "FusedConv", 1, TensorProto.FLOAT16) is False
    assert has_kernel("cuda", "com.microsoft", "SkipLayerNormalization", 1, TensorProto.FLOAT16) is True
    assert has_kernel("cuda", "ai.onnx", "Conv", 17, TensorProto.FLOAT16) is True
    assert has_kernel("cuda", "", "NoSuchOp", 17, TensorProto.FLOAT16) is None
    # NonMaxSuppression is untyped in the sources and absent from the generated docs: types unknown.
    assert has_kernel("cuda", "", "NonMaxSuppression", 11, TensorProto.FLOAT) is None
    with pytest.raises(AutocastError, match="no kernel table"):
        has_kernel("rocm", "", "Conv", 17, TensorProto.FLOAT16)


# ---- ties: type parameters a kernel binds to one type ----------------------------------------------------------


def test_kernel_ties_are_read_from_the_kernel_definitions():
    """tools/kernel_tables.py reads each kernel definition's builder: constraints bound to one template type."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from kernel_tables import kernel_ties

    source = """
#define REGISTER_KERNEL_TYPED(T)                                    \\
  ONNX_OPERATOR_TYPED_KERNEL_EX(                                    \\
      BatchNormalization, kOnnxDomain, 15, T, kCudaExecutionProvider, \\
      (*KernelDefBuilder::Create())                                 \\
          .TypeConstraint("T", DataTypeImpl::GetTensorType<T>())     \\
          .TypeConstraint("T1", DataTypeImpl::GetTensorType<T>())    \\
          .TypeConstraint("T2", DataTypeImpl::GetTensorType<T>()),   \\
      BatchNorm<T>);
ONNX_OPERATOR_KERNEL_EX(LayerNormalization, kOnnxDomain, 17, kCudaExecutionProvider,
    (*KernelDefBuilder::Create()).TypeConstraint("T", DataTypeImpl::GetTensorType<MLFloat16>())
        .TypeConstraint("U", DataTypeImpl::GetTensorType<float>()), LayerNorm);
"""
    assert kernel_ties(source) == [("BatchNormalization", "", 15, None, [["T", "T1", "T2"]])]


def test_the_shipped_table_ties_batch_normalization():
    rows = {(r["op"], r["since"]): r for r in kernel_table("cuda")["kernels"] if r["domain"] == ""}
    assert rows[("BatchNormalization", 15)]["tied"] == [["T", "T1", "T2"]]
    assert rows[("GridSample", 16)]["tied"] == [["T1", "T2"]]
    assert "tied" not in rows[("MatMul", 13)]


# ---- what onnxruntime-gpu 1.31.1 ran on a GPU (data/kernels_cuda_observed.json) ----------------------------------


def test_the_probed_table_records_where_it_was_made():
    from autocast_onnx.catalog.kernels import _observed, observed_version

    table = kernel_table("cuda")
    assert observed_version("cuda") == "1.31.1"
    assert _observed("cuda")[("Conv", TensorProto.BFLOAT16, 22)] is True
    assert table["source"]["commit"].startswith("577eac9")


def test_the_sources_never_claim_a_kernel_the_runtime_lacked(monkeypatch):
    """Every one-node probe the 1.23.0 sources and the 1.31.1 runtime disagree on is a kernel added since (sources:
    none, runtime: ran on CUDA): never a kernel the sources list that the runtime did not run. That holds only with
    ONNX Runtime's version matching (an open-ended registration covers its own schema version only)."""
    import json

    from autocast_onnx.catalog import kernels

    path = Path(kernels.__file__).resolve().parent.parent / "data" / "kernels_cuda_observed.json"
    probes = json.loads(path.read_text())["probes"]
    monkeypatch.setattr(kernels, "_observed", lambda runtime: {})
    types = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
    added, missing = [], []
    for probe in probes:
        said = has_kernel("cuda", "", probe["op"], probe["opset"], types[probe["type"]])
        ran = probe["ran_on"] == "cuda"
        if said is True and not ran:
            missing.append(probe)
        elif said is False and ran:
            added.append((probe["op"], probe["type"], probe["opset"]))
    assert missing == []
    assert ("Conv", "bf16", 22) in added and ("ReduceMean", "bf16", 13) in added  # new in 1.31
