"""Stage: validate / inputs. Describes a model's inputs and produces batches for them: from
.npz files or Polygraphy's JSON input files (polygraphy_json.py), or generated realistically per
input (token ids within the embedding table, attention masks with padded and fully masked rows,
floats from a normal or a given range)."""

from __future__ import annotations

import math
import os
import re
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import AutocastError
from ..io import check_regular, open_regular, write_binary_output
from . import polygraphy_json

BATCH_HINT = re.compile(r"batch|^n$|^b$", re.I)
SEQ_HINT = re.compile(r"seq|len|token|position|time|step", re.I)
# Batch 3 so that generated attention masks hold a full, a padded and a fully masked row.
DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_OTHER = 3, 16, 8


@dataclass
class InputSpec:
    name: str
    elem_type: int
    dims: list  # int, str (symbolic) or None (unknown)
    vocab: int | None = None  # size of the embedding table the input indexes, when found
    ranked: bool = True  # False when the model declares no shape (then any rank is taken)
    sequence: bool = False  # a sequence of tensors (elem_type and dims are its tensors')


@dataclass
class InputPlan:
    """How inputs are produced: the specs, the symbolic dims used (and which were defaults)."""

    specs: list[InputSpec]
    dims: dict = field(default_factory=dict)  # symbolic name -> value
    dim_defaults: list = field(default_factory=list)  # names that took a default
    ranges: dict = field(default_factory=dict)  # input name -> (lo, hi)
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
        t, sequence = _tensor_type(vi)
        dims = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        vocab = _vocab(vi.name, consumers, tables)
        specs.append(InputSpec(vi.name, t.elem_type, dims, vocab, t.HasField("shape"), sequence))
    return specs


def _tensor_type(vi: onnx.ValueInfoProto) -> tuple[onnx.TypeProto.Tensor, bool]:
    """The tensor type of an input that takes tensors, and whether it takes a sequence of them:
    a tensor, a sequence of tensors, or either made optional (given here). Refuses the others (a
    map, a sparse tensor, a sequence of sequences), which validation cannot produce."""
    type_proto, sequence = vi.type, False
    if type_proto.HasField("optional_type"):
        type_proto = type_proto.optional_type.elem_type
    if type_proto.HasField("sequence_type"):
        type_proto, sequence = type_proto.sequence_type.elem_type, True
    if type_proto.HasField("tensor_type"):
        return type_proto.tensor_type, sequence
    raise AutocastError(
        f"input '{vi.name}' is a {_type_words(vi.type)}, which validation can neither generate nor read from an .npz",
        None,
        "validate a model whose inputs are tensors or sequences of tensors",
    )


def _type_words(type_proto: onnx.TypeProto) -> str:
    """A type in the words of ONNX Runtime's input types: seq(tensor), optional(map), ..."""
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        return f"seq({_type_words(type_proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_words(type_proto.optional_type.elem_type)})"
    return {"tensor_type": "tensor", "sparse_tensor_type": "sparse_tensor", "map_type": "map"}.get(kind or "", "?")


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


MAX_DIM = 2**31 - 1  # ONNX Runtime's limit on one dimension of an input


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
        if number > MAX_DIM:
            raise AutocastError(f"--{what} {item!r}: sizes must be at most {MAX_DIM}", f"--{what}", "e.g. batch=4")
        out[key] = number
    return out


def parse_ranges(items) -> dict:
    """NAME=LO:HI pairs (--input-range) -> {NAME: (LO, HI)}, finite numbers with HI > LO."""
    out = {}
    for item in items:
        parts = _range_parts(item)
        if parts is None:
            raise AutocastError(
                f"--input-range needs NAME=LO:HI, got {item!r}", "--input-range", "e.g. input_ids=0:30522"
            )
        name, lo_text, hi_text = parts
        try:
            lo, hi = float(lo_text), float(hi_text)
        except ValueError:
            raise AutocastError(
                f"--input-range {item!r}: LO and HI must be numbers", "--input-range", "e.g. input_ids=0:30522"
            ) from None
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise AutocastError(
                f"--input-range {item!r}: LO and HI must be finite numbers", "--input-range", "e.g. input_ids=0:30522"
            )
        if not hi > lo:
            raise AutocastError(f"--input-range {item!r}: HI must be greater than LO", "--input-range", "swap them")
        out[name] = (lo, hi)
    return out


def _range_parts(item: str) -> tuple[str, str, str] | None:
    """NAME, LO and HI of `NAME=LO:HI`, each stripped of whitespace, or None when `item` is not of
    that form: one '=' after a name that is not blank, then LO ':' HI made of digits, '.', 'e',
    'E', '+' and '-' (float() judges them). Split, not matched by a regex: linear in the length
    of the argument, however it is made."""
    name, sep, values = item.partition("=")
    lo, colon, hi = values.partition(":")
    name, lo, hi = name.strip(), lo.strip(), hi.strip()
    if not (sep and colon and name and _number_like(lo) and _number_like(hi)):
        return None
    return name, lo, hi


_NUMBER_CHARS = frozenset(".eE+-")


def _number_like(text: str) -> bool:
    """Not empty and made of decimal digits (any script's, as float() reads them) and . e E + -."""
    return bool(text) and all(ch.isdecimal() or ch in _NUMBER_CHARS for ch in text)


def plan_inputs(specs: list[InputSpec], dims: dict | None = None, ranges: dict | None = None) -> InputPlan:
    """How to generate the inputs of `specs`: `dims` sets symbolic dimensions by name (NAME=N) and
    unnamed dynamic ones by input and axis (INPUT:AXIS=N); every other symbolic dimension takes a
    default from its name. `ranges` sets the values of named inputs."""
    dims = dict(dims or {})
    plan = InputPlan(specs=specs, ranges=dict(ranges or {}))
    symbolic = {d for s in specs for d in s.dims if isinstance(d, str)}
    _check_axis_dims({k for k in dims if k not in symbolic}, specs, symbolic)
    for spec in specs:
        for d in spec.dims:
            if isinstance(d, str) and d not in dims:
                dims[d] = (
                    DEFAULT_BATCH if BATCH_HINT.search(d) else DEFAULT_SEQ if SEQ_HINT.search(d) else DEFAULT_OTHER
                )
                plan.dim_defaults.append(d)
    unknown = set(plan.ranges) - {s.name for s in specs}
    if unknown:
        raise AutocastError(
            f"--input-range names unknown input(s): {', '.join(sorted(unknown))}",
            "--input-range",
            "inputs are: " + ", ".join(s.name for s in specs),
        )
    for spec in specs:
        if spec.name in plan.ranges:
            _check_range(spec, *plan.ranges[spec.name])
    plan.dims = dims
    return plan


def axis_key(key: str, specs: list[InputSpec]) -> tuple[InputSpec, int] | None:
    """(the input, the axis) that a --dim key INPUT:AXIS names, or None when `key` is not of that
    form (an input name may itself hold ':', as in 'x:0': the last ':' splits)."""
    name, sep, axis = key.rpartition(":")
    spec = next((s for s in specs if s.name == name), None)
    if not sep or spec is None or not axis.strip().isdigit():
        return None
    return spec, int(axis)


def _check_axis_dims(keys: set, specs: list[InputSpec], symbolic: set) -> None:
    """Each --dim key that is no symbolic dimension must be INPUT:AXIS for an axis of that input
    with neither a size nor a name (a named one is set by its name, for every input that has it)."""
    for key in sorted(keys):
        found = axis_key(key, specs)
        if found is None:
            raise AutocastError(
                f"--dim names no symbolic dimension of the inputs: {key}",
                "--dim",
                "symbolic dimensions are: "
                + (", ".join(sorted(symbolic)) or "none")
                + "; an unnamed dynamic dimension is set as INPUT:AXIS=N",
            )
        spec, axis = found
        if not spec.ranked or axis >= len(spec.dims):
            rank = f"has {len(spec.dims)} axes {_dims_text(spec.dims)}" if spec.ranked else "declares no shape"
            raise AutocastError(
                f"--dim {key}: input '{spec.name}' {rank}", "--dim", "give an axis from 0 to the input's rank - 1"
            )
        declared = spec.dims[axis]
        if isinstance(declared, str):
            raise AutocastError(
                f"--dim {key}: axis {axis} of input '{spec.name}' is the symbolic dimension '{declared}'",
                "--dim",
                f"set it by name for every input that has it: --dim {declared}=N",
            )
        if isinstance(declared, int) and declared >= 0:
            raise AutocastError(
                f"--dim {key}: axis {axis} of input '{spec.name}' has the fixed size {declared}",
                "--dim",
                "only dynamic dimensions can be set",
            )


def _check_range(spec: InputSpec, lo: float, hi: float) -> None:
    """A --input-range must hold values the input's type can take."""
    if spec.elem_type == TensorProto.BOOL:
        return
    np_type = np.dtype(helper.tensor_dtype_to_np_dtype(spec.elem_type))
    flag = "--input-range"
    if np.issubdtype(np_type, np.integer):
        info = np.iinfo(np_type)
        top = min(int(info.max), int(np.iinfo(np.int64).max))  # values are drawn as int64
        if lo < info.min or hi > top:
            raise AutocastError(
                f"{flag} {spec.name}={lo:g}:{hi:g} is outside what {np_type} input '{spec.name}' "
                f"holds ({info.min}..{top})",
                flag,
                "give a range within the input's type",
            )
        if int(hi) <= int(lo):
            raise AutocastError(
                f"{flag} {spec.name}={lo:g}:{hi:g} holds no whole number for integer input '{spec.name}'",
                flag,
                "HI is exclusive: e.g. 0:2 gives 0 and 1",
            )
    elif np.issubdtype(np_type, np.floating):
        largest = float(np.finfo(np_type).max)
        if lo < -largest or hi > largest:
            raise AutocastError(
                f"{flag} {spec.name}={lo:g}:{hi:g} is outside what {np_type} input '{spec.name}' "
                f"holds (|x| <= {largest:g})",
                flag,
                "give a range within the input's type",
            )


def _shape(spec: InputSpec, dims: dict) -> tuple:
    """The generated shape: declared sizes, symbolic dimensions by name, an unnamed dynamic one
    from `dims` as 'INPUT:AXIS' or a default (3 on the first axis, 8 elsewhere)."""
    shape = []
    for k, d in enumerate(spec.dims):
        if isinstance(d, int) and d >= 0:  # a declared size, 0 included
            shape.append(d)
        elif isinstance(d, str):
            shape.append(dims[d])
        else:
            shape.append(dims.get(f"{spec.name}:{k}", DEFAULT_BATCH if k == 0 else DEFAULT_OTHER))
    return tuple(shape)


GENERATED_LIMIT = 2**31  # bytes of generated inputs per batch


def check_generated_size(plan: InputPlan) -> None:
    """Refuse generated inputs of more than GENERATED_LIMIT bytes per batch, before allocating."""
    total: float = 0
    for spec in plan.specs:
        total += _elements(spec, plan.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(spec.elem_type)).itemsize
    if total > GENERATED_LIMIT:
        biggest = max(plan.specs, key=lambda s: _elements(s, plan.dims))
        raise AutocastError(
            f"generated inputs would take {total / 2**30:.3g} GiB (input '{biggest.name}' has shape "
            f"{list(_shape(biggest, plan.dims))}{' in each tensor of its sequence' if biggest.sequence else ''})",
            "--inputs",
            "set smaller symbolic dimensions with --dim, or pass your own batches with --inputs",
        )


def _elements(spec: InputSpec, dims: dict) -> float:
    """Elements generated for the input (every tensor of a sequence), as a float: no overflow."""
    return float(np.prod(_shape(spec, dims), dtype=np.float64)) * (SEQUENCE_LENGTH if spec.sequence else 1)


SEED_LIMIT = 2**32  # numpy seeds: 0 <= seed < 2**32 (the CLI's --seed range)


SEQUENCE_LENGTH = 2  # tensors in a generated sequence input


class SequenceFeed(list):
    """A generated sequence input: a list of arrays of one shape and type, which ONNX Runtime takes
    for a sequence input. It answers what validation asks of an array feed as the array of its
    tensors stacked would (size, ndim, shape, dtype, astype: each tensor cast), so that it goes
    wherever one goes."""

    @property
    def dtype(self) -> np.dtype:
        return self[0].dtype

    @property
    def shape(self) -> tuple:
        return (len(self), *self[0].shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return sum(t.size for t in self)

    def astype(self, dtype) -> SequenceFeed:
        return SequenceFeed(t.astype(dtype) for t in self)


def generate(plan: InputPlan, seed: int = 0) -> dict:
    """One batch of realistic inputs: an array for each tensor input, a SequenceFeed of
    SEQUENCE_LENGTH arrays for each sequence input."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise AutocastError(f"seed must be a whole number >= 0, not {seed!r}", "--seed", "e.g. --seed 0")
    rng = np.random.default_rng(seed)
    check_generated_size(plan)
    feeds: dict = {}
    for spec in plan.specs:
        shape = _shape(spec, plan.dims)
        if spec.sequence:
            feeds[spec.name] = SequenceFeed(_tensor(spec, shape, plan, rng) for _ in range(SEQUENCE_LENGTH))
        else:
            feeds[spec.name] = _tensor(spec, shape, plan, rng)
    return feeds


def _tensor(spec: InputSpec, shape: tuple, plan: InputPlan, rng: np.random.Generator) -> np.ndarray:
    """One generated array for `spec`: an ndarray of its type even of rank 0 (numpy gives some
    draws of shape () as scalars, which ONNX Runtime refuses as feeds)."""
    np_type = helper.tensor_dtype_to_np_dtype(spec.elem_type)
    lo_hi = plan.ranges.get(spec.name)
    lname = spec.name.lower()
    value: np.ndarray
    if "mask" in lname and lo_hi is None:
        value = padded_mask(spec.name, shape)
    elif spec.elem_type == TensorProto.BOOL:
        value = rng.random(shape) < 0.5
    elif np.issubdtype(np_type, np.integer):
        lo, hi = lo_hi if lo_hi else (0, spec.vocab if spec.vocab else 2 if "type" in lname else 100)
        value = rng.integers(int(lo), int(hi), size=shape)
    elif lo_hi:
        value = rng.uniform(lo_hi[0], lo_hi[1], size=shape)
    else:
        value = rng.standard_normal(shape)
    return np.asarray(value).astype(np_type)


def padded_mask(name: str, shape: tuple) -> np.ndarray:
    """A generated mask input (int, float or bool) with padding: the attention_mask pattern, in
    the convention its name implies (masks.generated_mask: a `pad` name marks padding with 1), so
    that validation's padded positions (masks.Padding) occur on generated data too."""
    from .masks import generated_mask

    return generated_mask(name, attention_mask(shape))


def attention_mask(shape: tuple) -> np.ndarray:
    """1 for visible positions, 0 for padding: row 0 full, row 1 padded after ~2/3, the last
    row (when there are 3 or more) fully masked."""
    mask = np.ones(shape, dtype=np.int64)
    if len(shape) < 2 or shape[-1] < 2:
        return mask
    rows = mask.reshape(-1, shape[-1])
    if rows.shape[0] >= 2:
        rows[1, max(1, (2 * shape[-1]) // 3) :] = 0
    if rows.shape[0] >= 3:
        rows[-1, :] = 0
    return rows.reshape(shape)


def _batch_files(path: str | Path) -> list[Path]:
    """The files of --inputs: the file itself, or a folder's *.npz files or its *.json files (Polygraphy's
    per-iteration files), sorted by name. A folder holding both kinds is refused: which batches were meant,
    and in which order, would be a guess. So is any of them that is not a regular file (a FIFO, a device,
    a symlink to one: io.check_regular), as the path itself is; each read opens it with io.open_regular."""
    path = Path(path)
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        raise AutocastError(
            "inputs path not found", str(path), "give an .npz file, a Polygraphy .json input file, or a folder of them"
        ) from None
    if is_dir:
        archives, lists = sorted(path.glob("*.npz")), sorted(path.glob("*" + polygraphy_json.SUFFIX))
        if archives and lists:
            raise AutocastError(
                f"the inputs folder holds both .npz and .json files ({archives[0].name}, {lists[0].name})",
                str(path),
                "keep one kind per folder: .npz archives or Polygraphy's .json files",
            )
        if not archives and not lists:
            raise AutocastError(
                "no .npz or .json files in the inputs folder",
                str(path),
                "add NAME.npz files, one per batch, or Polygraphy's per-iteration .json files",
            )
        files = archives or lists
    else:
        files = [path]
    for f in files:
        check_regular(f, polygraphy_json.NOT_A_FILE)
    return files


@dataclass(frozen=True)
class _Format:
    """The words of an input file's errors: the file, what holds an array's bytes, how to write it
    again, and how to pass smaller batches."""

    whole: str
    holder: str
    writer: str
    smaller: str


_NPZ = _Format("the archive", "the archive", "numpy.savez", "one .npz file per batch")
_JSON = _Format("the file", "its base64", polygraphy_json.WRITER, "one feed dict per batch")


def _check_array(name: str, shape: tuple, dtype: np.dtype, spec: InputSpec, where: str, fmt: _Format = _NPZ) -> None:
    """Refuse an array the model input cannot take: not numbers, or the wrong rank or size."""
    want = np.dtype(helper.tensor_dtype_to_np_dtype(spec.elem_type))
    what = f"array '{name}'"
    if dtype.hasobject:
        raise AutocastError(f"{what} is an object array", where, f"save plain numeric arrays with {fmt.writer}")
    if want.kind in "biuf" and dtype.kind not in "biuf":
        raise AutocastError(
            f"{what} has dtype {dtype} ({_KIND_NAMES.get(dtype.kind, 'not numbers')}), but input '{name}' takes {want}",
            where,
            f"save it with dtype {want}",
        )
    if spec.ranked:
        if len(shape) != len(spec.dims):
            raise AutocastError(
                f"{what} has {len(shape)} dimension(s) {list(shape)}, but input '{name}' has "
                f"{len(spec.dims)} {_dims_text(spec.dims)}",
                where,
                "save it with the input's shape",
            )
        for k, (got, declared) in enumerate(zip(shape, spec.dims)):
            if isinstance(declared, int) and declared > 0 and got != declared:
                raise AutocastError(
                    f"{what} has shape {list(shape)}, but input '{name}' declares size {declared} "
                    f"for dimension {k} {_dims_text(spec.dims)}",
                    where,
                    "save it with the input's shape",
                )


_KIND_NAMES = {
    "U": "text",
    "S": "bytes",
    "c": "complex numbers",
    "M": "dates",
    "m": "time spans",
    "V": "raw or structured records",
    "O": "Python objects",
}


def _dims_text(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


@dataclass
class _Member:
    """An array of an .npz as its archive lists it: the bytes it inflates to (`size`, the .npy
    file, header included) and, for a wanted array, its header's shape and dtype and the bytes of
    data after the header (`header` None: a header format newer than this reader knows)."""

    size: int
    header: tuple[tuple[int, ...], np.dtype] | None = None
    data_bytes: int = 0


def _npz_headers(f: Path, wanted=None) -> dict[str, _Member]:
    """name -> _Member for every array of an .npz, with the .npy headers of the `wanted` arrays
    (None: all) read (no data is inflated beyond a header). The file must be a regular file
    (io.open_regular)."""
    with open_regular(f, polygraphy_json.NOT_A_FILE) as opened:
        return _archive_headers(opened, str(f), wanted)


def _archive_headers(opened: BinaryIO, where: str, wanted) -> dict[str, _Member]:
    """_npz_headers of the archive open as `opened` (`where` names it in errors)."""
    from numpy.lib import format as npy

    if not zipfile.is_zipfile(opened):
        raise AutocastError(
            "not an .npz archive",
            where,
            "write it with numpy.savez; a Polygraphy JSON input file must be named *.json",
        )
    out: dict[str, _Member] = {}
    name = None
    try:
        with zipfile.ZipFile(opened) as archive:
            for member in archive.infolist():
                name = member.filename.removesuffix(".npy")
                out[name] = _Member(member.file_size)
                if wanted is not None and name not in wanted:
                    continue
                with archive.open(member) as fh:
                    version = npy.read_magic(fh)
                    if version == (1, 0):
                        shape, _, dtype = npy.read_array_header_1_0(fh)
                    elif version == (2, 0):
                        shape, _, dtype = npy.read_array_header_2_0(fh)
                    else:
                        continue  # a newer header: checked when the array is loaded
                    out[name] = _Member(member.file_size, (tuple(shape), np.dtype(dtype)), member.file_size - fh.tell())
    except Exception as exc:
        what = f"cannot read array {name!r} of the .npz" if name in (wanted or out) else "cannot read .npz"
        raise AutocastError(f"{what}: {' '.join(str(exc).split())}", where, "write it with numpy.savez") from None
    return out


def _check_headers(f: Path, names: dict) -> int | None:
    """Check the headers of the arrays of `names` in archive `f`; returns N when the archive
    stacks N batches along a fixed batch-1 axis (see _stacked_count), else None."""
    members = _npz_headers(f, names)
    missing = set(names) - set(members)
    if missing:
        held = ", ".join(sorted(members)) or "no arrays"
        raise AutocastError(
            f"missing input(s) {', '.join(sorted(missing))}; the archive holds {held}",
            str(f),
            "the archive needs one array per model input, named like the input",
        )
    stacked = _stacked_count({name: members[name].header for name in names}, names)
    for name, spec in names.items():
        header = members[name].header
        if header is not None:
            shape, dtype = header
            _check_array(name, (1, *shape[1:]) if stacked else shape, dtype, spec, str(f))
    _check_inflated_size(f, {name: members[name] for name in names}, names)
    return stacked


def _stacked_count(shapes: dict, names: dict) -> int | None:
    """N when an archive stacks N > 1 batches along a fixed batch-1 axis: every input declares
    size 1 on its first axis and every array has the input's rank and the same first size N
    (`shapes`: name -> (shape, dtype) or None, a header not read); None otherwise."""
    counts = set()
    for name, spec in names.items():
        header = shapes.get(name)
        if header is None or not spec.ranked or not spec.dims or spec.dims[0] != 1 or len(header[0]) != len(spec.dims):
            return None
        counts.add(header[0][0])
    count = counts.pop() if len(counts) == 1 else None
    return count if count is not None and count > 1 else None


def check_archive_size(path: str | Path) -> None:
    """Refuse an .npz (every array of it) that would take more than GENERATED_LIMIT bytes once
    loaded, or whose headers declare more data than it holds, before anything is inflated."""
    f = Path(path)
    _check_inflated_size(f, _npz_headers(f), {})


def _in_memory_bytes(member: _Member, spec: InputSpec | None, name: str, where: str, fmt: _Format = _NPZ) -> int:
    """Bytes the array takes once loaded (and converted to the type of its input `spec`), from its
    header; refuses a header that declares more data than the archive member holds."""
    if member.header is None:
        return member.size  # a newer header: the member's size bounds what loading inflates
    shape, dtype = member.header
    count = math.prod(shape)
    declared = count * dtype.itemsize
    if declared > member.data_bytes:
        raise AutocastError(
            f"array {name!r} declares shape {list(shape)} of {dtype} ({declared} bytes), but {fmt.holder} holds "
            f"{member.data_bytes} bytes of it",
            where,
            f"{fmt.whole} is truncated or forged; write it again with {fmt.writer}",
        )
    if spec is None:
        return declared
    want = np.dtype(helper.tensor_dtype_to_np_dtype(spec.elem_type))
    return max(declared, count * want.itemsize)


def _check_inflated_size(f: Path | str, members: dict[str, _Member], names: dict, fmt: _Format = _NPZ) -> None:
    """Refuse a batch whose arrays would take more than GENERATED_LIMIT bytes once loaded (the
    limit generated inputs have), before inflating any: a small compressed .npz can declare
    gigabytes of zeros. `f` is where the batch is (a file, or a feed dict of one)."""
    sizes = {name: _in_memory_bytes(member, names.get(name), name, str(f), fmt) for name, member in members.items()}
    total = sum(sizes.values())
    if total > GENERATED_LIMIT:
        biggest = max(sizes, key=lambda n: sizes[n])
        header = members[biggest].header
        shape = f" (shape {list(header[0])} of {header[1]})" if header is not None else ""
        raise AutocastError(
            f"the inputs of this batch would take {total / 2**30:.3g} GiB once loaded, over the "
            f"{GENERATED_LIMIT / 2**30:.3g} GiB limit; array {biggest!r}{shape} takes {sizes[biggest] / 2**30:.3g} GiB",
            str(f),
            f"pass smaller batches: {fmt.smaller}",
        )


def check_batches(path: str | Path, specs: list[InputSpec]) -> None:
    """Refuse unusable --inputs / --calibration-data before any work, reading only the headers:
    a missing file or array, an array that is not numbers, of the wrong rank or size."""
    _refuse_sequences(path, specs)
    names = {s.name: s for s in specs}
    for f in _batch_files(path):
        if polygraphy_json.is_json(f):
            _json_batches(f, names, load=False)
        else:
            _check_headers(f, names)


def _refuse_sequences(path: str | Path, specs: list[InputSpec]) -> None:
    """An .npz or a Polygraphy feed dict holds arrays only: a model with a sequence input cannot
    take its batches."""
    sequences = [s.name for s in specs if s.sequence]
    if sequences:
        holder = "a Polygraphy JSON input file" if polygraphy_json.is_json(path) else "an .npz archive"
        raise AutocastError(
            f"input '{sequences[0]}' takes a sequence of tensors, which {holder} cannot hold",
            str(path),
            "leave the batches out: validation generates sequence inputs",
        )


def _json_batches(f: Path, names: dict, load: bool) -> list[dict]:
    """The batches of a Polygraphy JSON file, one per feed dict, checked as an .npz's are (names,
    types, shapes, a fixed batch-1 axis stacking samples, the size limit) from the .npy headers
    before any array is loaded; the arrays are loaded (cast to the inputs' types) only when `load`."""
    batches: list[dict] = []
    for k, feeds in enumerate(polygraphy_json.read_feed_dicts(f)):
        missing = set(names) - set(feeds)
        if missing:
            held = ", ".join(sorted(feeds)) or "no arrays"
            raise AutocastError(
                f"missing input(s) {', '.join(sorted(missing))}; feed dict {k} holds {held}",
                str(f),
                "each feed dict needs one array per model input, named like the input",
            )
        arrays = {name: polygraphy_json.decode_array(feeds[name], name, k, str(f)) for name in names}
        where = f"{f} (feed dict {k})"
        stacked = _stacked_count({name: (a.shape, a.dtype) for name, a in arrays.items()}, names)
        for name, a in arrays.items():
            _check_array(name, (1, *a.shape[1:]) if stacked else a.shape, a.dtype, names[name], where, _JSON)
        members = {name: _Member(len(a.npy), (a.shape, a.dtype), a.data_bytes) for name, a in arrays.items()}
        _check_inflated_size(where, members, names, _JSON)
        if load:
            batch = {name: _typed(a.load(where), names[name]) for name, a in arrays.items()}
            batches.extend(_split(batch, stacked))
    return batches


def _typed(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """`array` in the type of its input."""
    want = helper.tensor_dtype_to_np_dtype(spec.elem_type)
    return array if array.dtype == want else array.astype(want)


def _split(batch: dict, stacked: int | None) -> list[dict]:
    """A batch, or the `stacked` batches of one sample it holds along its first axis."""
    if not stacked:
        return [batch]
    return [{k: v[row : row + 1] for k, v in batch.items()} for row in range(stacked)]


def load_batches(path: str | Path, specs: list[InputSpec]) -> list[dict]:
    """Batches from one .npz file, one Polygraphy JSON input file (one batch per feed dict) or a
    folder of either (sorted by name); every array is checked (from its header) before any is
    loaded. An archive or feed dict whose arrays stack N batches along a fixed batch-1 axis (every
    input [1, ...], every array [N, ...]) gives N batches."""
    _refuse_sequences(path, specs)
    names = {s.name: s for s in specs}
    batches: list[dict] = []
    for f in _batch_files(path):
        if polygraphy_json.is_json(f):
            batches.extend(_json_batches(f, names, load=True))
            continue
        stacked = _check_headers(f, names)
        batch = _load_npz(f, names)
        for name, spec in names.items():
            array = batch[name]
            if not isinstance(array, np.ndarray):
                raise AutocastError(f"'{name}' is not an array", str(f), "write the archive with numpy.savez")
            _check_array(name, (1, *array.shape[1:]) if stacked else array.shape, array.dtype, spec, str(f))
            batch[name] = _typed(array, spec)
        batches.extend(_split(batch, stacked))
    return batches


def load_arrays(path: str | Path) -> dict:
    """Every array of one input file, by name, unchecked against a model's inputs (a training
    step's data inputs): an .npz, whose size is checked before any array is inflated, or a
    Polygraphy JSON input file holding one feed dict (a training step runs one batch)."""
    f = Path(path)
    if not polygraphy_json.is_json(f):
        check_archive_size(f)
        return _load_npz(f, None)
    dicts = polygraphy_json.read_feed_dicts(f)
    if len(dicts) > 1:
        raise AutocastError(
            f"holds {len(dicts)} feed dicts, and a training step runs one batch",
            str(f),
            "keep one feed dict in the file",
        )
    arrays = {name: polygraphy_json.decode_array(entry, name, 0, str(f)) for name, entry in dicts[0].items()}
    where = f"{f} (feed dict 0)"
    members = {name: _Member(len(a.npy), (a.shape, a.dtype), a.data_bytes) for name, a in arrays.items()}
    _check_inflated_size(where, members, {}, _JSON)
    return {name: a.load(where) for name, a in arrays.items()}


def _load_npz(f: Path, names) -> dict:
    """The arrays of `names` (None: all) of the .npz `f`, opened with io.open_regular (a file
    swapped for a FIFO or a device since its headers were read is refused, not read)."""
    with open_regular(f, polygraphy_json.NOT_A_FILE) as opened:
        try:
            with np.load(opened, allow_pickle=False) as archive:
                return {k: archive[k] for k in (archive.files if names is None else names)}
        except Exception as exc:
            raise AutocastError(f"cannot read .npz: {exc}", str(f), "write it with numpy.savez") from None


def save_batch(path: str | Path, feeds: dict) -> None:
    """Write one batch as an .npz archive (--save-inputs), one array per input, named like it, so
    that --inputs replays it. An archive holds arrays only: a sequence input is refused."""
    save_batches(path, [feeds])


def refuse_saving_sequences(names: list[str], path: str | Path) -> None:
    """--save-inputs cannot write a sequence input (`names`: those the batch has): both files hold arrays only."""
    if names:
        holder = "a Polygraphy JSON input file" if polygraphy_json.is_json(path) else "an .npz archive"
        raise AutocastError(
            f"input '{names[0]}' takes a sequence of tensors, which {holder} cannot hold",
            "--save-inputs",
            "drop --save-inputs: the same --seed generates the same inputs again",
        )


def save_batches(path: str | Path, batches: list[dict]) -> None:
    """Write --save-inputs: every batch as Polygraphy's JSON input file (a list of feed dicts,
    which `polygraphy run --load-inputs` and --inputs read) when `path` ends in .json, else the
    one batch as an .npz archive, one array per input named like it (validation's precheck holds
    an .npz to one batch). Both hold arrays only: a sequence input is refused. Written as every
    output is (io.write_binary_output): atomically, or in place into a FIFO or character device
    (never replaced); a path ending in '/', a folder, a block device or a socket is refused."""
    json_file = polygraphy_json.is_json(path)
    refuse_saving_sequences(
        [name for feeds in batches for name, value in feeds.items() if isinstance(value, SequenceFeed)], path
    )
    if json_file:
        encoded = polygraphy_json.encode(batches).encode()
        write_binary_output(path, lambda fh: fh.write(encoded), "--save-inputs")
        return
    arrays: dict = {name: np.asarray(value) for name, value in batches[0].items()}
    write_binary_output(path, lambda fh: np.savez(fh, **arrays), "--save-inputs")


def describe_batch(feeds: dict, limit: int = 6) -> str:
    """The shapes, types and value ranges of a batch in a few words, for an error line:
    'input_ids int64 [3, 16] in 0..99; mask int64 [3, 16] in 0..1'."""
    parts = []
    for name, value in list(feeds.items())[:limit]:
        arrays = list(value) if isinstance(value, SequenceFeed) else [np.asarray(value)]
        kind = f"a sequence of {len(arrays)} " if isinstance(value, SequenceFeed) else ""
        first = arrays[0] if arrays else np.zeros(0)
        text = f"{name} {kind}{first.dtype} {list(first.shape)}"
        sizes = [a for a in arrays if a.size]
        if not sizes:
            parts.append(text + " (empty)")
            continue
        lo = min(float(np.min(a)) for a in sizes)
        hi = max(float(np.max(a)) for a in sizes)
        parts.append(text + f" in {lo:.4g}..{hi:.4g}")
    more = len(feeds) - limit
    return "; ".join(parts) + (f"; and {more} more input(s)" if more > 0 else "")
