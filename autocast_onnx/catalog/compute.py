"""How a runtime's kernels compute at fp16 and bf16: lookups in the shipped compute tables
(data/compute_<runtime>.json, written by tools/kernel_compute.py from the runtime's sources).

catalog/kernels.py says whether a runtime *has* a kernel for an op at a low type; this module says how that kernel
*computes*: whether, given low-precision inputs and writing low-precision outputs, it converts its inputs to float,
computes in float and rounds each output once (`ComputeFact.fp32_once`: it then computes exactly what an fp32 node
between two Casts computes from the same inputs), or keeps intermediates or constants in the low type, or does its
arithmetic in the low type itself. Each fact names the source lines it was read from, at the runtime's commit.

A fact states the kernel's general path (default attributes, every optional input present, default options);
`conditions` lists the other paths the table knows (other attribute values, an absent input, particular sizes,
provider options), each with its own compute and rounding: ONNX Runtime's Softmax, for one, rounds intermediates
on rows of 1025 to 2048 elements in batches of 8192 rows or more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from onnx import TensorProto

from ..errors import AutocastError
from ..graph.domains import normalize_domain
from ..runtimes import RUNTIMES

_LOW_NAMES: dict[int, str] = {int(TensorProto.FLOAT16): "float16", int(TensorProto.BFLOAT16): "bfloat16"}


@dataclass(frozen=True)
class ComputeCondition:
    """Another path of the kernel: `when` it is taken, how it computes and rounds there, and why (`note`)."""

    when: str
    compute: str
    rounds: str
    note: str
    source: str

    @property
    def fp32_once(self) -> bool:
        return self.compute == "float" and self.rounds == "once"


@dataclass(frozen=True)
class ComputeFact:
    """How `runtime`'s kernel for `op` computes at one low type.

    `compute`: "float" (the arithmetic is float, from the inputs converted exactly) or "native" (some of it is in the
    low type); `rounds`: "once" (each output rounded to the low type once), "per-step" (intermediates or constants
    rounded to the low type inside the kernel) or "unknown"; `source`: "file:lines@commit" of the code it rests on;
    `note`: what the kernel does, in words."""

    op: str
    compute: str
    rounds: str
    source: str
    note: str
    domain: str = ""
    low_type: int = TensorProto.FLOAT16
    runtime: str = "onnxruntime-cuda"
    version: str = ""
    conditions: tuple[ComputeCondition, ...] = ()

    @property
    def label(self) -> str:
        """The runtime and the version its table was read for: "onnxruntime-cuda 1.23.0", "TensorRT 10.0"."""
        name = "TensorRT" if self.runtime == "tensorrt" else self.runtime
        return f"{name} {self.version}"

    @property
    def fp32_once(self) -> bool:
        """Whether the kernel's general path computes in float and rounds each output once."""
        return self.compute == "float" and self.rounds == "once"

    @property
    def fp32_once_on_every_path(self) -> bool:
        """fp32_once, and so is every other path the table lists (`conditions`)."""
        return self.fp32_once and all(c.fp32_once for c in self.conditions)


@cache
def compute_table(runtime: str) -> dict:
    """The whole compute table of `runtime` ("cuda", "tensorrt", "dml") as tools/kernel_compute.py writes it."""
    if runtime not in RUNTIMES:
        raise AutocastError(
            f"no compute table for runtime {runtime!r}", "--runtime", f"use one of: {', '.join(RUNTIMES)}, any"
        )
    path = Path(__file__).resolve().parent.parent / "data" / f"compute_{runtime}.json"
    return json.loads(path.read_text(encoding="utf-8"))


@cache
def _rows(runtime: str) -> dict[tuple[str, str, str], dict]:
    """(domain, op, low type name) -> the table row that covers it."""
    return {(row["domain"], row["op"], name): row for row in compute_table(runtime)["ops"] for name in row["types"]}


def _at(source: str, commit: str) -> str:
    return f"{source}@{commit[:9]}"


@lru_cache(maxsize=4096)  # pure: the tables are read once; the planner asks per node
def computes_in_fp32(runtime: str | None, domain: str, op: str, low_type: int) -> ComputeFact | None:
    """How `runtime`'s kernel for `op` of `domain` computes with inputs and outputs of `low_type` (TensorProto
    FLOAT16 or BFLOAT16): a ComputeFact, whose `fp32_once` says whether it computes in fp32 and rounds once.

    `runtime` None is the design's runtime, ONNX Runtime's CUDA provider; "any" counts on no runtime and answers
    None. None also where the table does not list the op at that type, or lists it as not known (DirectML's
    arithmetic is in DirectML.dll; TensorRT's is its own), and for any other type. The table describes every
    registered opset version of the op alike: where a version computes otherwise, its row says so in `note`."""
    if runtime == "any":
        return None
    runtime = runtime or "cuda"
    name = _LOW_NAMES.get(low_type)
    row = _rows(runtime).get((normalize_domain(domain), op, name)) if name is not None else None
    if row is None or row["compute"] is None:
        return None
    table = compute_table(runtime)
    commit = table["commit"]
    conditions = tuple(
        ComputeCondition(c["when"], c["compute"], c["rounds"], c["note"], _at(c["source"], commit))
        for c in row["conditions"]
    )
    return ComputeFact(
        op=op,
        compute=row["compute"],
        rounds=row["rounds"],
        source=_at(row["source"], commit),
        note=row["note"],
        domain=row["domain"],
        low_type=low_type,
        runtime=table["runtime"],
        version=table["version"],
        conditions=conditions,
    )
