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

from ..dtypes import dtype_name
from ..errors import AutocastError
from ..graph import signatures
from ..graph.domains import normalize_domain
from ..runtimes import RUNTIMES

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
    """The runtime and the version its table was read for: "onnxruntime-cuda 1.23.0 (probed on 1.31.1)",
    "onnxruntime-directml 1.23.0", "TensorRT 10.0"."""
    table = kernel_table(runtime)
    if runtime == "tensorrt":
        return f"TensorRT {table['tensorrt']}"
    probed = observed_version(runtime)
    name = "directml" if runtime == "dml" else runtime
    return f"onnxruntime-{name} {table['onnxruntime']}" + (f" (probed on {probed})" if probed else "")


def no_kernel_message(runtime: str, op: str, opset: int, target: str) -> str:
    """Why a node of `op` in `target` has no kernel in `runtime`: the sentence the plan, `explain` and lint show."""
    if runtime == "tensorrt":
        return (
            f"{runtime_label(runtime)} does not support {target} for {op} (opset {opset}): a strongly typed engine "
            "build fails on this layer"
        )
    return (
        f"no {target} kernel for {op} in {runtime_label(runtime)} (opset {opset}): "
        "it would run on the CPU provider with copies around it"
    )


def missing_kernel(
    runtime: str, domain: str, op: str, opset: int, low_types, param_types: dict[str, int]
) -> str | None:
    """Why `runtime` cannot run a node of `op` whose fp16/bf16 types are `low_types` and whose type parameters
    take `param_types` (Signature.param_types): no kernel for one of the types (has_kernel False), or a tie the
    types split (split_tie); None where it can, or the table cannot tell. The planner asks it of the types a plan
    would give a node, lint of the types a model has."""
    for elem_type in low_types:
        if has_kernel(runtime, domain, op, opset, elem_type) is False:
            return no_kernel_message(runtime, op, opset, dtype_name(elem_type))
    group = split_tie(runtime, domain, op, opset, param_types) if low_types else None
    return split_tie_message(runtime, op, opset, group, param_types) if group else None


def node_version(domain: str, op: str, opset: int) -> int:
    """The version ONNX Runtime matches kernels against: the since-version of `op`'s schema at the model's
    `opset` for the ONNX domains (Conv at opset 17 is Conv-11), the opset itself for others."""
    if normalize_domain(domain) not in ("", "ai.onnx.ml"):
        return opset
    sig = signatures.lookup(domain, op, opset)
    return sig.since_version if sig is not None else opset


def _covering_row(runtime: str, domain: str, op: str, opset: int) -> dict | None:
    """The registration of `op` that ONNX Runtime would match for a node at the model's `opset`, or None.

    As ONNX Runtime's kernel registry matches (VerifyVersion, onnxruntime/core/framework/kernel_registry.cc): a
    registration with an end version covers the node versions from its start to its end; an open-ended one
    covers exactly its start version, since a later schema version may need a kernel it does not have (Conv
    registered since 11 does not run a Conv-22 node). The newest covering registration wins (ONNX Runtime keeps
    an old one beside a newer one for a few ops: ThresholdedRelu from the contrib file since 1, and since 10)."""
    version = node_version(domain, op, opset)
    rows = _rows(runtime).get((normalize_domain(domain), op)) or []
    covering = [
        r for r in rows if r["since"] == version or (r["until"] is not None and r["since"] <= version <= r["until"])
    ]
    return max(covering, key=lambda r: r["since"]) if covering else None


@cache
def _observed(runtime: str) -> dict[tuple[str, int, int], bool]:
    """(op, TensorProto type, node version) -> whether the runtime ran a one-node model of it on the GPU, from
    data/kernels_<runtime>_observed.json (tools/gpu_placement.py --probes --record on a GPU): where the pinned
    GPU build was probed, its behaviour overrides the sources' table, which may be of an older version."""
    path = Path(__file__).resolve().parent.parent / "data" / f"kernels_{runtime}_observed.json"
    if not path.exists():
        return {}
    types = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
    table = json.loads(path.read_text(encoding="utf-8"))
    return {
        (row["op"], types[row["type"]], node_version("", row["op"], row["opset"])): row["ran_on"] == "cuda"
        for row in table["probes"]
        if row["type"] in types
    }


def observed_version(runtime: str) -> str | None:
    """The runtime version the observed table was probed on ("1.31.1"), or None without one."""
    path = Path(__file__).resolve().parent.parent / "data" / f"kernels_{runtime}_observed.json"
    return json.loads(path.read_text(encoding="utf-8"))["onnxruntime"] if path.exists() else None


def split_tie(runtime: str, domain: str, op: str, opset: int, param_types: dict[str, int]) -> list[str] | None:
    """The type parameters of `op` that `runtime`'s kernel binds to one type (tools/kernel_tables.py reads the
    kernel definitions' builders: the CUDA BatchNormalization kernel from opset 15 takes T1 and T2 of the data's
    type T) but that `param_types` (type parameter -> TensorProto type, for the ports a node has) gives two
    types; None where no such group is split, or the table records none.

        BatchNormalization, opset 17, {"T": FLOAT16, "T1": FLOAT, "T2": FLOAT} -> ["T", "T1", "T2"]"""
    if runtime == "tensorrt":
        return None
    row = _covering_row(runtime, domain, op, opset)
    for group in (row or {}).get("tied", ()):
        if len({param_types[p] for p in group if p in param_types}) > 1:
            return list(group)
    return None


def split_tie_message(runtime: str, op: str, opset: int, group: list[str], param_types: dict[str, int]) -> str:
    """Why a node whose types split a tied group has no kernel: the sentence the plan, `explain` and lint show."""
    named = ", ".join(f"{p} {TensorProto.DataType.Name(param_types[p]).lower()}" for p in group if p in param_types)
    return (
        f"no kernel for {op} with {named} in {runtime_label(runtime)} (opset {opset}): its kernel takes one type "
        f"for {', '.join(group)}, so it would run on the CPU provider with copies around it"
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
    if normalize_domain(domain) == "":
        seen = _observed(runtime).get((op, elem_type, node_version(domain, op, opset)))
        if seen is not None:
            return seen
    if not _rows(runtime).get((normalize_domain(domain), op)):
        return None
    row = _covering_row(runtime, domain, op, opset)
    if row is None:
        return False
    if not _FLOATS & set(row["types"]):
        # the types recorded are of another constraint than the data's (Slice: its index type, int32/int64; the
        # kernel itself takes any data type): the table cannot tell
        return None
    return name in row["types"]
