"""Port signatures of ops: for each input and output, its type parameter and the types that
parameter admits. From the `onnx` package's schemas at the model's opset for ONNX domains,
and from the shipped tables data/ort_signatures.json (ONNX Runtime's own ops) and
data/ort_training_signatures.json (the gradient, loss and optimizer ops of onnxruntime-training,
transcribed from its source: see tools/gen_ort_training_signatures.py). Read-only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import onnx.defs
from onnx import TensorProto

from .domains import normalize_domain

_TYPE_OF_STR = {}
for _name, _value in TensorProto.DataType.items():
    if _value:
        _TYPE_OF_STR[f"tensor({_name.lower()})"] = _value
_TYPE_OF_STR["tensor(float)"] = TensorProto.FLOAT
_TYPE_OF_STR["tensor(double)"] = TensorProto.DOUBLE
_TYPE_OF_STR["tensor(float16)"] = TensorProto.FLOAT16
_TYPE_OF_STR["tensor(bfloat16)"] = TensorProto.BFLOAT16


def type_of_str(type_str: str) -> int | None:
    return _TYPE_OF_STR.get(type_str)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[str, ...]  # type parameter (or concrete "tensor(x)") of each formal input
    input_variadic: bool  # the last formal input repeats
    outputs: tuple[str, ...]
    output_variadic: bool
    params: dict  # param -> frozenset of element types it admits (tensors only)
    since_version: int

    def input_param(self, i: int) -> str | None:
        if i < len(self.inputs):
            return self.inputs[i]
        return self.inputs[-1] if self.input_variadic and self.inputs else None

    def output_param(self, i: int) -> str | None:
        if i < len(self.outputs):
            return self.outputs[i]
        return self.outputs[-1] if self.output_variadic and self.outputs else None

    def param_types(self, in_types, out_types) -> dict[str, int]:
        """{type parameter: element type} for a node whose ports hold `in_types` and `out_types` (None where a
        port is absent or its type is not known); the first port of a parameter gives its type."""
        out: dict[str, int] = {}
        for types, param_of in ((in_types, self.input_param), (out_types, self.output_param)):
            for i, elem in enumerate(types):
                param = param_of(i)
                if elem and param is not None:
                    out.setdefault(param, elem)
        return out

    def allowed(self, param: str | None) -> frozenset | None:
        """Element types a port with this param admits (None if unknown)."""
        if param is None:
            return None
        if param in self.params:
            return self.params[param]
        concrete = type_of_str(param)
        return frozenset({concrete}) if concrete is not None else None


def _types(strs) -> frozenset:
    return frozenset(t for t in (type_of_str(s) for s in strs) if t is not None)


@cache
def _ort_table() -> dict:
    data = Path(__file__).resolve().parent.parent / "data"
    table = json.loads((data / "ort_signatures.json").read_text())
    table.update(json.loads((data / "ort_training_signatures.json").read_text()))
    return table


@lru_cache(maxsize=4096)
def lookup(domain: str, op_type: str, opset: int | None) -> Signature | None:
    """Signature of `op_type` in `domain` at `opset`, or None if no schema is known."""
    domain = normalize_domain(domain)
    if domain in ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"):
        try:
            schema = onnx.defs.get_schema(op_type, opset if opset else onnx.defs.onnx_opset_version(), domain)
        except onnx.defs.SchemaError:
            schema = None
        if schema is not None:
            var = onnx.defs.OpSchema.FormalParameterOption.Variadic
            return Signature(
                inputs=tuple(p.type_str for p in schema.inputs),
                input_variadic=bool(schema.inputs) and schema.inputs[-1].option == var,
                outputs=tuple(p.type_str for p in schema.outputs),
                output_variadic=bool(schema.outputs) and schema.outputs[-1].option == var,
                params={c.type_param_str: _types(c.allowed_type_strs) for c in schema.type_constraints},
                since_version=schema.since_version,
            )
    key = f"{domain}:{op_type}" if domain else op_type
    entry = _ort_table().get(key)
    if entry is None:
        return None
    return Signature(
        inputs=tuple(p[1] for p in entry["inputs"]),
        input_variadic=bool(entry["inputs"]) and entry["inputs"][-1][2] == "variadic",
        outputs=tuple(p[1] for p in entry["outputs"]),
        output_variadic=bool(entry["outputs"]) and entry["outputs"][-1][2] == "variadic",
        params={k: _types(v) for k, v in entry["params"].items()},
        since_version=entry["since_version"],
    )
