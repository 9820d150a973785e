"""The weight screen on the second core. While the main process loads, indexes and classifies a
model, a forked worker converts the main graph's fp32 initializers to fp16 into memory both
processes share, and finds which of them lost range (hazards.fp16_lost, the test the in-process
screen makes). The data rules then read those results instead of converting the weights
themselves, and the rewrite stores the shared fp16 bytes.

Why a process: reading protobuf payloads and joining them holds the GIL, so a thread gains
nothing. Why it reads the file: forked before the model is loaded, the worker shares no model
memory with the main process (every page a fork shares is copied on its first write after it),
and it parses no model of its own either: it walks the file's protobuf encoding for the
initializers' raw payloads and converts them straight from the mapped file, so its memory is
the interpreter and one group of tensors, whatever the model's size.

The worker (worker.py) walks the file once for the loader too, and the command line forks it
before importing onnx and numpy. Used when it can pay: Linux, fp16 target, a model in memory
(no spill to external data), no other thread running (a fork copies only the calling thread),
at least MIN_BYTES of model file, and a process of at most MAX_PARENT_BYTES resident (the
command line's is ~15 MiB before its imports; a long-running process that holds more would pay
a copy of each shared page it writes).
Anything unexpected (the worker died, met an encoding it does not walk, named a tensor the
loaded model does not have there, converted bytes that are not the payload the loaded model
holds for that tensor, the file was replaced) makes `results()` return None, and classification
screens the weights itself, as it does without a worker. The worker's walk is checked, not
trusted: each tensor it converted must be, in the loaded model, the tensor of that name at that
ordinal, fp32, with that payload: left in the file at the offset the worker read, or held in
memory with the same bytes as the file there.

    screen = WeightScreen.start(path)       # before the model is loaded
    loaded = load_model(path, ..., prepared=screen.encoding)
    ...
    screened = screen.results(model)        # {name: (fp16 bytes view, lost)} or None
"""

from __future__ import annotations

import logging
import mmap
import os
from array import array
from collections.abc import Collection

import numpy as np
from onnx import TensorProto

from ..errors import InternalCheckError
from ..filesys import identity, stat_identity
from . import worker
from .screen_work import _ROW_ITEMS  # the worker's half

log = logging.getLogger(__name__)

MIN_BYTES = worker.MIN_BYTES  # model file bytes below which the fork costs more than it saves
MAX_PARENT_BYTES = worker.MAX_PARENT_BYTES  # resident bytes of this process above which it does not fork
_FLOAT = TensorProto.FLOAT


class WeightScreen:
    """A forked worker's fp16 conversion of the main graph's fp32 raw-data initializers (and,
    first, the loader's encoding of the file: worker.py)."""

    def __init__(self, handle: worker.Worker):
        self._handle = handle
        self._path = handle.path
        self._seen = handle.seen  # the file as the worker found it: a file replaced since is not trusted
        self._buffer = handle.buffer  # let go of once the results are handed over
        self._encoding = handle.encoding  # let go of once the loader has its copy
        handle.buffer = handle.encoding = None  # held here only
        self._encoding_read = False
        self._done = False

    @classmethod
    def start(cls, path, min_bytes: int | None = None) -> WeightScreen | None:
        """The worker for the model file at `path`, forked now; None where it cannot or would
        not pay (see worker.py). Called before the model is loaded: the
        worker walks the file while this process waits for nothing it does not need, and the
        fork copies no model memory that this process would then pay to write to (every page a
        fork shares is copied on its first write). The file's size bounds the fp32 payloads, so
        the shared buffers are sized without reading the tensors."""
        handle = worker.fork(path, MIN_BYTES if min_bytes is None else min_bytes, MAX_PARENT_BYTES)
        if handle is None:
            log.debug("weight screen: no worker (see worker.py), screening in process")
            return None
        return cls(handle)

    def encoding(self) -> tuple[bytes, list, tuple] | None:
        """For the loader: the file's encoding with the main graph's large fp32 payloads left in
        the file, the (ordinal, offset, length, name) of each of those payloads, and the file's
        identity (device, inode, size, mtime) when the worker walked it; None when the
        worker's walk failed or left nothing in the file (the loader then walks or parses the
        file itself). Waits for the worker's walk. Read at most once, before results()."""
        if self._encoding_read or self._done:
            raise InternalCheckError("the worker's encoding was read twice or after its results")
        self._encoding_read = True
        shared, self._encoding = self._encoding, None
        head = _read_exact(self._handle.fd, worker.HEADER_BYTES)
        if len(head) < worker.HEADER_BYTES or shared is None:
            return None  # the worker died
        size, count = array("q", head)
        body = _read_exact(self._handle.fd, 8 * worker.ROW_ITEMS * max(count, 0))
        if size <= 0 or count <= 0 or len(body) != 8 * worker.ROW_ITEMS * count or size > len(shared):
            return None
        flat = array("q", body).tolist()
        names = _read_exact(self._handle.fd, sum(flat[3 :: worker.ROW_ITEMS]))
        rows, at = [], 0
        for k in range(0, len(flat), worker.ROW_ITEMS):
            ordinal, offset, length, name_length = flat[k : k + worker.ROW_ITEMS]
            rows.append((ordinal, offset, length, names[at : at + name_length]))
            at += name_length
        if at != len(names):
            return None
        return shared[:size], rows, self._seen

    def results(self, model, names: list[str] | None = None, left_in_file=None) -> dict | None:
        """name -> (fp16 bytes as a memoryview of the shared buffer, whether range was lost) for
        each screened initializer of the main graph of `model` (the file's model, as loaded and
        not edited since); None when the worker failed. `names` (the names of the main graph's
        initializers in order, as the index read them) spares reading them again; `left_in_file`
        (the loader's io.PayloadsInFile for `model`) spares checking again the payloads the
        loader left in the file, checked there against the parse. Read once: the views hold the
        shared buffer, which goes when the caller lets go of them."""
        if self._done:
            raise InternalCheckError("the weight screen's results were read twice")
        if not self._encoding_read:
            self.encoding()  # the loader's message comes first: passed over
        self._done = True
        chunks = []
        try:
            while True:
                part = os.read(self._handle.fd, 1 << 20)
                if not part:
                    break
                chunks.append(part)
        finally:
            os.close(self._handle.fd)
            _, status = os.waitpid(self._handle.pid, 0)
        buffer, self._buffer = self._buffer, None
        message = b"".join(chunks)
        if names is None:
            names = [t.name for t in model.graph.initializer]
        decoded = _decode(message, names, buffer) if status == 0 and buffer is not None else None
        if decoded is None or identity(self._path) != self._seen:
            log.debug("weight screen: the worker failed (status %d), screening in process", status)
            return None
        out, places = decoded
        checked = left_in_file.places(self._seen) if left_in_file is not None else set()
        if not _payloads_agree(model, places, self._path, self._seen, checked):
            log.debug("weight screen: the worker's walk disagrees with the loaded model, screening in process")
            return None
        return out

    def close(self) -> None:
        """Stop the worker if its results were never read (a failure before classification)."""
        if not self._done:
            self._done = True
            worker.stop(self._handle)
            self._buffer = self._encoding = None


def _read_exact(fd: int, n: int) -> bytes:
    """`n` bytes from the pipe `fd`, or fewer where it ends first."""
    parts, left = [], n
    while left > 0:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _decode(message: bytes, known: list[str], buffer: mmap.mmap) -> tuple[dict, list] | None:
    """The worker's message (rows of ordinal, elements, lost, name length, payload offset; then
    the names) as name -> (fp16 view, lost), with the (ordinal, offset, length) of each payload
    the worker converted; None when it does not fit the loaded model, whose initializers are
    named `known` in order."""
    if len(message) < 8:
        return None
    n = int.from_bytes(message[:8], "little")
    end = 8 + 8 * _ROW_ITEMS * n
    if len(message) < end:
        return None
    rows = np.frombuffer(message, dtype="<i8", count=_ROW_ITEMS * n, offset=8).reshape(n, _ROW_ITEMS).tolist()
    names = message[end:]
    if sum(r[3] for r in rows) != len(names) or 2 * sum(r[1] for r in rows) > len(buffer):
        return None
    view = memoryview(buffer)
    out = {}
    places = []
    offset = at = 0
    for ordinal, count, lost, length, start in rows:
        name = names[at : at + length].decode("utf-8", "replace")
        at += length
        if not 0 <= ordinal < len(known) or known[ordinal] != name or name in out:
            return None
        out[name] = (view[2 * offset : 2 * (offset + count)], bool(lost))
        places.append((ordinal, start, 4 * count))
        offset += count
    view.release()  # the slices keep their own exports of the buffer
    return out, places


def _payloads_agree(model, places: list, path, seen: tuple, checked: Collection = ()) -> bool:
    """Whether each payload the worker converted, (ordinal, offset, length) in the file at
    `path` (whose identity was `seen`), is the payload the loaded `model` holds for its
    initializer at that ordinal: an fp32 tensor left in the file at that very offset and length
    (io.load_model(leave_in_file=True)), or an fp32 raw_data of the same bytes as the file
    there. `checked` (io.PayloadsInFile.places) holds the (ordinal, offset, length) of the
    payloads still left in the file, each of them checked so against the parse by the loader."""
    inits = model.graph.initializer
    count = len(inits)
    location = os.path.basename(path)
    in_memory = []
    for place in places:
        if place in checked:
            continue
        ordinal, offset, length = place
        if not 0 <= ordinal < count:
            return False
        tensor = inits[ordinal]
        if tensor.data_type != _FLOAT:
            return False
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = tensor.external_data  # as the loader wrote them: location, offset, length
            if (
                len(entries) != 3
                or entries[1].value != str(offset)
                or entries[2].value != str(length)
                or entries[0].value != location
                or tensor.HasField("raw_data")
            ):
                return False
        else:
            in_memory.append((ordinal, offset, length))
    return not in_memory or _same_bytes(inits, in_memory, path, seen)


def _same_bytes(inits, places: list, path, seen: tuple) -> bool:
    """Whether each (ordinal, offset, length) of `places` names an initializer whose raw_data
    is the bytes at that offset of the file at `path`, still the file whose identity was `seen`.
    Read with pread, not mapped: the small tensors lie a page or more apart all over the file,
    and each page mapped and read would count as this process's memory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if stat_identity(os.fstat(fd)) != seen:
            return False
        for ordinal, offset, length in places:
            raw = inits[ordinal].raw_data
            if len(raw) != length or os.pread(fd, length, offset) != raw:
                return False
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
