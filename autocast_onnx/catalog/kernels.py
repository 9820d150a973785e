"""Which kernels a runtime registers: lookups in the shipped kernel tables (data/kernels_<runtime>.json).

A schema says an op *may* take fp16; a runtime's kernel table says whether the runtime *has* a kernel for it.
Where the runtime has none, ONNX Runtime places the node on the CPU provider with copies around it, so the
planner keeps such nodes in fp32. The tables are written by tools/kernel_tables.py from the runtime's own
registration sources; each records the runtime version and the commit it was read from.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from onnx import TensorProto

from ..errors import AutocastError
from .loader import normalize_domain

RUNTIMES = ("cuda", "tensorrt")
_FLOATS = {"float", "double", "float16", "bfloat16"}


@cache
def kernel_table(runtime: str) -> dict:
    """The whole table of `runtime` as written by tools/kernel_tables.py."""
    if runtime not in RUNTIMES:
        raise AutocastError(
            f"no kernel table for runtime {runtime!r}", "--runtime", f"use one of: {', '.join(RUNTIMES)}"
        )
    path = Path(__file__).resolve().parent.parent / "data" / f"kernels_{runtime}.json"
    return json.loads(path.read_text(encoding="utf-8"))


@cache
def _rows(runtime: str) -> dict[tuple[str, str], list[dict]]:
    rows: dict[tuple[str, str], list[dict]] = {}
    for row in kernel_table(runtime)["kernels"]:
        rows.setdefault((row["domain"], row["op"]), []).append(row)
    return rows


def _tensorrt_kernel(op: str, opset: int, name: str) -> bool | None:
    """TensorRT's answer from the onnx-tensorrt operator matrix: it has no opset ranges per op, one range for
    the whole matrix (`opset_range`); outside it, and for an op the matrix does not list, the answer is None."""
    table = kernel_table("tensorrt")
    low, high = table["opset_range"]
    row = _trt_rows().get(op)
    if row is None or not low <= opset <= high:
        return None
    return bool(row["supported"]) and name in row["types"]


@cache
def _trt_rows() -> dict[str, dict]:
    return {row["op"]: row for row in kernel_table("tensorrt")["ops"]}


def runtime_label(runtime: str) -> str:
    """The runtime and the version its table was read for: "onnxruntime-cuda 1.23.0", "TensorRT 10.0"."""
    table = kernel_table(runtime)
    if runtime == "tensorrt":
        return f"TensorRT {table['tensorrt']}"
    return f"onnxruntime-{runtime} {table['onnxruntime']}"


def no_kernel_message(runtime: str, op: str, opset: int, target: str) -> str:
    """Why a node of `op` stays fp32 for `runtime`: the sentence the plan and `explain` show."""
    if runtime == "tensorrt":
        return f"{runtime_label(runtime)} does not support {target} for {op} (opset {opset}); the node stays fp32"
    return (
        f"no {target} kernel for {op} in {runtime_label(runtime)} (opset {opset}): "
        "it would run on the CPU provider with copies around it"
    )


def has_kernel(runtime: str, domain: str, op: str, opset: int, elem_type: int) -> bool | None:
    """Whether `runtime` registers a kernel for `op` of `domain` at `opset` for tensors of `elem_type`.

    `elem_type` is a TensorProto data type (FLOAT16, BFLOAT16, ...); `opset` is the model's opset of `domain`.
    None where the table cannot tell: the op is not in the table at all (the runtime may still run it through
    a kernel of another domain or a fused form), or its kernel's types are not recorded. False where the op is
    known but no registration covers that opset and type, including opsets the runtime registers nothing for.
    """
    name = TensorProto.DataType.Name(elem_type).lower()
    if runtime == "tensorrt":
        return _tensorrt_kernel(op, opset, name) if normalize_domain(domain) == "" else None
    rows = _rows(runtime).get((normalize_domain(domain), op))
    if not rows:
        return None
    # The newest registration that covers the opset wins: ONNX Runtime keeps an old open-ended one beside a
    # newer one for a few ops (ThresholdedRelu since 1, from the contrib file, and since 10).
    covering = [r for r in rows if r["since"] <= opset and (r["until"] is None or opset <= r["until"])]
    if not covering:
        return False
    row = max(covering, key=lambda r: r["since"])
    if not _FLOATS & set(row["types"]):
        # the types recorded are of another constraint than the data's (Slice: its index type, int32/int64; the
        # kernel itself takes any data type): the table cannot tell
        return None
    return name in row["types"]
