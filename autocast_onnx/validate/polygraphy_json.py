"""Polygraphy's JSON input files: what `polygraphy run MODEL --save-inputs FILE.json` and
`polygraphy data merge` write and `--load-inputs` reads, so that validation, calibration and
diagnosis take the inputs a Polygraphy user already has, and `--save-inputs FILE.json` hands
Polygraphy ours.

The format is Polygraphy's JSON encoder's (polygraphy/json/serde.py): a JSON list of feed dicts,
one per iteration, or one feed dict alone (each file of `--save-inputs FOLDER`); a feed dict maps
an input name to an encoded array, `{"array": BASE64, "polygraphy_class": "ndarray"}`, where
BASE64 holds the bytes `numpy.save(..., allow_pickle=False)` writes (an .npy file). Older
Polygraphy versions marked the type with `"__polygraphy_encoded_ndarray":
"polygraphy_serialized_json_type"` and may hold the .npy bytes as latin-1 text; both are read.

Nothing here unpickles: an entry is decoded only as .npy bytes of plain data, read with
`allow_pickle=False`. A torch tensor (which `torch.save` pickles), an object array, a pickle, an
.npz (an old Polygraphy encoding) or any other type is refused in one error line. This module
decodes and checks the format only; what the model's inputs need of the arrays (names, types,
shapes, size limits) is checked by `inputs.py`, as for an .npz."""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import AutocastError
from ..io import open_regular

SUFFIX = ".json"
TYPE_KEY = "polygraphy_class"  # Polygraphy's constants.TYPE_MARKER
LEGACY_TYPE_KEY = "__polygraphy_encoded_ndarray"
LEGACY_TYPE_VALUE = "polygraphy_serialized_json_type"  # Polygraphy's constants.LEGACY_TYPE_MARKER
ARRAY_KEYS = frozenset({"array", TYPE_KEY, LEGACY_TYPE_KEY})
NPY_MAGIC = b"\x93NUMPY"
# A file is parsed whole (json.loads); one larger than this is refused before it is read.
# Polygraphy itself advises a folder of per-iteration files for large data.
FILE_LIMIT = 3 * 2**30
WRITER = "polygraphy run MODEL --onnxrt --save-inputs FILE.json"
# what to do about an input file (given, or in an inputs folder) that is not a regular file
NOT_A_FILE = "save the inputs to a regular file and give that; they are never read from a FIFO or a device"


def is_json(path: str | os.PathLike) -> bool:
    """Whether `path` names a Polygraphy JSON input file (by its suffix, as --save-inputs decides)."""
    return str(path).lower().endswith(SUFFIX)


@dataclass
class EncodedArray:
    """One array of a feed dict: its .npy bytes and, from the header, its shape and dtype and where
    its data starts. Nothing but the header is read until `load`."""

    name: str
    npy: bytes
    shape: tuple[int, ...]
    dtype: np.dtype
    data_offset: int

    @property
    def data_bytes(self) -> int:
        """Bytes of data the .npy holds after its header."""
        return len(self.npy) - self.data_offset

    def load(self, where: str) -> np.ndarray:
        """The array, read with allow_pickle=False (an object array was refused at decoding)."""
        try:
            array = np.load(io.BytesIO(self.npy), allow_pickle=False)
        except Exception as exc:
            raise AutocastError(
                f"cannot read array {self.name!r}: {' '.join(str(exc).split())}", where, f"write it again with {WRITER}"
            ) from None
        if not isinstance(array, np.ndarray):
            raise AutocastError(f"array {self.name!r} is not an .npy array", where, f"write it again with {WRITER}")
        return array


def read_feed_dicts(f: Path) -> list[dict]:
    """The feed dicts of one file, each a dict of input name -> its encoded entry (not decoded):
    a JSON list of feed dicts, or one feed dict. Refuses what is not a regular file (a FIFO, a
    device, a symlink to one: io.open_regular), a file over FILE_LIMIT, text that is not JSON, a
    name given twice in one feed dict, an empty list and anything that is not a feed dict."""
    where = str(f)
    try:
        text = _read_limited(f).decode("utf-8")
    except OSError as exc:
        raise AutocastError(
            f"cannot read file: {exc.strerror or exc}", where, "check the path and permissions"
        ) from None
    except UnicodeDecodeError as exc:
        raise AutocastError(f"is not JSON: not UTF-8 text ({exc.reason})", where, f"write it with {WRITER}") from None
    try:
        loaded = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise AutocastError(
            f"a feed dict names {dup.key!r} twice", where, "give each input once per feed dict"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise AutocastError(f"is not JSON: {' '.join(str(exc).split())}", where, f"write it with {WRITER}") from None
    dicts = loaded if isinstance(loaded, list) else [loaded] if isinstance(loaded, dict) else None
    if dicts is None:
        raise AutocastError(
            f"holds {_kind(loaded)}, not a list of feed dicts (or one feed dict)",
            where,
            f"write it with {WRITER}, or give an .npz",
        )
    if not dicts:
        raise AutocastError("holds no feed dicts (an empty list)", where, "give at least one feed dict")
    for k, feeds in enumerate(dicts):
        if not isinstance(feeds, dict):
            raise AutocastError(
                f"feed dict {k} is {_kind(feeds)}, not an object of NAME: array",
                where,
                f"write it with {WRITER}",
            )
    return dicts


def _read_limited(f: Path) -> bytes:
    """The bytes of the regular file `f`, refused (before they are read) when there are more than
    FILE_LIMIT of them: by its size, and by what it gives (it may grow while it is read)."""
    with open_regular(f, NOT_A_FILE) as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(FILE_LIMIT + 1) if size <= FILE_LIMIT else b""
    if size > FILE_LIMIT or len(data) > FILE_LIMIT:
        raise AutocastError(
            f"the JSON input file takes {max(size, len(data)) / 2**30:.3g} GiB, over the "
            f"{FILE_LIMIT / 2**30:.3g} GiB a file may take (it is read whole)",
            str(f),
            "save the inputs to a folder of per-iteration files: polygraphy run --save-inputs FOLDER",
        )
    return data


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """json's object hook: a JSON object as a dict, refusing a key given twice (json would keep
    the last silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _kind(value) -> str:
    """A JSON value's kind in words: 'a number', 'a list', ..."""
    if isinstance(value, bool) or value is None:
        return "a boolean" if value is not None else "null"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}[type(value)]


def decode_array(entry, name: str, k: int, where: str) -> EncodedArray:
    """The array `name` of feed dict `k` decoded to its .npy bytes, its header read. Refuses an
    entry of another type (a torch tensor, a plain JSON list), unknown keys, text that is not
    base64, bytes that are not an .npy file (a pickle, an .npz) and an object array."""
    what = f"array {name!r} of feed dict {k}"
    if not isinstance(entry, dict):
        raise AutocastError(
            f"{what} is {_kind(entry)}, not an encoded array",
            where,
            f"write it with {WRITER}: each array is .npy, base64",
        )
    kind = entry.get(TYPE_KEY, "ndarray" if entry.get(LEGACY_TYPE_KEY) == LEGACY_TYPE_VALUE else None)
    if kind == "Tensor" or "tensor" in entry:
        raise AutocastError(
            f"{what} is a torch tensor, which torch.save pickles; autocast-onnx never unpickles",
            where,
            "save numpy arrays: polygraphy run ... --data-loader-backend-module numpy --save-inputs FILE.json",
        )
    if kind != "ndarray":
        raise AutocastError(
            f"{what} is {'of type ' + repr(kind) if kind else 'an object without ' + TYPE_KEY}, not a numpy array "
            f"({TYPE_KEY} 'ndarray')",
            where,
            f"write it with {WRITER}",
        )
    unknown = sorted(set(entry) - ARRAY_KEYS)
    if unknown or not isinstance(entry.get("array"), str):
        problem = f"unexpected key {unknown[0]!r}" if unknown else "no 'array' text"
        raise AutocastError(f"{what} has {problem}", where, f"write it with {WRITER}")
    return _npy_header(name, _npy_bytes(entry["array"], what, where), what, where)


def _npy_bytes(text: str, what: str, where: str) -> bytes:
    """The bytes of an entry's text: base64, or (older Polygraphy) the .npy bytes as latin-1."""
    if text.startswith(NPY_MAGIC.decode("latin-1")):
        try:
            return text.encode("latin-1")
        except UnicodeEncodeError:
            pass
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise AutocastError(
            f"{what} is not valid base64, so the file is truncated or edited: {' '.join(str(exc).split())}",
            where,
            f"write it again with {WRITER}",
        ) from None


def _npy_header(name: str, data: bytes, what: str, where: str) -> EncodedArray:
    """An EncodedArray of .npy bytes, its header read; refuses other bytes and object arrays."""
    from numpy.lib import format as npy

    if not data.startswith(NPY_MAGIC):
        raise AutocastError(f"{what} holds {_foreign(data)}, not an .npy array", where, _never_unpickled())
    fh = io.BytesIO(data)
    try:
        version = npy.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = npy.read_array_header_2_0(fh)
        else:  # a newer header: numpy reads it (never a pickle: allow_pickle=False)
            array = np.load(io.BytesIO(data), allow_pickle=False)
            return EncodedArray(name, data, tuple(array.shape), array.dtype, len(data) - array.nbytes)
    except Exception as exc:
        message = " ".join(str(exc).split())
        if "allow_pickle" in message:
            raise AutocastError(f"{what} is an object array (a pickle)", where, _never_unpickled()) from None
        raise AutocastError(
            f"{what}: cannot read its .npy header: {message}", where, f"write it again with {WRITER}"
        ) from None
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise AutocastError(f"{what} is an object array (a pickle)", where, _never_unpickled())
    return EncodedArray(name, data, tuple(int(d) for d in shape), dtype, fh.tell())


def _foreign(data: bytes) -> str:
    """What bytes that are not .npy look like, in words."""
    if data[:1] == b"\x80":
        return "a Python pickle"
    if data.startswith(b"PK"):
        return "a zip archive (an .npz or a torch.save file)"
    return "bytes of an unknown format"


def _never_unpickled() -> str:
    return "autocast-onnx never unpickles: save plain numeric numpy arrays, as polygraphy run --save-inputs writes them"


def encode(batches: list[dict]) -> str:
    """Batches as Polygraphy's JSON: a list of feed dicts, each array as Polygraphy's encoder
    writes it (numpy.save's bytes, allow_pickle=False, base64), indented as Polygraphy indents."""
    return json.dumps(
        [{name: _encoded(np.asarray(value)) for name, value in feeds.items()} for feeds in batches], indent=4
    )


def _encoded(array: np.ndarray) -> dict:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), TYPE_KEY: "ndarray"}
