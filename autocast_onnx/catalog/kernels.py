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

RUNTIMES = ("cuda",)


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


def has_kernel(runtime: str, domain: str, op: str, opset: int, elem_type: int) -> bool | None:
    """Whether `runtime` registers a kernel for `op` of `domain` at `opset` for tensors of `elem_type`.

    `elem_type` is a TensorProto data type (FLOAT16, BFLOAT16, ...); `opset` is the model's opset of `domain`.
    None where the table cannot tell: the op is not in the table at all (the runtime may still run it through
    a kernel of another domain or a fused form), or its kernel's types are not recorded. False where the op is
    known but no registration covers that opset and type, including opsets the runtime registers nothing for.
    """
    rows = _rows(runtime).get((normalize_domain(domain), op))
    if not rows:
        return None
    name = TensorProto.DataType.Name(elem_type).lower()
    # The newest registration that covers the opset wins: ONNX Runtime keeps an old open-ended one beside a
    # newer one for a few ops (ThresholdedRelu since 1, from the contrib file, and since 10).
    covering = [r for r in rows if r["since"] <= opset and (r["until"] is None or opset <= r["until"])]
    if not covering:
        return False
    row = max(covering, key=lambda r: r["since"])
    return name in row["types"] if row["types"] else None
