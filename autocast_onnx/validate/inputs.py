"""Stage: validate / inputs. Describes a model's inputs and produces batches for them: from
.npz files, or generated realistically per input (token ids within the embedding table,
attention masks with padded and fully masked rows, floats from a normal or a given range)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import AutocastError

BATCH_HINT = re.compile(r"batch|^n$|^b$", re.I)
SEQ_HINT = re.compile(r"seq|len|token|position|time|step", re.I)
# Batch 3 so that generated attention masks hold a full, a padded and a fully masked row.
DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_OTHER = 3, 16, 8


@dataclass
class InputSpec:
    name: str
    elem_type: int
    dims: list            # int, str (symbolic) or None (unknown)
    vocab: int | None = None   # size of the embedding table the input indexes, when found


@dataclass
class InputPlan:
    """How inputs are produced: the specs, the symbolic dims used (and which were defaults)."""
    specs: list[InputSpec]
    dims: dict = field(default_factory=dict)           # symbolic name -> value
    dim_defaults: list = field(default_factory=list)   # names that took a default
    ranges: dict = field(default_factory=dict)         # input name -> (lo, hi)
    source: str = "generated"


def describe_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    inits = {t.name for t in model.graph.initializer}
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        dims = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        specs.append(InputSpec(vi.name, t.elem_type, dims, _vocab(vi.name, consumers, tables)))
    return specs


def _vocab(name, consumers, tables, depth=0):
    """The first dimension of an embedding table this input indexes (through Cast/Reshape/...)."""
    if depth > 4:
        return None
    for node, port in consumers.get(name, []):
        if node.op_type == "Gather" and port == 1 and node.input[0] in tables:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = tables[node.input[0]]
            return int(dims[axis]) if dims else None
        if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand") and port == 0:
            found = _vocab(node.output[0], consumers, tables, depth + 1)
            if found:
                return found
    return None


def parse_assignments(items, what: str, kind=int) -> dict:
    """NAME=VALUE pairs with positive values (dimension sizes)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise AutocastError(f"--{what} needs NAME=VALUE, got {item!r}", f"--{what}", "e.g. batch=4")
        try:
            number = kind(value)
        except ValueError:
            raise AutocastError(f"bad value in --{what} {item!r}", f"--{what}", "give a whole number") from None
        if number < 1:
            raise AutocastError(f"--{what} {item!r}: sizes must be at least 1", f"--{what}", "e.g. batch=4")
        out[key] = number
    return out


def parse_ranges(items) -> dict:
    out = {}
    for item in items:
        m = re.fullmatch(r"\s*([^=]+?)\s*=\s*(-?[\d.eE+-]+)\s*:\s*(-?[\d.eE+-]+)\s*", item)
        if not m:
            raise AutocastError(f"--input-range needs NAME=LO:HI, got {item!r}", "--input-range", "e.g. input_ids=0:30522")
        try:
            lo, hi = float(m.group(2)), float(m.group(3))
        except ValueError:
            raise AutocastError(f"--input-range {item!r}: LO and HI must be numbers", "--input-range",
                                "e.g. input_ids=0:30522") from None
        if not hi > lo:
            raise AutocastError(f"--input-range {item!r}: HI must be greater than LO", "--input-range", "swap them")
        out[m.group(1)] = (lo, hi)
    return out


def plan_inputs(specs: list[InputSpec], dims: dict | None = None, ranges: dict | None = None) -> InputPlan:
    dims = dict(dims or {})
    plan = InputPlan(specs=specs, ranges=dict(ranges or {}))
    for spec in specs:
        for d in spec.dims:
            if isinstance(d, str) and d not in dims:
                dims[d] = DEFAULT_BATCH if BATCH_HINT.search(d) else DEFAULT_SEQ if SEQ_HINT.search(d) else DEFAULT_OTHER
                plan.dim_defaults.append(d)
    symbolic = {d for s in specs for d in s.dims if isinstance(d, str)}
    stray = set(dims) - symbolic - set(plan.dim_defaults)
    if stray:
        raise AutocastError(f"--dim names no symbolic dimension of the inputs: {', '.join(sorted(stray))}", "--dim",
                            "symbolic dimensions are: " + (", ".join(sorted(symbolic)) or "none"))
    unknown = set(plan.ranges) - {s.name for s in specs}
    if unknown:
        raise AutocastError(f"--input-range names unknown input(s): {', '.join(sorted(unknown))}", "--input-range",
                            "inputs are: " + ", ".join(s.name for s in specs))
    plan.dims = dims
    return plan


def _shape(spec: InputSpec, dims: dict) -> tuple:
    shape = []
    for k, d in enumerate(spec.dims):
        if isinstance(d, int) and d >= 0:      # a declared size, 0 included
            shape.append(d)
        elif isinstance(d, str):
            shape.append(dims[d])
        else:
            shape.append(DEFAULT_BATCH if k == 0 else DEFAULT_OTHER)
    return tuple(shape)


GENERATED_LIMIT = 2**31   # bytes of generated inputs per batch


def generate(plan: InputPlan, seed: int = 0) -> dict:
    """One batch of realistic inputs."""
    rng = np.random.default_rng(seed)
    total = 0
    for spec in plan.specs:
        shape = _shape(spec, plan.dims)
        total += int(np.prod(shape, dtype=np.float64)) * np.dtype(helper.tensor_dtype_to_np_dtype(spec.elem_type)).itemsize
    if total > GENERATED_LIMIT:
        biggest = max(plan.specs, key=lambda s: np.prod(_shape(s, plan.dims), dtype=np.float64))
        raise AutocastError(f"generated inputs would take {total / 2**30:.3g} GiB (input '{biggest.name}' has shape "
                            f"{list(_shape(biggest, plan.dims))})", "--inputs",
                            "set smaller symbolic dimensions with --dim, or pass your own batches with --inputs")
    feeds = {}
    for spec in plan.specs:
        shape = _shape(spec, plan.dims)
        np_type = helper.tensor_dtype_to_np_dtype(spec.elem_type)
        lo_hi = plan.ranges.get(spec.name)
        lname = spec.name.lower()
        if spec.elem_type == TensorProto.BOOL:
            feeds[spec.name] = rng.random(shape) < 0.5
        elif np.issubdtype(np_type, np.integer):
            if "mask" in lname and lo_hi is None:
                feeds[spec.name] = attention_mask(shape).astype(np_type)
            else:
                lo, hi = lo_hi if lo_hi else (0, spec.vocab if spec.vocab else 2 if "type" in lname else 100)
                feeds[spec.name] = rng.integers(int(lo), int(hi), size=shape).astype(np_type)
        else:
            if "mask" in lname and lo_hi is None:
                feeds[spec.name] = attention_mask(shape).astype(np_type)
            elif lo_hi:
                feeds[spec.name] = rng.uniform(lo_hi[0], lo_hi[1], size=shape).astype(np_type)
            else:
                feeds[spec.name] = rng.standard_normal(shape).astype(np_type)
    return feeds


def attention_mask(shape: tuple) -> np.ndarray:
    """1 for visible positions, 0 for padding: row 0 full, row 1 padded after ~2/3, the last
    row (when there are 3 or more) fully masked."""
    mask = np.ones(shape, dtype=np.int64)
    if len(shape) < 2 or shape[-1] < 2:
        return mask
    rows = mask.reshape(-1, shape[-1])
    if rows.shape[0] >= 2:
        rows[1, max(1, (2 * shape[-1]) // 3):] = 0
    if rows.shape[0] >= 3:
        rows[-1, :] = 0
    return rows.reshape(shape)


def load_batches(path: str | Path, specs: list[InputSpec]) -> list[dict]:
    """Batches from one .npz file or a directory of them (sorted by name)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise AutocastError("no .npz files in the inputs folder", str(path), "add NAME.npz files, one per batch")
    elif path.is_file():
        files = [path]
    else:
        raise AutocastError("inputs path not found", str(path), "give an .npz file or a folder of them")
    names = {s.name: s for s in specs}
    batches = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as data:
                batch = {k: data[k] for k in data.files}
        except Exception as exc:  # numpy raises several types for a bad archive
            raise AutocastError(f"cannot read .npz: {exc}", str(f), "write it with numpy.savez") from None
        missing = set(names) - set(batch)
        if missing:
            raise AutocastError(f"missing input(s) {', '.join(sorted(missing))}", str(f),
                                "the archive needs one array per model input, named like the input")
        for name, spec in names.items():
            want = helper.tensor_dtype_to_np_dtype(spec.elem_type)
            if batch[name].dtype != want:
                batch[name] = batch[name].astype(want)
        batches.append({k: batch[k] for k in names})
    return batches
