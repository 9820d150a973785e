"""The DirectML kernel table (autocast_onnx/data/kernels_dml.json) against the ONNX Runtime sources it was read from.

The facts below were read by hand from OperatorRegistration.cpp at the recorded commit (the supportedTypeList*
each op is registered with) and from ONNX Runtime's kernel matching rule (a DML registration serves only nodes
whose schema version equals its start opset). The regeneration test needs the stored ONNX Runtime tree and skips
without it; the others read the shipped table only.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE_PATH = ROOT / "autocast_onnx" / "data" / "kernels_dml.json"
MIRROR = pathlib.Path("/work/.mirror/gedoensmax+onnxruntime/repo")
COMMIT = "7e59947dcf8f489f02e1d9dfb7ca0f3de0d677d0"
TYPES = {
    "float", "float16", "bfloat16", "double", "bool", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "string", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
}  # fmt: skip


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads(TABLE_PATH.read_text(encoding="utf-8"))


def rows(table: dict, op: str, domain: str = "") -> list[dict]:
    return [r for r in table["kernels"] if r["op"] == op and r["domain"] == domain]


def covering(table: dict, op: str, opset: int, domain: str = "") -> dict | None:
    found = [r for r in rows(table, op, domain) if r["since"] <= opset and (r["until"] is None or opset <= r["until"])]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_header_names_version_commit_and_gap(table: dict) -> None:
    assert table["runtime"] == "dml"
    assert table["onnxruntime"] == "1.23.0"
    assert table["source"]["repo"] == "microsoft/onnxruntime"
    assert table["source"]["commit"] == COMMIT
    assert table["source"]["commit_date"] == "2025-07-25T01:02:31-07:00"
    assert table["source"]["files"][0].endswith("DmlExecutionProvider/src/Operators/OperatorRegistration.cpp")
    assert table["cross_checked_with"] == "docs/OperatorKernels.md"
    assert table["generated_by"] == "tools/kernel_tables_dml.py"
    assert "1.23.0" in table["note"] and "1.31" in table["note"]
    assert table["onnx_schemas"]["vendored_onnx"] == "1.18.0" and table["onnx_schemas"]["max_opset"] == 23


def test_float_only_ops(table: dict) -> None:
    # supportedTypeListRange = Int16|Int32|Int64|Float32; supportedTypeListIsInf = {Float32, Bool}
    assert covering(table, "Range", 11)["types"] == ["float", "int16", "int32", "int64"]
    for opset in (10, 20):
        assert "float16" not in covering(table, "IsInf", opset)["types"]
        assert "float" in covering(table, "IsInf", opset)["types"]
    assert covering(table, "DynamicQuantizeMatMul", 1, "com.microsoft")["types"] == ["float", "int8", "uint8"]


def test_fp16_ops(table: dict) -> None:
    for op, opset in (("MatMul", 13), ("Gemm", 13), ("Softmax", 13), ("Erf", 13), ("LayerNormalization", 17)):
        assert {"float", "float16"} <= set(covering(table, op, opset)["types"]), op
    assert covering(table, "Gelu", 1, "com.microsoft")["types"] == ["float", "float16"]


def test_fp16_only_from_a_later_opset(table: dict) -> None:
    # supportedTypeListQuantizeLinear (opsets 10, 13) lists Float32|Int32; QuantizeLinear19 adds Float16
    assert "float16" not in covering(table, "QuantizeLinear", 10)["types"]
    assert "float16" not in covering(table, "QuantizeLinear", 18)["types"]
    assert "float16" in covering(table, "QuantizeLinear", 19)["types"]


def test_no_bfloat16_compute_kernel(table: dict) -> None:
    with_bf16 = {r["op"] for r in table["kernels"] if "bfloat16" in r["types"]}
    assert with_bf16 <= {"If", "OptionalGetElement", "OptionalHasElement", "SequenceAt", "SequenceConstruct"}
    assert all(r.get("types_from") == "docs" for r in table["kernels"] if "bfloat16" in r["types"])


def test_opsets_without_a_registration(table: dict) -> None:
    # Conv is registered at 1 and 11 only; ONNX revised it at 22, so a Conv-22 node finds no DML kernel.
    assert [(r["since"], r["until"]) for r in rows(table, "Conv")] == [(1, 10), (11, 21)]
    assert covering(table, "Conv", 22) is None
    # Dropout is registered at 7 only (ONNX revised it at 10): opsets 7 to 9.
    assert [(r["since"], r["until"]) for r in rows(table, "Dropout")] == [(7, 9)]
    # MatMul's last registration is its newest schema version: open-ended.
    assert rows(table, "MatMul")[-1]["until"] is None


def test_rows_are_well_formed(table: dict) -> None:
    seen: dict[tuple[str, str], list[dict]] = {}
    for row in table["kernels"]:
        assert set(row) <= {"domain", "op", "since", "until", "types", "types_from"}, row
        assert row["domain"] in ("", "com.microsoft"), row
        assert isinstance(row["since"], int) and row["since"] >= 1, row
        assert row["until"] is None or row["until"] >= row["since"], row
        # SequenceEmpty's only constraint is a sequence type: no tensor type to record
        assert row["types"] or row["op"] == "SequenceEmpty", row
        assert set(row["types"]) <= TYPES and row["types"] == sorted(row["types"]), row
        assert row.get("types_from", "docs") == "docs", row
        seen.setdefault((row["domain"], row["op"]), []).append(row)
    for regs in seen.values():
        regs = sorted(regs, key=lambda r: r["since"])
        for before, after in itertools.pairwise(regs):
            assert before["until"] is not None and before["until"] < after["since"], (before, after)
    assert len(table["kernels"]) == 414 and len(seen) == 196


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the stored ONNX Runtime git tree (absent in CI)")
def test_shipped_table_is_what_the_script_writes(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("kernel_tables_dml", ROOT / "tools" / "kernel_tables_dml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "kernels_dml.json"
    monkeypatch.setattr(
        sys, "argv", ["kernel_tables_dml.py", "--git-dir", str(MIRROR), "--ref", COMMIT, "--out", str(out)]
    )
    module.main()
    assert out.read_text(encoding="utf-8") == TABLE_PATH.read_text(encoding="utf-8")
