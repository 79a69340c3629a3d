"""Checksums computed while a checkpoint file is written, so that the save never reads it back.

A durable save describes every file in the manifest (size and checksum, see
:mod:`accelerando.checkpointing.digest`). Hashing a file after writing it reads every byte again;
the writers of :mod:`accelerando.checkpointing.files` instead hash the bytes they hand to the kernel
(``torch.save`` files) or the tensors' memory that ``safetensors`` copied into the file, with the
same pieced algorithm, and leave the result here. :class:`~accelerando.checkpointing.atomic.FileDescriber`
takes it when the file is handed over, after checking that the file is still the one written (same
inode, size and modification time); any other file is hashed by reading it, as before.

Only files written into a folder a describer is collecting in this thread (:func:`collecting`) are
hashed this way, so writes outside a save cost nothing extra.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Protocol

import torch

from accelerando.checkpointing.digest import PIECE_BYTES, FileEntry, default_algorithm
from accelerando.checkpointing.workers import pool as worker_pool

__all__ = [
    "HashingFile",
    "StreamDigest",
    "collecting",
    "digest_segments",
    "is_collected",
    "record",
    "record_safetensors",
    "take",
    "write_bytes",
]

_PIECED_SUFFIX = "-p64m"
# Chunks at least this big are hashed on a helper thread while this thread writes them (both release
# the GIL), so hashing adds no time to a write of tensor data.
_OVERLAP_MIN_BYTES = 1 << 20
_MAX_RECORDS = 256


class _Hasher(Protocol):
    def update(self, data: memoryview) -> None: ...

    def intdigest(self) -> int: ...


class _Crc32:
    """zlib's CRC-32 with the update/intdigest interface of ``xxhash.xxh3_64``."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: memoryview) -> None:
        self._value = zlib.crc32(data, self._value)

    def intdigest(self) -> int:
        return self._value


def _new_hasher(base: str) -> _Hasher:
    if base == "crc32":
        return _Crc32()
    import xxhash

    hasher: _Hasher = xxhash.xxh3_64()
    return hasher


class StreamDigest:
    """The manifest checksum of a byte stream fed in order: equal to hashing the finished file.

    Only the pieced algorithms (``*-p64m``) are supported: a digest per ``PIECE_BYTES`` piece, then the
    digest of the pieces' little-endian digests (see :mod:`accelerando.checkpointing.digest`).

    Raises:
        ValueError: If ``algorithm`` is not a pieced algorithm.
    """

    def __init__(self, algorithm: str | None = None) -> None:
        self.algorithm = algorithm or default_algorithm()
        if not self.algorithm.endswith(_PIECED_SUFFIX):
            raise ValueError(f"StreamDigest computes pieced checksums only, not {self.algorithm!r}")
        self._base = self.algorithm.removesuffix(_PIECED_SUFFIX)
        self._piece = _new_hasher(self._base)
        self._filled = 0
        self._digests: list[int] = []
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        """Feed the next bytes of the stream."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        self.size += len(view)
        while len(view):
            take = min(len(view), PIECE_BYTES - self._filled)
            self._piece.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == PIECE_BYTES:
                self._digests.append(self._piece.intdigest())
                self._piece, self._filled = _new_hasher(self._base), 0

    def entry(self) -> FileEntry:
        """The manifest entry of the bytes fed so far."""
        digests = [*self._digests, self._piece.intdigest()] if self._filled else list(self._digests)
        return _combined(self.algorithm, digests, self.size)


def _combined(algorithm: str, digests: list[int], size: int) -> FileEntry:
    """The entry of ``size`` bytes whose pieces have ``digests``: the digest of their digests."""
    base = algorithm.removesuffix(_PIECED_SUFFIX)
    width = 8 if base == "xxh3_64" else 4
    combined = _new_hasher(base)
    combined.update(memoryview(b"".join(d.to_bytes(width, "little") for d in digests)))
    return FileEntry(size, combined.intdigest(), algorithm)


_helper: ThreadPoolExecutor | None = None
_helper_pid = 0


def _overlap_pool() -> ThreadPoolExecutor:
    global _helper, _helper_pid
    if _helper is None or _helper_pid != os.getpid():  # a forked child has the object, not the thread
        _helper, _helper_pid = ThreadPoolExecutor(1, thread_name_prefix="accelerando-hash"), os.getpid()
    return _helper


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (looping over short writes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class HashingFile:
    """A write-only file object for ``torch.save`` that hashes what it writes (see :class:`StreamDigest`).

    Small writes (the archive's headers, the pickle, small tensors) are gathered in memory and written
    and hashed together, up to ``_OVERLAP_MIN_BYTES`` at a time: a small file is one ``write`` and one
    hash. Large chunks are hashed on a helper thread while this thread writes them to the descriptor.
    Call :meth:`flush` when ``torch.save`` is done (it writes what is still gathered).
    """

    def __init__(self, fd: int, algorithm: str | None = None) -> None:
        self.fd = fd
        self.digest = StreamDigest(algorithm)
        self._gathered: list[bytes] = []
        self._gathered_bytes = 0

    def write(self, data: bytes | memoryview) -> int:
        """Write (or gather) every byte of ``data`` and hash it; returns its length."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        if len(view) < _OVERLAP_MIN_BYTES:
            self._gathered.append(bytes(view))  # a copy: the caller's buffer is not ours to keep
            self._gathered_bytes += len(view)
            if self._gathered_bytes >= _OVERLAP_MIN_BYTES:
                self.flush()
            return len(view)
        self.flush()
        hashing = _overlap_pool().submit(self.digest.update, view)
        try:
            _write_all(self.fd, view)
        finally:
            hashing.result()
        return len(view)

    def flush(self) -> None:
        """Write and hash what is gathered (``torch.save`` calls it when it is done)."""
        if not self._gathered:
            return
        data = self._gathered[0] if len(self._gathered) == 1 else b"".join(self._gathered)
        self._gathered, self._gathered_bytes = [], 0
        self.digest.update(data)
        _write_all(self.fd, data)


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` as the new file ``path`` in one ``write``, recording its checksum (computed from
    ``data``, never read back) when ``path`` lies in a folder this thread is collecting.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        _write_all(fd, data)
        if is_collected(path):
            digest = StreamDigest()
            digest.update(data)
            record(path, digest.entry(), os.fstat(fd))
    finally:
        os.close(fd)


# Folders a describer collects files of, per thread; and the checksums computed while writing.
_local = threading.local()
_records: OrderedDict[str, tuple[tuple[int, int, int, int], FileEntry]] = OrderedDict()
_records_lock = threading.Lock()


@contextmanager
def collecting(folder: str) -> Iterator[None]:
    """Within the block, files written into ``folder`` (by this thread) are hashed while written."""
    folders: list[str] = getattr(_local, "folders", [])
    _local.folders = folders
    folders.append(os.path.abspath(folder))
    try:
        yield
    finally:
        if os.path.abspath(folder) in folders:
            folders.remove(os.path.abspath(folder))


def is_collected(path: str) -> bool:
    """Whether ``path`` lies in a folder this thread is collecting (see :func:`collecting`)."""
    folders: list[str] = getattr(_local, "folders", [])
    if not folders:
        return False
    path = os.path.abspath(path)
    return any(path.startswith(folder + os.sep) for folder in folders)


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def record(path: str, entry: FileEntry, info: os.stat_result) -> None:
    """Leave the checksum of the file just written at ``path`` (``info``: its stat right after writing)."""
    with _records_lock:
        _records[os.path.abspath(path)] = (_identity(info), entry)
        while len(_records) > _MAX_RECORDS:  # entries nobody took (a failed save): forget the oldest
            _records.popitem(last=False)


def take(path: str) -> FileEntry | None:
    """The checksum recorded for ``path`` if it is still the regular file written then, else None."""
    with _records_lock:
        found = _records.pop(os.path.abspath(path), None)
    if found is None:
        return None
    identity, entry = found
    try:
        info = os.lstat(path)
    except OSError:
        return None
    same = stat.S_ISREG(info.st_mode) and _identity(info) == identity and entry.size == identity[2]
    return entry if same else None


def _tensor_bytes(tensor: torch.Tensor) -> memoryview | None:
    """The bytes safetensors writes for ``tensor`` (its memory), or None when they are not that."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.is_quantized:
        return None
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    # NumPy's stub declares no __buffer__ before Python 3.12; an ndarray does export its buffer.
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")  # pyright: ignore[reportArgumentType]


def record_safetensors(path: str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Record the checksum of a safetensors file just written from ``tensors``, hashing their memory.

    Reads only the file's header (its layout). Nothing is recorded, and the describer reads the file
    instead, when a tensor's bytes are not its memory (not on the CPU, not contiguous, a big-endian
    machine) or the header does not describe exactly these tensors end to end.
    """
    if sys.byteorder != "little":
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:  # exactly the header's bytes (a buffered read would read a page of tensor data too)
            info = os.fstat(fd)
            (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            header_bytes = os.pread(fd, length, 8) if length <= info.st_size - 8 else b""
        finally:
            os.close(fd)
        header = json.loads(header_bytes)
    except (OSError, ValueError, struct.error):
        return
    layout = sorted(
        (tuple(value["data_offsets"]), name) for name, value in header.items() if name != "__metadata__"
    )
    segments = [memoryview(struct.pack("<Q", length)), memoryview(header_bytes)]
    position = 0
    for (start, stop), name in layout:
        data = _tensor_bytes(tensors[name]) if name in tensors else None
        if data is None or start != position or stop - start != len(data):
            return
        segments.append(data)
        position = stop
    if len(layout) != len(tensors) or 8 + length + position != info.st_size:
        return
    record(path, digest_segments(segments), info)


def digest_segments(segments: Sequence[memoryview], algorithm: str | None = None) -> FileEntry:
    """The manifest entry of the bytes of ``segments`` one after the other (what :class:`StreamDigest`
    gives for them), without joining them: the ``PIECE_BYTES`` pieces are hashed at the same time on
    the checkpoint worker pool.
    """
    digest = StreamDigest(algorithm)
    pieces: list[list[memoryview]] = [[]]
    filled = 0
    for segment in segments:
        view = segment.cast("B") if segment.format != "B" or segment.ndim != 1 else segment
        while len(view):
            take = min(len(view), PIECE_BYTES - filled)
            pieces[-1].append(view[:take])
            filled += take
            view = view[take:]
            if filled == PIECE_BYTES:
                pieces.append([])
                filled = 0
    if len(pieces) <= 2:  # at most one whole piece: hashed here, in order
        for part in (part for piece in pieces for part in piece):
            digest.update(part)
        return digest.entry()
    futures = [worker_pool().submit(_hash_parts, digest.algorithm, piece) for piece in pieces if piece]
    digests = [future.result() for future in futures]
    return _combined(digest.algorithm, digests, sum(len(s) for s in segments))


def _hash_parts(algorithm: str, parts: list[memoryview]) -> int:
    """One piece's digest, fed the piece's parts in order."""
    hasher = _new_hasher(algorithm.removesuffix(_PIECED_SUFFIX))
    for part in parts:
        hasher.update(part)
    return hasher.intdigest()
