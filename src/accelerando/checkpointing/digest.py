"""File checksums for checkpoint manifests, computed in parallel pieces.

Checking a checkpoint reads every byte once, and on a memory-bound machine that pass costs as much
as loading does. The pieced algorithms cut a file into ``PIECE_BYTES`` pieces that threads hash at
the same time (the hashers release the GIL), then hash the pieces' digests, so the check uses every
core. Algorithms:

- ``xxh3_64-p64m`` (default with ``xxhash`` installed): XXH3-64 of each 64 MiB piece, then XXH3-64
  of the pieces' 8-byte little-endian digests (an empty file: XXH3-64 of no bytes).
- ``crc32-p64m`` (default without ``xxhash``): the same with zlib's CRC-32 and 4-byte digests.
- ``xxh3_64``, ``crc32``: one digest of the whole file, hashed in order (manifests written by
  accelerando 0.1 use them; they are still verified).

Files are read through read-only memory maps (no copy through a read buffer), or with ``pread`` on file
systems that cannot map them.
"""

from __future__ import annotations

import functools
import mmap
import os
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from accelerando.checkpointing.workers import pool as worker_pool
from accelerando.common.imports import is_tqdm_available
from accelerando.common.progress import tqdm

if TYPE_CHECKING:
    from types import ModuleType

    # What is hashed: a file's bytes read with pread, or a slice of its memory map.
    _Data = bytes | memoryview
from accelerando.core.safe_files import open_regular_fd

__all__ = [
    "PIECE_BYTES",
    "FileEntry",
    "PendingBufferDigests",
    "PendingDigests",
    "available",
    "default_algorithm",
    "digest_buffers",
    "digest_files",
    "file_digest",
    "known",
]

PIECE_BYTES = 64 * 2**20
PROGRESS_MIN_BYTES = 2 * 2**30  # checks of less than this finish in about a second: no bar
_PIECED_SUFFIX = "-p64m"
_WHOLE_FILE_STEP = 1 << 30  # update() size for whole-file digests of mapped files


@dataclass(frozen=True)
class FileEntry:
    """What the manifest records about one file: its size and checksum (and the checksum's algorithm)."""

    size: int
    checksum: int
    algorithm: str = "crc32"


@functools.lru_cache(maxsize=1)
def _xxhash() -> ModuleType | None:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def _crc32_once(data: _Data) -> int:
    return zlib.crc32(data)


def _base(algorithm: str) -> str:
    return algorithm.removesuffix(_PIECED_SUFFIX)


def _one_shot(base: str) -> Callable[[_Data], int] | None:
    """The function hashing one buffer with ``base`` (None if this installation lacks it)."""
    if base == "crc32":
        return _crc32_once
    if base == "xxh3_64":
        module = _xxhash()
        return None if module is None else module.xxh3_64_intdigest
    return None


_BASES = ("crc32", "xxh3_64")


def known(algorithm: str) -> bool:
    """Whether ``algorithm`` names one of the checksums above (whether or not it can be computed here)."""
    return algorithm in _BASES or (algorithm.endswith(_PIECED_SUFFIX) and _base(algorithm) in _BASES)


def available(algorithm: str) -> bool:
    """Whether this installation can compute ``algorithm`` (``xxh3_64*`` needs ``xxhash``)."""
    return known(algorithm) and _one_shot(_base(algorithm)) is not None


def default_algorithm() -> str:
    """The checksum new manifests use: pieced XXH3-64 when ``xxhash`` is installed (about 4x faster than
    zlib's CRC-32 here, see benchmarks/bench_checkpoint.py), else pieced CRC-32.
    """
    return ("xxh3_64" if _xxhash() is not None else "crc32") + _PIECED_SUFFIX


def _combine(base: str, digests: list[int]) -> int:
    width = 8 if base == "xxh3_64" else 4
    joined = b"".join(d.to_bytes(width, "little") for d in digests)
    hash_once = _one_shot(base)
    assert hash_once is not None
    return hash_once(joined)


class _OpenFile:
    """One file being hashed: its descriptor, size and (when the file system allows) memory map."""

    def __init__(self, path: str) -> None:

        # Non-blocking open and fstat: a FIFO or a device in a checkpoint is refused, never read.
        self.fd = open_regular_fd(path)
        self.size = os.fstat(self.fd).st_size
        self.map: mmap.mmap | None = None
        if self.size:
            try:
                self.map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                self.map = None

    def hash_range(self, hash_once: Callable[[_Data], int], start: int, stop: int) -> int:
        if self.map is None:
            return hash_once(os.pread(self.fd, stop - start, start))
        return _hash_slice(hash_once, self.map, start, stop)

    def hash_whole(self, base: str) -> int:
        if self.map is not None:
            return _hash_whole_buffer(base, self.map)
        update, result = _whole_hasher(base)
        for start in range(0, self.size, _WHOLE_FILE_STEP):
            update(os.pread(self.fd, min(self.size, start + _WHOLE_FILE_STEP) - start, start))
        return result()

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        os.close(self.fd)


class _Buffer:
    """Bytes in memory, hashed as :class:`_OpenFile` hashes a file."""

    def __init__(self, data: _Data) -> None:
        self.data = data

    def hash_range(self, hash_once: Callable[[_Data], int], start: int, stop: int) -> int:
        return _hash_slice(hash_once, self.data, start, stop)

    def hash_whole(self, base: str) -> int:
        return _hash_whole_buffer(base, self.data)


def _usable(wanted: str | None) -> str:
    """``wanted`` (``None``: :func:`default_algorithm`), checked to be computable here.

    Raises:
        ValueError: If the algorithm is unknown or its library is not installed.
    """
    algorithm = wanted or default_algorithm()
    if not available(algorithm):
        raise ValueError(
            f"Checksum algorithm {algorithm!r} is not available; 'xxh3_64' and 'xxh3_64-p64m' need "
            "pip install xxhash."
        )
    return algorithm


def _submit(source: _OpenFile | _Buffer, size: int, algorithm: str) -> list[tuple[Future[int], int]]:
    """Start hashing ``size`` bytes of ``source`` on the pool: ``(future, bytes it hashes)`` per piece
    (one for the whole-file algorithms).
    """
    base = _base(algorithm)
    if not algorithm.endswith(_PIECED_SUFFIX):
        return [(worker_pool().submit(source.hash_whole, base), size)]
    hash_once = _one_shot(base)
    assert hash_once is not None  # _usable() checked it
    futures = []
    for start in range(0, size, PIECE_BYTES):
        stop = min(size, start + PIECE_BYTES)
        futures.append((worker_pool().submit(source.hash_range, hash_once, start, stop), stop - start))
    return futures


def _checksum(algorithm: str, digests: list[int]) -> int:
    """The checksum of a file from the digests of its pieces (or its one whole-file digest)."""
    return _combine(_base(algorithm), digests) if algorithm.endswith(_PIECED_SUFFIX) else digests[0]


class _Bar(Protocol):
    """The part of a ``tqdm`` bar the digests use."""

    def update(self, n: int, /) -> object: ...

    def close(self) -> object: ...


class PendingDigests:
    """Checksums being computed by the thread pool; :meth:`result` waits for them.

    Files stay open (and mapped) until :meth:`result` or :meth:`close` has run.
    """

    def __init__(self) -> None:
        self._opened: list[_OpenFile] = []
        self._jobs: list[tuple[str, list[tuple[Future[int], int]]]] = []  # (future, bytes it hashes)

    def add(self, path: str, algorithm: str | None = None) -> None:
        """Start hashing ``path`` (``None``: :func:`default_algorithm`).

        Raises:
            ValueError: If the algorithm is unknown or its library is not installed.
            OSError: If the file cannot be opened.
        """
        algorithm = _usable(algorithm)
        handle = _OpenFile(path)
        self._opened.append(handle)
        futures = _submit(handle, handle.size, algorithm)
        self._jobs.append((algorithm, futures))

    def result(self, desc: str | None = None) -> list[FileEntry]:
        """The entries of every added file, in the order added (raises the first hashing error).

        Args:
            desc: Show a progress bar in bytes with this label (main process only) when the files
                add up to at least ``PROGRESS_MIN_BYTES``.
        """
        bar = self._progress_bar(desc)
        try:
            entries = []
            for handle, (algorithm, futures) in zip(self._opened, self._jobs, strict=True):
                digests = []
                for future, nbytes in futures:
                    digests.append(future.result())
                    if bar is not None:
                        bar.update(nbytes)
                entries.append(FileEntry(handle.size, _checksum(algorithm, digests), algorithm))
            return entries
        finally:
            if bar is not None:
                bar.close()
            self.close()

    def _progress_bar(self, desc: str | None) -> _Bar | None:
        total = sum(handle.size for handle in self._opened)
        if desc is None or total < PROGRESS_MIN_BYTES:
            return None

        if not is_tqdm_available():
            return None

        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)

    def close(self) -> None:
        """Wait for the workers, then close every file (idempotent)."""
        wait([future for _, futures in self._jobs for future, _ in futures])  # no worker may still read a map
        for handle in self._opened:
            handle.close()
        self._opened, self._jobs = [], []


def digest_files(items: Sequence[tuple[str, str | None]], desc: str | None = None) -> list[FileEntry]:
    """Size and checksum of each ``(path, algorithm)`` (``None``: :func:`default_algorithm`), in order.

    All pieces of all files are hashed by one thread pool, so a folder of files uses every core.
    With ``desc``, big checks show a progress bar (see :meth:`PendingDigests.result`).

    Raises:
        ValueError: If an algorithm is unknown or its library is not installed.
        OSError: If a file cannot be read (``FileNotFoundError`` when it is missing).
    """
    pending = PendingDigests()
    try:
        for path, algorithm in items:
            pending.add(path, algorithm)
        return pending.result(desc)
    finally:
        pending.close()


class PendingBufferDigests:
    """Checksums of buffers in memory being computed by the thread pool; :meth:`result` waits for them.

    The buffers must stay alive and unchanged until :meth:`result` or :meth:`close` has run (the
    workers read them); the caller may use them meanwhile in any way that does not write to them.
    """

    def __init__(self, items: Sequence[tuple[_Data, str | None]]) -> None:
        """Start hashing each ``(bytes in memory, algorithm)`` (``None``: :func:`default_algorithm`).

        Raises:
            ValueError: If an algorithm is unknown or its library is not installed (nothing is left
                running).
        """
        self._jobs: list[tuple[str, int, list[tuple[Future[int], int]]]] = []
        try:
            for data, wanted in items:
                algorithm = _usable(wanted)
                self._jobs.append((algorithm, len(data), _submit(_Buffer(data), len(data), algorithm)))
        except BaseException:
            self.close()
            raise

    def result(self) -> list[FileEntry]:
        """Size and checksum of each buffer, in the order given (raises the first hashing error)."""
        try:
            entries = []
            for algorithm, size, futures in self._jobs:
                digests = [future.result() for future, _ in futures]
                entries.append(FileEntry(size, _checksum(algorithm, digests), algorithm))
            return entries
        finally:
            self.close()

    def close(self) -> None:
        """Wait until no worker reads a buffer any more (idempotent); results are then discarded."""
        wait([future for _, _, futures in self._jobs for future, _ in futures])
        self._jobs = []


def digest_buffers(items: Sequence[tuple[_Data, str | None]]) -> list[FileEntry]:
    """Size and checksum of each ``(bytes in memory, algorithm)``, in order: what :func:`digest_files`
    gives for a file holding those bytes.

    For checking bytes already read (or mapped) once, so that what is hashed is what is then
    deserialized. All pieces of all buffers are hashed by one thread pool.

    Raises:
        ValueError: If an algorithm is unknown or its library is not installed.
    """
    return PendingBufferDigests(items).result()


def _hash_slice(hash_once: Callable[[_Data], int], data: _Data | mmap.mmap, start: int, stop: int) -> int:
    with memoryview(data) as view, view[start:stop] as piece:
        return hash_once(piece)


def _whole_hasher(base: str) -> tuple[Callable[[_Data], None], Callable[[], int]]:
    """``(update, result)`` of one in-order digest of ``base`` (crc32 or xxh3_64)."""
    if base == "crc32":
        crc = [0]

        def crc_update(data: _Data) -> None:
            crc[0] = zlib.crc32(data, crc[0])

        return crc_update, lambda: crc[0]
    module = _xxhash()
    assert module is not None
    hasher = module.xxh3_64()
    return hasher.update, hasher.intdigest


def _hash_whole_buffer(base: str, data: _Data | mmap.mmap) -> int:
    update, result = _whole_hasher(base)
    with memoryview(data) as view:
        for start in range(0, len(view), _WHOLE_FILE_STEP):
            with view[start : start + _WHOLE_FILE_STEP] as piece:
                update(piece)
    return result()


def file_digest(path: str, algorithm: str | None = None) -> FileEntry:
    """Return the size and checksum of one file (see :func:`digest_files`).

    Raises:
        ValueError: If ``algorithm`` is unknown or its library is not installed.
    """
    return digest_files([(path, algorithm)])[0]
