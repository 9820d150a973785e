"""Stage 0 and last: read a model from disk and write one back.

Reading parses the protobuf directly (fast) and loads external data after checking that
every location stays inside the model's folder. Writing is atomic: everything goes to
temporary files in the destination folder and is renamed into place only when complete,
so a failure never leaves a half-written model or touches the input.

Outputs that are not regular files are never replaced: '-' is stdout (text reports only), and a
character device or FIFO (/dev/null, a named pipe) is opened and written in place. Before any
work, `check_outputs` refuses a set of outputs that cannot all be written as asked (two outputs
that are one file, an output that is an input, a missing folder, a directory...), and
`OutputSnapshot` lets a command remove what it wrote when it fails afterwards.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import re
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final, Literal, Protocol, runtime_checkable

import numpy as np
import onnx
from google.protobuf.message import DecodeError, EncodeError
from onnx import numpy_helper

from .dtypes import ITEMSIZE
from .errors import AutocastError, InternalCheckError
from .filesys import write_all

PROTOBUF_LIMIT = 2**31 - 1
# Initializers at least this large go to the external data file when one is written.
EXTERNAL_MIN_BYTES = 1024


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: Path | None
    file_bytes: int
    external_data: bool = False
    external_files: list[str] = field(default_factory=list)
    left_in_file: LeftInFile | None = None  # see load_model(parse=...)
    external_checked: bool = False  # the main graph's external-data locations were checked (load_model)
    typed_outputs: list[str] = field(default_factory=list)  # graph outputs typed on load (graph/sanity.py)
    given: str | None = None  # the path as the caller spelled it (`./m.onnx`; `path` is `m.onnx`), for reports

    @property
    def shown(self) -> str | None:
        """The model's path as its caller gave it, as reports and findings name it."""
        return self.given if self.given is not None else (str(self.path) if self.path is not None else None)


def whole_or_path(loaded: LoadedModel | None, path):
    """What a run reads a model from: `loaded` (read once by its command) when it holds all of its
    weights, no external data, else `path`, so that each run reads the weights it needs and lets
    them go (none stay in memory beside a conversion)."""
    return loaded if loaded is not None and not loaded.external_files else path


class LeftInFile(Protocol):
    """What a parse that leaves payloads in the file (load_model's `parse`, the fast path's
    fast/in_file.py) hands back: the ordinals of the main graph's initializers it left there,
    checked against protobuf's parse, and how to read them back into their tensors."""

    ordinals: frozenset

    def __len__(self) -> int: ...

    def sizes(self) -> dict[int, int]: ...

    def inline(self) -> int: ...


# load_model's `parse`: (the mapped file, its path, the model to parse into, its os.stat) -> the
# payloads it left in the file, or None when it parsed nothing (the file is then parsed whole)
LeavingParse = Callable[[memoryview, Path, onnx.ModelProto, os.stat_result], "LeftInFile | None"]


@runtime_checkable
class PiecesLike(Protocol):
    """A model's encoding as the buffers it is made of (the fast path's splice hands the save its
    Pieces, fast/splice.py): written with write_to, joined by bytes() where whole bytes are needed."""

    def __len__(self) -> int: ...

    def __bytes__(self) -> bytes: ...

    def write_to(self, fd: int) -> None: ...


def encoded_size(message) -> int:
    """message.ByteSize(), or PROTOBUF_LIMIT + 1 for a message past what protobuf encodes (over
    2 GiB: upb's ByteSize raises EncodeError there rather than return the size, the C++
    implementation ValueError), so that a size guard can compare it instead of failing."""
    try:
        return message.ByteSize()
    except (EncodeError, ValueError):
        return PROTOBUF_LIMIT + 1


def load_model(path: str | os.PathLike, load_external: bool = True, parse: LeavingParse | None = None) -> LoadedModel:
    """Read an ONNX file; raise AutocastError with one clear line for anything unusable.

    External data locations are always checked (inside the model's folder, file present, range
    within the file). With load_external=False the bytes stay on disk and are read one tensor at
    a time when needed (see tensor_bytes), so a model larger than memory can be converted.

    `parse` (with load_external=False; the fast path's fast/in_file.py) parses the mapped file in a
    way of its own, leaving some payloads in the file, and returns what it left there (LeftInFile)
    or None, having parsed nothing: the file is then parsed whole, as without it."""
    given = os.fspath(path)
    path = check_model_path(path)
    where = str(path)
    model = onnx.ModelProto()
    try:
        size, left = _parse_file(path, model, None if load_external else parse)
    except OSError as exc:
        raise AutocastError(f"cannot read file: {exc.strerror}", where, "check its permissions") from None
    except (DecodeError, RuntimeError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError) or _TOO_DEEP.search(str(exc)):
            raise AutocastError(
                "nested deeper than protobuf reads (100 message levels: If/Loop/Scan bodies about 31 deep)",
                where,
                "nest fewer subgraphs inside each other, or re-export the model",
            ) from None
        raise AutocastError(
            "not an ONNX model (protobuf parse failed: truncated or corrupted?)",
            where,
            "re-export the model or check the download",
        ) from None
    if not size:
        raise AutocastError("file is empty", where, "re-export the model")
    if not model.HasField("graph") or (not model.opset_import and model.ir_version == 0):
        raise AutocastError("not an ONNX model (no graph or opset in the file)", where, "pass a .onnx model file")
    loaded = LoadedModel(
        model=model, path=path, file_bytes=size, left_in_file=left, external_checked=True, given=str(given)
    )
    files: dict = {}
    ours = left.ordinals if left is not None else frozenset()
    for ordinal, tensor in enumerate(_graph_tensors(model.graph)):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and ordinal not in ours:
            if load_external:
                load_external_tensor(tensor, path.parent, where, files)
            else:
                external_location(tensor, path.parent, where, files)
    loaded.external_data = bool(files)
    loaded.external_files = sorted(files)
    return loaded


# a parse stopped by protobuf's nesting limit, in the words of its backends (upb, pure Python)
_TOO_DEEP = re.compile(r"MaxDepth|levels of nesting")


def check_model_path(path: str | os.PathLike) -> Path:
    """`path` as a Path, after refusing what cannot be a model file: a missing path, a directory,
    and anything else that is not a regular file (a character device such as /dev/zero or
    /dev/stdin, a FIFO, a socket), which could be read without end or only once. Looks at the
    file's type only (os.stat): never opens it."""
    path = Path(path)
    where = str(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise AutocastError("file not found", where, "check the path") from None
    if stat.S_ISDIR(mode):
        raise AutocastError("is a directory, not an ONNX file", where, "pass the .onnx file inside it")
    if not stat.S_ISREG(mode):
        raise AutocastError(
            f"is {_special_kind(mode)}, not a regular file",
            where,
            "save the model to a file and pass its path; models are not read from pipes or devices",
        )
    return path


ModelArgument = onnx.ModelProto | str | os.PathLike  # what model_argument gives back


def model_argument(model, name: str, *, result: bool = False, in_memory: bool = True) -> ModelArgument:
    """What a public call's model parameter `name` was given, checked for its kind before any work:
    a path (a str, or an os.PathLike such as pathlib.Path naming a str path) comes back as given,
    an onnx.ModelProto as it is (neither copied nor edited), and with `result` a conversion's
    result (convert's ConversionResult: an object whose `model` is a ModelProto) as that model.
    With `in_memory=False` (a call that reads the model's file) only a path is taken. Anything
    else is refused in one line naming `name` (AutocastError), not left to fail later as the
    TypeError of a Path() or the AttributeError of a protobuf call."""
    if _names_path(model):
        return model
    inner = getattr(model, "model", None) if not isinstance(model, (type, onnx.ModelProto)) else None
    if in_memory and (isinstance(model, onnx.ModelProto) or (result and isinstance(inner, onnx.ModelProto))):
        return inner if isinstance(inner, onnx.ModelProto) else model
    kinds = [
        "a path (str or pathlib.Path)",
        "an onnx.ModelProto" if in_memory else "",
        "a ConversionResult" if result else "",
    ]
    kinds = [kind for kind in kinds if kind]
    takes = " or ".join(kinds) if len(kinds) < 3 else f"{kinds[0]}, {kinds[1]} or {kinds[2]}"
    given = "None" if model is None else type(model).__name__
    if not in_memory and (isinstance(model, onnx.ModelProto) or isinstance(inner, onnx.ModelProto)):
        hint = "pass the path of the model's file; onnx.save(model, PATH) writes one"
    elif isinstance(inner, onnx.ModelProto):
        hint = "pass result.model, the model the conversion gave, or the path of a model file"
    else:
        hint = "pass the model file's path" + (", or the model onnx.load(path) gives" if in_memory else "")
    raise AutocastError(f"takes {takes}, not {given}", name, hint)


@contextmanager
def model_file(model: ModelArgument, shown: str = "<model>") -> Iterator[str | os.PathLike]:
    """A path to `model` (as model_argument gives it) for work that reads a model file: a path as
    it is; a ModelProto written, its encoding as it is (never edited), to a temporary folder that
    is removed on leaving. An AutocastError raised inside that names the temporary file names
    `shown` instead. A ModelProto that no file can hold as it is (over protobuf's 2 GiB, weights
    left as external data with no folder to find them in) is refused first."""
    if not isinstance(model, onnx.ModelProto):
        yield model
        return
    _refuse_unwritable(model, shown)
    with tempfile.TemporaryDirectory(prefix="autocast-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            yield path
        except AutocastError as exc:
            named = [exc.what, exc.where or "", exc.hint or ""]
            if not any(tmp in text for text in named):
                raise
            what, where, hint = (text.replace(str(path), shown).replace(tmp, shown) for text in named)
            raise AutocastError(what, where or None, hint or None) from None


def _refuse_unwritable(model: onnx.ModelProto, shown: str) -> None:
    """Refuse a ModelProto that model_file cannot write as one file that reads back the same."""
    if encoded_size(model) > PROTOBUF_LIMIT:
        raise AutocastError(
            "the model is over 2 GiB in memory, more than protobuf encodes, so it cannot be written to the "
            "file this call reads",
            shown,
            "save it with its weights as external data (onnx.save_model(model, PATH, save_as_external_data=True)) "
            "and pass PATH",
        )
    tensor = next((t for t in _all_tensors_for_external(model.graph) if is_external(t)), None)
    if tensor is not None:
        raise AutocastError(
            f"initializer {tensor.name!r} uses external data but the model has no folder",
            shown,
            "pass the model's path, or load it with its data (onnx.load(path))",
        )


def _names_path(value) -> bool:
    """Whether `value` is a path a model can be read from: a str, or an os.PathLike whose
    os.fspath is one (bytes paths are not taken: Path() refuses them)."""
    if isinstance(value, str):
        return True
    if not isinstance(value, os.PathLike):
        return False
    try:
        return isinstance(os.fspath(value), str)
    except TypeError:  # an __fspath__ that returns neither str nor bytes
        return False


def check_regular(path: str | os.PathLike, hint: str) -> None:
    """Refuse `path` unless it is a regular file (a symlink to one included), as check_model_path
    does, from its type alone (os.stat: never opened), with `hint` as what to do: a FIFO, which
    would wait for a writer; a device such as /dev/zero, read without end; a folder, a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise AutocastError(f"cannot read file: {exc.strerror or exc}", str(path), "check the path") from None
    if not stat.S_ISREG(mode):
        raise AutocastError(f"is {_special_kind(mode)}, not a regular file", str(path), hint)


def open_regular(path: str | os.PathLike, hint: str) -> BinaryIO:
    """`path` opened for reading in binary, after check_regular; opened without waiting
    (O_NONBLOCK, no controlling terminal) and looked at again on the open descriptor, so that a
    path swapped for a FIFO or a device in between is refused too, never read or waited on."""
    check_regular(path, hint)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise AutocastError(f"cannot read file: {exc.strerror or exc}", str(path), "check its permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise AutocastError(f"is {_special_kind(mode)}, not a regular file", str(path), hint)
    if hasattr(os, "O_NONBLOCK"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _parse_file(path: Path, model: onnx.ModelProto, parse: LeavingParse | None = None) -> tuple[int, LeftInFile | None]:
    """Parse the file at `path` into `model`; returns its size in bytes (0: nothing parsed) and
    the payloads left in it (`parse`; see load_model). The file is mapped rather than read:
    the parser copies what it keeps, so the file's bytes need not be copied into memory first
    (0.1 s and the file's size of memory for 190 MB). A file that cannot be mapped (empty, a
    pipe) is read."""
    with open(path, "rb") as fh:
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):
            data = fh.read()
            if data:
                model.ParseFromString(data)
            return len(data), None
        with mapped, memoryview(mapped) as view:
            st = os.fstat(fh.fileno())
            left = parse(view, path, model, st) if parse is not None else None
            if left is None:
                model.ParseFromString(view)
            return len(view), left if left else None  # parsed, with nothing left in the file


def _graph_tensors(graph: onnx.GraphProto):
    """Initializers of `graph` (subgraph initializers are found by the graph index)."""
    yield from graph.initializer


def external_location(
    tensor: onnx.TensorProto, base_dir: Path, where: str, files: dict | None = None, what: str | None = None
) -> tuple[Path, int, int, str]:
    """(file, offset, length, location) of an external tensor, after refusing locations outside
    `base_dir`, missing files and ranges beyond the file. Reads nothing. `files` (location ->
    (file, size), filled here) lets a caller that checks many tensors at once look at each file
    once. `what` names the tensor in errors (default: as an initializer)."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    what = what or f"initializer {tensor.name!r}"
    if not location:
        raise AutocastError(f"{what} has external data without a location", where, "re-save the model")
    known = files.get(location) if files is not None else None
    if known is not None:
        target, size = known
    else:
        target, size = _external_file(base_dir, location, what, where)
        if files is not None:
            files[location] = (target, size)
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise AutocastError(
            f"{what}: external data offset/length are not numbers", where, "re-save the model"
        ) from None
    if offset < 0 or length < 0:
        raise AutocastError(
            f"{what}: external data offset {offset} / length {length} is negative", where, "re-save the model"
        )
    if offset + length > size:
        raise AutocastError(
            f"{what}: external data range {offset}+{length} exceeds {location!r} ({size} bytes)",
            where,
            "the data file is truncated or belongs to another model",
        )
    return target, offset, length, location


def _external_file(base_dir: Path, location: str, what: str, where: str) -> tuple[Path, int]:
    """The file an external-data location names and its size, after refusing one outside
    `base_dir` and a missing one."""
    # a model's tensors share a few files: where a location leads is worked out once per folder
    # (resolving a path is ~25 us; a model can hold 100k external tensors)
    key = (str(base_dir), location)
    target = _LOCATED.get(key)
    if target is None:
        loc = Path(location)
        base = Path(base_dir).resolve()
        target = (base / loc).resolve()
        if loc.is_absolute() or ".." in loc.parts or not target.is_relative_to(base):
            raise AutocastError(
                f"{what}: external data location {location!r} is outside the model's folder",
                where,
                "external data must sit beside the model; refusing to read it",
            )
        if len(_LOCATED) >= 4096:
            _LOCATED.clear()
        _LOCATED[key] = target
    try:
        st = os.stat(target)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise AutocastError(
            f"{what}: external data file {location!r} is missing", where, "copy the data file next to the model"
        )
    return target, st.st_size


_LOCATED: dict[tuple[str, str], Path] = {}  # (folder, location) -> the file, checked to be inside the folder


def read_external(
    tensor: onnx.TensorProto, base_dir: Path, where: str = "<model>", files: dict | None = None, what: str | None = None
) -> bytes:
    """The external bytes of one tensor, after external_location's checks (the folder rule)."""
    target, offset, length, _ = external_location(tensor, base_dir, where, files, what)
    with open(target, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def load_external_tensor(
    tensor: onnx.TensorProto, base_dir: Path, where: str, files: dict | None = None, what: str | None = None
) -> None:
    """Read one tensor's external bytes into raw_data, refusing locations outside `base_dir`."""
    restore_tensor(tensor, read_external(tensor, base_dir, where, files, what))


def load_external_data(loaded: LoadedModel) -> None:
    """Read the main graph's external data into memory, as load_model(load_external=True) does,
    for a caller that loaded with load_external=False to check the model first (graph/sanity.py)."""
    if loaded.path is None:
        return
    files: dict = {}
    left = loaded.left_in_file.ordinals if loaded.left_in_file is not None else frozenset()
    for ordinal, tensor in enumerate(loaded.model.graph.initializer):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and ordinal not in left:
            load_external_tensor(tensor, loaded.path.parent, str(loaded.path), files)


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def tensor_bytes(
    tensor: onnx.TensorProto, base_dir: Path | None, where: str = "<model>", what: str | None = None
) -> bytes:
    """The little-endian payload of a tensor, wherever it is stored (one tensor in memory).
    External data is read only from inside `base_dir`, the model's folder (external_location),
    never relative to the current folder. `what` names the tensor in errors (default: as an
    initializer; named only for an error: the data rules read every initializer through here)."""
    if is_external(tensor):
        if base_dir is None:
            raise AutocastError(
                f"{what or _initializer(tensor)} uses external data but the model has no folder",
                None,
                "load the model from its file",
            )
        return read_external(tensor, base_dir, where, what=what)
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
        itemsize = ITEMSIZE.get(tensor.data_type)
        if itemsize is not None and len(raw) != itemsize * math.prod(tensor.dims[:]):
            detail = ValueError(f"raw_data holds {len(raw)} bytes for dims {list(tensor.dims)}")
            raise _malformed(what or _initializer(tensor), where, detail)
        return raw
    try:
        if tensor.data_type == onnx.TensorProto.BFLOAT16:
            return np.asarray(tensor.int32_data, dtype="<u2").tobytes()
        return numpy_helper.to_array(tensor).tobytes()
    except (ValueError, KeyError, TypeError) as exc:
        raise _malformed(what or _initializer(tensor), where, exc) from None


def _initializer(tensor: onnx.TensorProto) -> str:
    return f"initializer {tensor.name!r}"


def tensor_array(
    tensor: onnx.TensorProto, base_dir: Path | None, where: str = "<model>", what: str | None = None
) -> np.ndarray:
    """The tensor as an array (bf16 as its raw uint16 bits), reading external data if needed
    (from inside `base_dir` only, see tensor_bytes). A payload that does not fit the tensor's
    dims and data type is bad input (AutocastError), not an exception from numpy."""
    what = what or f"initializer {tensor.name!r}"
    try:
        if not is_external(tensor):
            if tensor.data_type == onnx.TensorProto.BFLOAT16:
                raw = tensor_bytes(tensor, None, where, what)
                return np.frombuffer(raw, dtype="<u2").reshape(tuple(tensor.dims))
            return numpy_helper.to_array(tensor)
        dtype: str | np.dtype = (
            "<u2"
            if tensor.data_type == onnx.TensorProto.BFLOAT16
            else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
        )
        return np.frombuffer(tensor_bytes(tensor, base_dir, where, what), dtype=dtype).reshape(tuple(tensor.dims))
    except (ValueError, KeyError, TypeError) as exc:
        raise _malformed(what, where, exc) from None


def _malformed(what: str, where: str, exc: Exception) -> AutocastError:
    detail = " ".join(str(exc).split())[:120]
    return AutocastError(
        f"{what}: its data does not fit its dims and data type ({type(exc).__name__}: {detail})",
        where,
        "fix the model or re-export it",
    )


def all_graphs(graph: onnx.GraphProto):
    """`graph` and every body graph inside it (If/Loop/Scan attributes), outermost first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_graphs(sub)


def _all_tensors_for_external(graph: onnx.GraphProto):
    for each in all_graphs(graph):
        yield from each.initializer


STDOUT: Final = "-"


def is_stdout(path) -> bool:
    """True for '-', which every text output (report, plan) reads as stdout."""
    return path is not None and os.fspath(path) == STDOUT


def stat_output_kind(st: os.stat_result, where: str = "<output>") -> str:
    """How an existing output with this stat is written: 'file' (a regular file: replaced
    atomically) or 'stream' (a character device or FIFO: opened and written in place, never
    replaced). A directory, block device or socket is refused."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    if stat.S_ISDIR(mode):
        raise AutocastError("output path is a directory", where, "give a file name")
    what = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    raise AutocastError(
        f"output path is {what}",
        where,
        "give a regular file, a FIFO or a character device such as /dev/null; '-' is stdout",
    )


def output_kind(path) -> str:
    """'stdout' for '-', 'file' for a regular file or a path that does not exist yet, 'stream' for
    a character device or FIFO; raises AutocastError for a directory, block device or socket."""
    if is_stdout(path):
        return "stdout"
    try:
        st = os.stat(path)
    except OSError:  # not there yet (or its folder is missing: the folder check says so)
        return "file"
    return stat_output_kind(st, str(path))


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)  # symlinks, hard links, other spellings
    except OSError:
        return False


def _is_null_device(path: Path) -> bool:
    try:
        return os.path.samefile(path, os.devnull)
    except OSError:
        return False


def _stdout_is(path: Path) -> bool:
    """True when `path` is the file that stdout is connected to (e.g. /dev/stdout, or the file
    stdout is redirected to)."""
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(path))
    except (AttributeError, OSError, ValueError):  # no real stdout (captured), or no such file
        return False


def goes_to_stdout(path) -> bool:
    """True when writing `path` writes to this process's stdout: '-', or the file stdout is
    connected to (/dev/stdout, the file stdout is redirected to), the null device excepted."""
    if path is None:
        return False
    if is_stdout(path):
        return True
    return _stdout_is(Path(path)) and not _is_null_device(Path(path))


_SEPARATORS = tuple(sep for sep in {"/", os.sep, os.altsep} if sep)
# the outputs given as 'NAME/' on the command line (Path drops the separator): see spelled_as_folders
_FOLDER_SPELLINGS: ContextVar[frozenset[Path]] = ContextVar("folder_spellings", default=frozenset())


@contextmanager
def spelled_as_folders(paths: Iterable) -> Iterator[None]:
    """While inside, the output checks read each of `paths` as a folder: the CLI passes the
    paths the user spelled with a trailing separator ('out/'), which a Path no longer shows."""
    token = _FOLDER_SPELLINGS.set(frozenset(Path(p) for p in paths))
    try:
        yield
    finally:
        _FOLDER_SPELLINGS.reset(token)


def names_folder(path) -> bool:
    """True for a path that names a folder by its spelling: a string ending in a separator
    ('out/'), or a path (or its text, which has lost the separator) the command line gave that
    way (spelled_as_folders)."""
    if isinstance(path, str) and path.endswith(_SEPARATORS):
        return not is_stdout(path)
    return path is not None and not is_stdout(path) and Path(path) in _FOLDER_SPELLINGS.get()


def _refuse_folder_spelling(flag: str, path) -> None:
    """A file output spelled as a folder ('out/') is refused, never written as a file named 'out'
    (nor into the folder): the command cannot tell which file name was meant."""
    shown = os.path.join(os.fspath(path).rstrip("".join(_SEPARATORS)) or os.sep, "")
    if os.path.isdir(path):
        raise AutocastError("output path is a folder", shown, f"give {flag} a file name")
    if os.path.lexists(shown.rstrip("".join(_SEPARATORS)) or os.sep):  # 'file/' itself reads as missing
        raise AutocastError(
            "output path ends in a separator but is not a folder",
            shown,
            f"give {flag} the file name without the trailing separator",
        )
    raise AutocastError(
        "output folder does not exist (the path ends in a separator)",
        shown,
        f"create the folder and give {flag} a file name inside it",
    )


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_data_file(path: Path) -> None:
    """Refuse an existing external-data path (OUT.onnx.data) that is not a regular file: the
    model's data is read back at offsets, so it must be a regular file; a FIFO, device, folder
    or socket there is never replaced nor written into."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # not there (or a dangling link, replaced as a link would be)
        return
    if not stat.S_ISREG(mode):
        raise AutocastError(
            f"the model's external data file exists and is {_special_kind(mode)}",
            str(path),
            "external data must be a regular file: remove it, or choose another -o",
        )


def _protected_files(inputs, model_inputs, outputs) -> list[tuple[Path, str]]:
    """(file, why) for every file a command reads: the inputs, the files inside input folders,
    and the external data files of the input models that lie where an output is written."""
    found: list[tuple[Path, str]] = []
    for item in inputs:
        if item is None or is_stdout(item):
            continue
        path = Path(item)
        if path.is_dir():
            try:
                found.extend((child, "input") for child in path.iterdir() if child.is_file())
            except OSError:
                pass
        elif path.exists():
            found.append((path, "input"))
    for item in model_inputs:
        given = item.path if isinstance(item, LoadedModel) else item
        if given is None or not Path(given).is_file():
            continue
        folder = Path(given).resolve().parent
        if not any(out.resolve().is_relative_to(folder) for out in outputs):
            continue  # no output where its external data can be: no need to read the model
        found.extend((Path(given).parent / name, "model data") for name in _external_files(item))
    return found


def _external_files(model) -> list[str]:
    """The external data files of an input model: a LoadedModel's (read already), else those of
    the file, or none when it cannot be read (the command refuses it in its own place)."""
    if isinstance(model, LoadedModel):
        return model.external_files
    try:
        return load_model(model, load_external=False).external_files
    except Exception:
        return []


def check_outputs(
    outputs: Iterable[tuple[str, str | os.PathLike | None]],
    inputs: Iterable = (),
    *,
    models: Collection[str] = (),
    read_back: Collection[str] = (),
    model_inputs: Iterable = (),
) -> None:
    """Refuse, before any work is done, outputs that cannot all be written as asked.

    `outputs` are (option flag, path) pairs, path None when the option is not given; '-' is
    stdout. `inputs` are the files (or folders of files) the command reads, `model_inputs` the
    ONNX models among them, as paths or as LoadedModels read already (their external data files
    are protected too). Flags in `models`
    write an ONNX model: '-' is refused for them and the external data file NAME.data beside the
    model counts as one more output. Flags in `read_back` name a file the command reads again
    after writing it, which must therefore be a regular file.

    Refused, with one AutocastError line each: two outputs that are the same file (compared by
    resolved path, and with os.path.samefile for existing files, so symlinks and hard links
    count; several outputs on the null device are allowed), two outputs on stdout, an output that
    is an input, an output in a folder that does not exist, an output spelled as a folder
    ('out/', see names_folder), a directory, block device or socket given as an output, and an
    existing NAME.data beside a model that is not a regular file."""
    entries = _output_entries(outputs, models, read_back)
    _refuse_writing_inputs(entries, inputs, model_inputs)
    _refuse_shared_outputs(entries)


# (flag, path or STDOUT, the model flag of a data file)
_OutputEntry = tuple[str, "Path | Literal['-']", "str | None"]


def _output_entries(
    outputs: Iterable[tuple[str, str | os.PathLike | None]], models: Collection[str], read_back: Collection[str]
) -> list[_OutputEntry]:
    """check_outputs, first: each given output as an entry (plus NAME.data beside each model),
    refusing a model on stdout, a missing folder, a folder spelling and a non-file read back."""
    entries: list[_OutputEntry] = []
    for flag, path in outputs:
        if path is None:
            continue
        if is_stdout(path):
            if flag in models:
                raise AutocastError(
                    "cannot write the model to stdout ('-')",
                    flag,
                    "give a file path; a model is binary and may need a data file beside it",
                )
            entries.append((flag, STDOUT, None))
            continue
        if names_folder(path):
            _refuse_folder_spelling(flag, path)
        path = Path(path)
        kind = output_kind(path)
        if kind == "file":
            parent = path.parent if str(path.parent) else Path(".")
            if not parent.is_dir():
                raise AutocastError("output folder does not exist", str(parent), "create it first")
        elif flag in read_back:
            raise AutocastError(
                f"{flag} must be a regular file: this command reads the file back after writing it",
                str(path),
                "give a file path",
            )
        entries.append((flag, path, None))
        if flag in models and kind == "file":
            data = path.with_name(path.name + ".data")
            check_data_file(data)
            entries.append((flag, data, flag))
    return entries


def _refuse_writing_inputs(entries: list[_OutputEntry], inputs: Iterable, model_inputs: Iterable) -> None:
    """check_outputs, second: no output is an input file, or a data file of an input model."""
    protected = _protected_files(inputs, model_inputs, [path for _, path, _ in entries if path != STDOUT])
    for flag, path, data_of in entries:
        if path == STDOUT:
            continue
        for item, why in protected:
            if _same_file(path, item):
                if why == "model data" or data_of is not None:
                    raise AutocastError(
                        f"writing {path.name} would overwrite a file of the input model",
                        str(path),
                        "choose another -o; autocast-onnx never modifies its input",
                    )
                raise AutocastError(
                    f"output path is the input (or another file this command reads), given to {flag}",
                    str(path),
                    "choose another path; autocast-onnx never overwrites its input",
                )


def _refuse_shared_outputs(entries: list[_OutputEntry]) -> None:
    """check_outputs, last: no two outputs write the same file, or stdout (or the file it goes to)."""
    for k, (flag, path, data_of) in enumerate(entries):
        for other, other_path, other_data_of in entries[:k]:
            if path == STDOUT and other_path == STDOUT:
                raise AutocastError(
                    f"{other} and {flag} both write to stdout ('-')", STDOUT, "send at most one output to stdout"
                )
            if path == STDOUT or other_path == STDOUT:
                file_flag, file_path = (other, other_path) if path == STDOUT else (flag, path)
                if file_path == STDOUT:  # cannot be: two outputs on stdout are refused just above
                    raise InternalCheckError("two outputs on stdout passed the check")
                if _stdout_is(file_path) and not _is_null_device(file_path):
                    raise AutocastError(
                        f"{file_flag} names the file stdout goes to, where "
                        f"{flag if path == STDOUT else other} writes too",
                        str(file_path),
                        "give each output its own path",
                    )
                continue
            if (data_of is not None and other_data_of is None and other == data_of) or (
                other_data_of is not None and data_of is None and flag == other_data_of
            ):
                continue  # a model and its own data file
            if _same_file(path, other_path) and not _is_null_device(path):
                if data_of is not None or other_data_of is not None:
                    plain, model_flag = (other, data_of) if data_of is not None else (flag, other_data_of)
                    what = f"{plain} names the external data file of {model_flag}"
                else:
                    what = f"{other} and {flag} name the same file"
                raise AutocastError(what, str(path), "give each output its own path")


def check_output_path(out_path: str | os.PathLike, in_path: Path | None) -> None:
    """Refuse to write a model over the input, to stdout, or into a folder that cannot take it."""
    if is_stdout(out_path):
        raise AutocastError(
            "cannot write the model to stdout ('-')",
            "-o",
            "give a file path; a model is binary and may need a data file beside it",
        )
    if names_folder(out_path):
        _refuse_folder_spelling("-o", out_path)
    out_path = Path(out_path)
    if in_path is not None:
        same = out_path.resolve() == in_path.resolve()
        if not same and out_path.exists():
            try:
                same = out_path.samefile(in_path)
            except OSError:
                same = False
        if same:
            raise AutocastError(
                "output path is the input file",
                str(out_path),
                "choose another -o; autocast-onnx never overwrites its input",
            )
    if output_kind(out_path) == "stream":
        return  # written in place: no file is created in its folder
    parent = out_path.parent if str(out_path.parent) else Path(".")
    if not parent.is_dir():
        raise AutocastError("output folder does not exist", str(parent), "create it or choose another -o")
    if out_path.is_dir():
        raise AutocastError("output path is a directory", str(out_path), "give a file name with -o")
    if not os.access(parent, os.W_OK):
        raise AutocastError("output folder is not writable", str(parent), "choose another -o")


def _identity(path: Path):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode


class OutputSnapshot:
    """The state of a command's output paths before it writes them, so that a run that fails
    after writing can remove what it wrote (all or nothing). Only regular files that were created
    or replaced since `track` are removed: a file that existed and is unchanged stays, and a
    FIFO or device written in place is never removed."""

    def __init__(self, paths: Iterable = ()):
        self._before: dict[Path, tuple | None] = {}
        self.track(*paths)

    def track(self, *paths) -> None:
        for path in paths:
            if path is None or is_stdout(path):
                continue
            path = Path(path)
            if path not in self._before:
                self._before[path] = _identity(path)

    def keep(self, *paths) -> None:
        """Stop tracking `paths`: a later discard leaves them (a converted model whose validation
        could not run is kept)."""
        for path in paths:
            if path is not None and not is_stdout(path):
                self._before.pop(Path(path), None)

    def discard(self) -> list[Path]:
        """Remove the regular files written since they were tracked; returns them."""
        removed = []
        for path, before in self._before.items():
            now = _identity(path)
            if now is None or now == before or not stat.S_ISREG(now[4]):
                continue
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
        return removed


def _write_all(fd: int, data) -> None:
    """`data` (bytes-like, or PiecesLike) written whole to the file descriptor `fd`."""
    if isinstance(data, PiecesLike):
        data.write_to(fd)
        return
    write_all(fd, data)


def _write_in_place(path: Path, data) -> None:
    """Write to an existing FIFO or character device: opened as it is, never created or replaced."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def save_model(
    model: onnx.ModelProto,
    out_path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    in_path: Path | None = None,
    payload: bytes | PiecesLike | None = None,
    source_dir: Path | None = None,
    restore: bool = True,
    spill: PayloadSpill | None = None,
    find_external: bool = True,
    verify: Callable[[bytes | PiecesLike], None] | None = None,
) -> list[Path]:
    """Write `model` atomically. With external data (forced, or needed above 2 GB) the large
    initializers go to `<name>.data` beside the model; with restore=False the model object keeps
    pointing at that file afterwards (no second copy of the weights is held for restoring).
    A FIFO or character device as `out_path` is written in place (never replaced; no external
    data). `spill` (a PayloadSpill of this output) already holds the converted payloads: the rest
    is appended to it and it becomes `<name>.data`. `find_external=False` says that no tensor of
    the model is stored as external data (a save in one piece then skips looking for them: a walk
    over every node). `verify(payload)` (a model in one piece) is called on the serialized bytes
    while a thread writes them to the temporary (or, for PiecesLike, written here first, while the
    thread syncs them to disk), which is renamed into place only after both: if it raises,
    nothing is written. An external-data save that puts no tensor in `<name>.data` (all under
    EXTERNAL_MIN_BYTES) writes the model in one piece; a save without a data file removes a
    regular `<name>.data` an earlier save left beside it (it belongs to no model any more). An
    existing `<name>.data` that is not a regular file is refused. Returns the files created
    (none for a FIFO or device)."""
    check_output_path(out_path, in_path)
    out_path = Path(out_path)
    in_place = output_kind(out_path) == "stream"
    if external_data is None:
        external_data = (len(payload) if payload is not None else encoded_size(model)) > PROTOBUF_LIMIT - 64 * 2**20
    if external_data and in_place:
        raise AutocastError(
            "cannot write external data beside a FIFO or device",
            str(out_path),
            "write the model to a regular file, or pass --no-external-data (models under 2 GB)",
        )
    parent = out_path.parent if str(out_path.parent) else Path(".")
    data_name = out_path.name + ".data"
    if not in_place:
        check_data_file(parent / data_name)
    temps: list[Path] = []
    moved: list[tuple[onnx.TensorProto, bytes]] = []
    sources: set[Path] = set()  # the input's data files this save reads
    try:
        finals = []
        if spill is not None and not external_data:
            raise InternalCheckError("converted payloads were spilled to external data, but the save is in one piece")
        if external_data:
            data_tmp = spill.path if spill is not None else _temp_path(parent, data_name)
            temps.append(data_tmp)
            placed = _write_data_file(
                data_tmp, model, data_name, spill, source_dir, in_path, moved if restore else None, sources
            )
            if placed:  # else nothing points at it: no data file, the model is in one piece
                finals.append((data_tmp, parent / data_name))
        if not external_data and find_external and _read_external_in(model, source_dir, in_path, moved, sources):
            payload = None  # the bytes given no longer say what the model holds
        if payload is None or external_data:
            payload = model.SerializeToString()
        if in_place:  # a FIFO or device (/dev/null): written as it is, never replaced
            _write_in_place(out_path, payload)
            return []
        model_tmp = _temp_path(parent, out_path.name)
        temps.append(model_tmp)
        finals.append((model_tmp, out_path))
        _write_model_file(model_tmp, payload, verify if not external_data else None)
        payload = None
        done = _rename_into_place(finals)
        if parent / data_name not in done:
            _remove_stale_data(parent / data_name, sources | ({in_path} if in_path is not None else set()))
        return done
    except OSError as exc:
        raise AutocastError(
            f"cannot write output: {exc.strerror or exc}",
            str(out_path),
            "check free space and permissions; nothing was written",
        ) from None
    finally:
        for tmp in temps:
            if tmp.exists():
                tmp.unlink()
        for tensor, original in moved:
            restore_tensor(tensor, original)


def _write_data_file(data_tmp: Path, model, data_name: str, spill, source_dir, in_path, moved, sources: set) -> int:
    """Fill the data file `data_tmp` (the spill's, which already holds the converted payloads, or a
    new temporary) with the model's large tensors and sync it; returns how many tensors point there."""
    fh = spill.fh if spill is not None else open(data_tmp, "wb")
    with fh:
        placed = _fill_data_file(fh, model, data_name, spill, source_dir, in_path, moved, sources)
        fh.flush()
        os.fsync(fh.fileno())
    return placed


def _read_external_in(model: onnx.ModelProto, source_dir, in_path, moved: list, sources: set) -> bool:
    """For a save in one piece: read every tensor stored as external data into the model (each
    original kept in `moved` for restoring, each source file in `sources`); returns whether any was."""
    found = False
    for tensor in _all_tensors_for_external(model.graph):
        if is_external(tensor):
            if source_dir is None:
                raise _no_source_dir(tensor)
            sources.add(external_location(tensor, source_dir, str(in_path))[0])
            raw = read_external(tensor, source_dir, str(in_path))
            moved.append((tensor, onnx.TensorProto.FromString(tensor.SerializeToString())))
            del tensor.external_data[:]
            tensor.ClearField("data_location")
            tensor.raw_data = raw
            found = True
    return found


def _write_model_file(model_tmp: Path, payload: bytes | PiecesLike, verify) -> None:
    """Write and sync the model's bytes to its temporary; `verify(payload)` (None: no check) runs
    while they are written, and a failure of either leaves the temporary for the caller to remove."""
    with open(model_tmp, "wb") as fh:
        if verify is None:
            _write_and_sync(fh, payload)
            return
        # the write waits in the kernel, without the GIL, while the check parses these bytes or
        # their stand-in (renamed into place only after both); the fsync needs the GIL to start,
        # which the checker holds, so it comes after the check. PiecesLike are written first, here: a
        # writev per IOV_MAX buffers, each needing the GIL to start, would wait for the whole check
        # in a thread; their fsync waits beside it.
        if isinstance(payload, PiecesLike):
            payload.write_to(fh.fileno())
            writing = _InBackground(os.fsync, fh.fileno())
        else:
            writing = _InBackground(_write_and_sync, fh, payload)
        try:
            verify(payload)
        finally:
            writing.wait()


def _rename_into_place(finals: list[tuple[Path, Path]]) -> list[Path]:
    """Rename each temporary to its final name; if one fails, remove those already renamed (this
    save's, and incomplete without the rest) and raise. Returns the final paths."""
    done: list[Path] = []
    try:
        for tmp, final in finals:
            os.replace(tmp, final)
            done.append(final)
    except OSError:
        for final in done:
            final.unlink(missing_ok=True)
        raise
    return done


def _fill_data_file(fh, model, data_name: str, spill, source_dir, in_path, moved, sources: set) -> int:
    """Write the model's tensors of EXTERNAL_MIN_BYTES or more to the open data file `fh` (after
    what `spill` holds) and point them at `data_name`; returns how many tensors point there. An
    external tensor of the source is copied across in chunks, never whole, or read into the
    model when it is smaller. `moved` (None: not kept) receives (tensor, original) for restoring
    the model afterwards; `sources` the source files read."""
    offset = spill.offset if spill is not None else 0
    placed = 0
    for tensor in _all_tensors_for_external(model.graph):
        if spill is not None and spill.holds(tensor):  # written during the conversion
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = data_name
            placed += 1
            continue
        if is_external(tensor):
            if source_dir is None:
                raise _no_source_dir(tensor)
            source, src_offset, length, _ = external_location(tensor, source_dir, str(in_path))
            sources.add(source)
            if moved is not None:
                moved.append((tensor, onnx.TensorProto.FromString(tensor.SerializeToString())))
            if length < EXTERNAL_MIN_BYTES:
                restore_tensor(tensor, _read_range(source, src_offset, length))
                continue
            offset = _pad_to_64(fh, offset)
            _copy_range(source, src_offset, length, fh)
            _set_external(tensor, data_name, offset, length)
            offset += length
            placed += 1
            continue
        raw = _large_payload(tensor)
        if raw is None:
            continue
        offset = _pad_to_64(fh, offset)
        fh.write(raw)
        if moved is not None:
            original = raw if tensor.HasField("raw_data") else onnx.TensorProto.FromString(tensor.SerializeToString())
            moved.append((tensor, original))
        size = len(raw)
        del raw
        _set_external(tensor, data_name, offset, size)
        offset += size
        placed += 1
    return placed


def _large_payload(tensor: onnx.TensorProto) -> bytes | None:
    """The payload of an in-memory tensor of EXTERNAL_MIN_BYTES or more (None: it stays in the model)."""
    raw = tensor.raw_data if tensor.HasField("raw_data") else None
    if raw is None:
        if tensor.data_type == onnx.TensorProto.STRING:
            return None
        arr = numpy_helper.to_array(tensor)
        if arr.nbytes < EXTERNAL_MIN_BYTES:
            return None
        raw = arr.tobytes()
    return raw if len(raw) >= EXTERNAL_MIN_BYTES else None


def _pad_to_64(fh, offset: int) -> int:
    """Zeros up to the next multiple of 64 bytes; returns the new offset."""
    pad = (-offset) % 64
    fh.write(b"\0" * pad)
    return offset + pad


def _remove_stale_data(path: Path, sources: set) -> None:
    """Remove the regular file `path` (NAME.data) that an earlier save left beside NAME, now
    written without one: it belongs to no model any more and would read as this model's data.
    A link, a special file or a file this save read from stays."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) or any(_same_file(path, source) for source in sources):
        return
    try:
        path.unlink()
    except OSError:
        pass  # the model is written; a data file that cannot be removed is left as it was


def _write_and_sync(fh, payload: bytes | PiecesLike) -> None:
    if isinstance(payload, PiecesLike):
        fh.flush()
        payload.write_to(fh.fileno())
    else:
        fh.write(payload)
        fh.flush()
    os.fsync(fh.fileno())


class _InBackground:
    """`fn(*args)` on a thread of its own; wait() joins it and raises what it raised."""

    def __init__(self, fn, *args):
        self._error: BaseException | None = None

        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # handed to wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name="autocast-onnx-write", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class PayloadSpill:
    """The output's external-data file, written while the conversion produces payloads: each
    converted tensor of EXTERNAL_MIN_BYTES or more goes to disk at once and the tensor points at
    it, so memory does not grow with the weights. The file is a temporary beside the output
    (recorded as each tensor's location until save_model renames it), removed by discard() if
    the conversion fails: the output still appears whole or not at all."""

    def __init__(self, out_path: Path):
        out_path = Path(out_path)
        self.out_path = out_path
        parent = out_path.parent if str(out_path.parent) else Path(".")
        self.data_name = out_path.name + ".data"
        self.path = _temp_path(parent, self.data_name)
        self.fh = open(self.path, "wb")
        self.offset = 0
        self.tensors = 0

    def put(self, tensor: onnx.TensorProto, payload: bytes) -> bool:
        """Write `payload` as `tensor`'s data; False (nothing written) for a small payload."""
        if len(payload) < EXTERNAL_MIN_BYTES:
            return False
        pad = (-self.offset) % 64
        try:
            self.fh.write(b"\0" * pad)
            self.fh.write(payload)
        except OSError as exc:
            raise AutocastError(
                f"cannot write output: {exc.strerror or exc}",
                str(self.out_path),
                "check free space and permissions; nothing was written",
            ) from None
        self.offset += pad
        _set_external(tensor, self.path.name, self.offset, len(payload))
        self.offset += len(payload)
        self.tensors += 1
        return True

    put_new = put  # a new tensor's external-data entries travel with it when protobuf copies it in

    def holds(self, tensor: onnx.TensorProto) -> bool:
        return is_external(tensor) and any(
            e.key == "location" and e.value == self.path.name for e in tensor.external_data
        )

    def discard(self) -> None:
        if not self.fh.closed:
            self.fh.close()
        self.path.unlink(missing_ok=True)


def _no_source_dir(tensor: onnx.TensorProto) -> AutocastError:
    return AutocastError(
        f"initializer {tensor.name!r} uses external data but no source_dir was given",
        None,
        "pass source_dir, the folder of the model it was loaded from",
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _read_range(source: Path, offset: int, length: int) -> bytes:
    with open(source, "rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    if len(data) != length:
        raise OSError(f"{source} ended early")
    return data


def _copy_range(source: Path, offset: int, length: int, out, chunk: int = 64 * 2**20) -> None:
    with open(source, "rb") as fh:
        fh.seek(offset)
        left = length
        while left:
            block = fh.read(min(chunk, left))
            if not block:
                raise OSError(f"{source} ended early")
            out.write(block)
            left -= len(block)


TEMP_MARK: Final = ".autocast-tmp."


def _machine_tag() -> str:
    """8 hex digits naming this machine and PID namespace: a temporary's PID is only looked up
    where it can mean the process that wrote it (a folder may be shared with other machines)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return hashlib.sha256(f"{socket.gethostname()}/{namespace}".encode()).hexdigest()[:8]


_MACHINE: Final = _machine_tag()
_TEMP_TAIL = re.compile(r"([0-9a-f]{8})-([0-9]+)\.[a-z0-9_]{8}")  # MACHINE-PID.RANDOM (mkstemp's 8 characters)


def _temp_stem(name: str) -> str:
    """`.NAME.autocast-tmp.`: how every temporary for the file `name` begins (a NAME too long for
    a temporary's name to fit the file system's limit is replaced by its digest)."""
    if len(os.fsencode(name)) > 180:
        name = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return f".{name}{TEMP_MARK}"


def temp_prefix(name: str, pid: int | None = None) -> str:
    """How the temporaries for the file `name` are named: `.NAME.autocast-tmp.MACHINE-PID.`, then
    8 random characters (mkstemp's); PID is this process's by default."""
    return f"{_temp_stem(name)}{_MACHINE}-{os.getpid() if pid is None else pid}."


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` may be alive on this machine (when in doubt: yes)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process, or no such PID can exist here
        return True
    return True


def remove_stale_temps(parent: Path, name: str) -> list[Path]:
    """Remove the temporaries for `name` and `name.data` in `parent` that a process of this
    machine left when it was killed mid-write (SIGKILL, power loss): regular files of this user,
    named by temp_prefix, whose PID is no longer alive. Returns them."""
    stems = (_temp_stem(name), _temp_stem(name + ".data"))
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        stem = next((each for each in stems if entry.name.startswith(each)), None)
        tail = _TEMP_TAIL.fullmatch(entry.name, len(stem)) if stem is not None else None
        if tail is None or tail[1] != _MACHINE or _pid_alive(int(tail[2])):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def _temp_path(parent: Path, name: str) -> Path:
    """A new empty file beside the destination, named by temp_prefix, with the permissions a plain
    open() would give (mkstemp's are owner-only). The stale temporaries a killed run left for
    the same file are removed first."""
    remove_stale_temps(parent, name)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(name), dir=parent)
    os.fchmod(fd, _FILE_MODE)
    os.close(fd)
    return Path(tmp)


def _set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    for fld in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(fld)
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def restore_tensor(tensor: onnx.TensorProto, original) -> None:
    """Give `tensor` back its own payload (`original`: raw bytes, or the whole tensor as it was),
    no longer external."""
    del tensor.external_data[:]
    tensor.ClearField("data_location")
    if isinstance(original, bytes):
        tensor.raw_data = original
    else:
        tensor.CopyFrom(original)


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return math.prod(tensor.dims) * ITEMSIZE.get(tensor.data_type, 4)


def write_binary_output(path: str | os.PathLike, fill: Callable[[BinaryIO], object], flag: str) -> None:
    """Write a binary output file (--save-inputs) as every other output is written: `fill(fh)`
    writes its bytes into a temporary beside `path` (temp_prefix), renamed into place once whole;
    a FIFO or character device is opened as it is and written in place, never replaced. Refused
    in one line: a path spelled as a folder ('out/', names_folder), a directory, block device or
    socket (stat_output_kind), a missing folder."""
    if names_folder(path) or names_folder(Path(path)):
        _refuse_folder_spelling(flag, path)
    path = Path(path)
    if output_kind(path) == "stream":
        _fill_in_place(path, fill)
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AutocastError("output folder does not exist", str(parent), f"create it, or give {flag} another path")
    tmp = None
    try:
        tmp = _temp_path(parent, path.name)
        with open(tmp, "wb") as fh:
            fill(fh)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise AutocastError(
            f"cannot write file: {exc.strerror or exc}", str(path), "check free space and permissions"
        ) from None
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def _fill_in_place(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """write_binary_output to an existing FIFO or character device: the bytes made in memory (a
    writer such as zipfile seeks back, which a pipe cannot and a device only pretends to), then
    written into it, opened without creating or truncating anything, if the open descriptor is
    still one (a path swapped for a regular file since it was looked at is refused, not written
    over)."""
    from io import BytesIO

    made = BytesIO()
    fill(made)
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise AutocastError(f"cannot write file: {exc.strerror or exc}", str(path), "check the reader") from None
    try:
        if stat_output_kind(os.fstat(fd), str(path)) != "stream":
            raise AutocastError(
                "output path changed from a FIFO or device to a file while it was opened", str(path), "run again"
            )
        write_all(fd, made.getbuffer())
    except OSError as exc:
        raise AutocastError(f"cannot write file: {exc.strerror or exc}", str(path), "check the reader") from None
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file (plan, report) atomically. '-' writes to stdout, and a FIFO or
    character device is written in place (never replaced by a regular file)."""
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(path)
    if output_kind(path) == "stream":
        try:
            _write_in_place(path, text.encode("utf-8"))
        except OSError as exc:
            raise AutocastError(f"cannot write file: {exc.strerror or exc}", str(path), "check the reader") from None
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AutocastError("output folder does not exist", str(parent), "create it first")
    tmp = None
    try:
        tmp = _temp_path(parent, path.name)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise AutocastError(f"cannot write file: {exc.strerror or exc}", str(path), "check permissions") from None
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
