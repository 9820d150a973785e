"""Stage 0 and last: read a model from disk and write one back.

Reading parses the protobuf directly (fast) and loads external data after checking that
every location stays inside the model's folder. Writing is atomic: everything goes to
temporary files in the destination folder and is renamed into place only when complete,
so a failure never leaves a half-written model or touches the input.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from .errors import AutocastError

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


def load_model(path: str | os.PathLike, load_external: bool = True) -> LoadedModel:
    """Read an ONNX file; raise AutocastError with one clear line for anything unusable.

    External data locations are always checked (inside the model's folder, file present, range
    within the file). With load_external=False the bytes stay on disk and are read one tensor at
    a time when needed (see tensor_bytes), so a model larger than memory can be converted."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise AutocastError("file not found", where, "check the path")
    if path.is_dir():
        raise AutocastError("is a directory, not an ONNX file", where, "pass the .onnx file inside it")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AutocastError(f"cannot read file: {exc.strerror}", where, "check its permissions") from None
    if not data:
        raise AutocastError("file is empty", where, "re-export the model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise AutocastError("not an ONNX model (protobuf parse failed: truncated or corrupted?)", where,
                            "re-export the model or check the download") from None
    if not model.HasField("graph") or (not model.opset_import and model.ir_version == 0):
        raise AutocastError("not an ONNX model (no graph or opset in the file)", where, "pass a .onnx model file")
    loaded = LoadedModel(model=model, path=path, file_bytes=len(data))
    files = set()
    for tensor in _graph_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if load_external:
                files.add(load_external_tensor(tensor, path.parent, where))
            else:
                files.add(external_location(tensor, path.parent, where)[3])
    loaded.external_data = bool(files)
    loaded.external_files = sorted(files)
    return loaded


def _graph_tensors(graph: onnx.GraphProto):
    """Initializers of `graph` (subgraph initializers are found by the graph index)."""
    yield from graph.initializer


def external_location(tensor: onnx.TensorProto, base_dir: Path, where: str) -> tuple[Path, int, int, str]:
    """(file, offset, length, location) of an external tensor, after refusing locations outside
    `base_dir`, missing files and ranges beyond the file. Reads nothing."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    what = f"initializer '{tensor.name}'"
    if not location:
        raise AutocastError(f"{what} has external data without a location", where, "re-save the model")
    loc = Path(location)
    base = Path(base_dir).resolve()
    target = (base / loc).resolve()
    if loc.is_absolute() or ".." in loc.parts or not target.is_relative_to(base):
        raise AutocastError(f"{what}: external data location '{location}' is outside the model's folder",
                            where, "external data must sit beside the model; refusing to read it")
    if not target.is_file():
        raise AutocastError(f"{what}: external data file '{location}' is missing", where,
                            "copy the data file next to the model")
    size = target.stat().st_size
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else size - offset
    except ValueError:
        raise AutocastError(f"{what}: external data offset/length are not numbers", where,
                            "re-save the model") from None
    if offset < 0 or length < 0:
        raise AutocastError(f"{what}: external data offset {offset} / length {length} is negative", where,
                            "re-save the model")
    if offset + length > size:
        raise AutocastError(f"{what}: external data range {offset}+{length} exceeds '{location}' ({size} bytes)",
                            where, "the data file is truncated or belongs to another model")
    return target, offset, length, location


def read_external(tensor: onnx.TensorProto, base_dir: Path, where: str = "<model>") -> bytes:
    target, offset, length, _ = external_location(tensor, base_dir, where)
    with open(target, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def load_external_tensor(tensor: onnx.TensorProto, base_dir: Path, where: str) -> str:
    """Read one tensor's external bytes into raw_data, refusing locations outside `base_dir`."""
    location = external_location(tensor, base_dir, where)[3]
    tensor.raw_data = read_external(tensor, base_dir, where)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    return location


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def tensor_bytes(tensor: onnx.TensorProto, base_dir: Path | None) -> bytes:
    """The little-endian payload of a tensor, wherever it is stored (one tensor in memory)."""
    if is_external(tensor):
        if base_dir is None:
            raise AutocastError(f"initializer '{tensor.name}' uses external data but the model has no folder",
                                None, "load the model from its file")
        return read_external(tensor, base_dir)
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    if tensor.data_type == onnx.TensorProto.BFLOAT16:
        return np.asarray(tensor.int32_data, dtype="<u2").tobytes()
    return numpy_helper.to_array(tensor).tobytes()


def tensor_array(tensor: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """The tensor as an array (bf16 as its raw uint16 bits), reading external data if needed."""
    if not is_external(tensor):
        if tensor.data_type == onnx.TensorProto.BFLOAT16:
            return np.frombuffer(tensor_bytes(tensor, None), dtype="<u2").reshape(tuple(tensor.dims))
        return numpy_helper.to_array(tensor)
    dtype = {onnx.TensorProto.BFLOAT16: "<u2"}.get(tensor.data_type) or \
        np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    return np.frombuffer(tensor_bytes(tensor, base_dir), dtype=dtype).reshape(tuple(tensor.dims))


def _all_tensors_for_external(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors_for_external(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _all_tensors_for_external(sub)


def refuse_overwriting(outputs, inputs) -> None:
    """Refuse report/output paths that name one of the input files, or a folder that does not
    exist - before any work is done."""
    protected = set()
    for item in inputs:
        if item is not None and Path(item).exists():
            protected.add(Path(item).resolve())
    for out in outputs:
        if out is None or str(out) == "-":
            continue
        out = Path(out)
        if out.resolve() in protected:
            raise AutocastError("output path is the input (or another file this command reads)", str(out),
                                "choose another path; autocast-onnx never overwrites its input")
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            raise AutocastError("output folder does not exist", str(parent), "create it first")
        if out.is_dir():
            raise AutocastError("output path is a directory", str(out), "give a file name")


def check_output_path(out_path: Path, in_path: Path | None) -> None:
    """Refuse to write over the input or into a folder that cannot take the file."""
    if in_path is not None:
        same = out_path.resolve() == in_path.resolve()
        if not same and out_path.exists():
            try:
                same = out_path.samefile(in_path)
            except OSError:
                same = False
        if same:
            raise AutocastError("output path is the input file", str(out_path),
                                "choose another -o; autocast-onnx never overwrites its input")
    parent = out_path.parent if str(out_path.parent) else Path(".")
    if not parent.is_dir():
        raise AutocastError("output folder does not exist", str(parent), "create it or choose another -o")
    if out_path.is_dir():
        raise AutocastError("output path is a directory", str(out_path), "give a file name with -o")
    if not os.access(parent, os.W_OK):
        raise AutocastError("output folder is not writable", str(parent), "choose another -o")


def save_model(model: onnx.ModelProto, out_path: str | os.PathLike, *, external_data: bool | None = None,
               in_path: Path | None = None, payload: bytes | None = None,
               source_dir: Path | None = None, restore: bool = True) -> list[Path]:
    """Write `model` atomically. With external data (forced, or needed above 2 GB) the large
    initializers go to `<name>.data` beside the model; with restore=False the model object keeps
    pointing at that file afterwards (no second copy of the weights is held for restoring).
    Returns the files written."""
    out_path = Path(out_path)
    check_output_path(out_path, in_path)
    if external_data is None:
        external_data = (len(payload) if payload is not None else model.ByteSize()) > PROTOBUF_LIMIT - 64 * 2**20
    parent = out_path.parent if str(out_path.parent) else Path(".")
    temps: list[Path] = []
    moved: list[tuple[onnx.TensorProto, bytes]] = []
    try:
        finals = []
        if external_data:
            data_name = out_path.name + ".data"
            data_tmp = _temp_path(parent, data_name)
            temps.append(data_tmp)
            offset = 0
            with open(data_tmp, "wb") as fh:
                for tensor in _all_tensors_for_external(model.graph):
                    if is_external(tensor):
                        # still on disk in the source: copy it across in chunks, never whole
                        source, src_offset, length, _ = external_location(tensor, source_dir, str(in_path))
                        pad = (-offset) % 64
                        fh.write(b"\0" * pad)
                        offset += pad
                        _copy_range(source, src_offset, length, fh)
                        if restore:
                            moved.append((tensor, onnx.TensorProto.FromString(tensor.SerializeToString())))
                        _set_external(tensor, data_name, offset, length)
                        offset += length
                        continue
                    raw = tensor.raw_data if tensor.HasField("raw_data") else None
                    if raw is None:
                        if tensor.data_type == onnx.TensorProto.STRING:
                            continue
                        arr = numpy_helper.to_array(tensor)
                        if arr.nbytes < EXTERNAL_MIN_BYTES:
                            continue
                        raw = arr.tobytes()
                    if len(raw) < EXTERNAL_MIN_BYTES:
                        continue
                    pad = (-offset) % 64
                    fh.write(b"\0" * pad)
                    offset += pad
                    fh.write(raw)
                    if restore:
                        moved.append((tensor, onnx.TensorProto.FromString(tensor.SerializeToString())
                                      if not tensor.HasField("raw_data") else raw))
                    size = len(raw)
                    del raw
                    _set_external(tensor, data_name, offset, size)
                    offset += size
                fh.flush()
                os.fsync(fh.fileno())
            finals.append((data_tmp, parent / data_name))
        if not external_data:
            for tensor in _all_tensors_for_external(model.graph):
                if is_external(tensor):
                    raw = read_external(tensor, source_dir, str(in_path))
                    moved.append((tensor, onnx.TensorProto.FromString(tensor.SerializeToString())))
                    del tensor.external_data[:]
                    tensor.data_location = onnx.TensorProto.DEFAULT
                    tensor.raw_data = raw
                    payload = None
        model_tmp = _temp_path(parent, out_path.name)
        temps.append(model_tmp)
        if payload is None or external_data:
            payload = model.SerializeToString()
        with open(model_tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        finals.append((model_tmp, out_path))
        done = []
        try:
            for tmp, final in finals:
                os.replace(tmp, final)
                done.append(final)
        except OSError:
            for final in done:       # ours and incomplete without the rest: remove
                final.unlink(missing_ok=True)
            raise
        return [final for _, final in finals]
    except OSError as exc:
        raise AutocastError(f"cannot write output: {exc.strerror or exc}", str(out_path),
                            "check free space and permissions; nothing was written") from None
    finally:
        for tmp in temps:
            if tmp.exists():
                tmp.unlink()
        for tensor, original in moved:
            _restore(tensor, original)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


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


def _temp_path(parent: Path, name: str) -> Path:
    """A new empty file beside the destination, with the permissions a plain open() would give
    (mkstemp's are owner-only)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
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


def _restore(tensor: onnx.TensorProto, original) -> None:
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    if isinstance(original, bytes):
        tensor.raw_data = original
    else:
        tensor.CopyFrom(original)


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    itemsize = {onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.DOUBLE: 8,
                onnx.TensorProto.INT64: 8, onnx.TensorProto.UINT64: 8, onnx.TensorProto.INT8: 1,
                onnx.TensorProto.UINT8: 1, onnx.TensorProto.BOOL: 1, onnx.TensorProto.INT16: 2,
                onnx.TensorProto.UINT16: 2}.get(tensor.data_type, 4)
    return count * itemsize


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file (plan, report) atomically."""
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
