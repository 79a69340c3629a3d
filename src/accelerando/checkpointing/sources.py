"""Each checkpoint file read once: the bytes whose checksum is verified are the bytes then applied.

Loading checks every file it reads against the manifest (size always, checksum by default) before
anything in it is used. :func:`read_once` opens each file once (a regular file, never through a
link), compares its size with the manifest and hashes its bytes, all pieces of all files in
parallel; the loaders of :mod:`~accelerando.checkpointing.files` then deserialize the same bytes, so
no file is read twice.

Files up to ``PRIVATE_READ_MAX_BYTES`` are read into private memory: what is hashed is a copy no
other process can change. Bigger files are mapped privately (copy-on-write: nothing done to the
tensors built on them reaches the file, and no copy is made until ``load_state_dict`` copies them),
but a private mapping still shows what another process writes to a page this one has not written:
their descriptors stay open in a :class:`FileGuard`, which compares each file's ``fstat`` (size,
modification and change times, inode) with what it was when opened, before the checksum was
computed: after the checksums, before anything is applied and after the apply
(:func:`~accelerando.checkpointing.state_io.apply_state`). A file changed or truncated in between is
refused with one line naming it, before a page past its new end is touched (which would end the
process with ``SIGBUS``).

Limits (docs/concepts/security.md): a truncation racing with the checksum pass or with the copy into
the model itself still ends the process with ``SIGBUS`` (a fault inside a copy cannot be caught in
Python); a rewrite racing with that copy is reported after it, when the objects may already hold the
new bytes; and a rewrite within one tick of the file system's clock after the file was opened can
leave both times unchanged.

Memory: a mapping holds the file's page-cache pages, not a copy of them; the only copies made are
those of the files read into memory and of the small files ``torch.load`` copies out.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Iterable

from accelerando.checkpointing.digest import FileEntry, PendingBufferDigests
from accelerando.checkpointing.manifest import (
    CheckpointError,
    Manifest,
    check_size,
    checkable_entries,
    checksum_mismatch,
    require_listed,
)
from accelerando.core.safe_files import open_regular_fd

__all__ = [
    "PRIVATE_READ_MAX_BYTES",
    "CheckedFiles",
    "FileGuard",
    "read_file_once",
    "read_once",
    "start_reading",
]

# Files up to this size are read into private memory instead of being mapped (no later write can
# reach them). The same bound as files.MAPPED_LOAD_MIN_BYTES: smaller files are copied out by
# torch.load anyway, so reading them costs no extra copy.
PRIVATE_READ_MAX_BYTES = 16 * 2**20

# What identifies a file's content without reading it: (size, mtime_ns, ctime_ns, inode, device).
_Signature = tuple[int, int, int, int, int]
_FIELDS = ("size", "modification time", "change time", "inode", "device")


def _signature(info: os.stat_result) -> _Signature:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def _close_all(opened: dict[str, tuple[int, _Signature]]) -> None:
    for fd, _ in opened.values():
        try:
            os.close(fd)
        except OSError:  # pragma: no cover - already closed
            pass
    opened.clear()


class FileGuard:
    """The memory-mapped files of one load, held open so that a change to any of them is seen.

    A private mapping shows what another process writes to the file in every page this process has
    not written, and a page past a truncated end raises ``SIGBUS`` when touched: :meth:`check`
    compares each file's ``fstat`` on the descriptor opened for the mapping (size, modification and
    change times, inode, device) with what it was when the file was opened, before its checksum was
    computed. Closed by :meth:`close` (or when garbage collected).
    """

    def __init__(self) -> None:
        self._opened: dict[str, tuple[int, _Signature]] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._opened)

    def add(self, path: str, fd: int, info: os.stat_result) -> None:
        """Keep ``fd`` (the open descriptor of the file ``path``, as ``info`` describes it when opened)."""
        self._opened[path] = (fd, _signature(info))

    def check(self, applied: bool = False) -> None:
        """Refuse if any kept file changed since it was opened.

        Args:
            applied: The check runs after the file's contents were applied (the message then says the
                objects may hold unverified bytes).

        Raises:
            CheckpointError: Naming the first changed file and what changed.
        """
        for path, (fd, before) in self._opened.items():
            try:
                now: _Signature | None = _signature(os.fstat(fd))
            except OSError:  # pragma: no cover - the descriptor is ours until close()
                now = None
            if now != before:
                raise _changed(path, before, now, applied)

    def close(self) -> None:
        """Close the kept descriptors (idempotent; the mappings stay valid)."""
        self._finalizer()


def _changed(path: str, before: _Signature, now: _Signature | None, applied: bool) -> CheckpointError:
    if now is None:
        what = "it can no longer be examined"
    else:
        differ = [(field, a, b) for field, a, b in zip(_FIELDS, before, now, strict=True) if a != b]
        what = ", ".join(f"{field} {a} -> {b}" if field == "size" else field for field, a, b in differ)
    if applied:
        return CheckpointError(
            f"The checkpoint changed on disk while it was being loaded: {path!r} changed on disk while it "
            f"was being applied ({what}), so the objects loaded from it may hold bytes that were never "
            "verified. Load the checkpoint again once no other process writes to it."
        )
    return CheckpointError(
        f"The checkpoint changed on disk while it was being loaded, so nothing was applied: {path!r} "
        f"changed on disk after it was opened for loading ({what}). Another process wrote to the "
        "checkpoint: load it again once it is complete."
    )


def _read_into_memory(fd: int, size: int) -> memoryview:
    data = bytearray(size)
    done = 0
    with os.fdopen(fd, "rb", buffering=0, closefd=False) as handle, memoryview(data) as view:
        while done < size and (count := handle.readinto(view[done:])):
            done += count
    return memoryview(data)[:done]


def read_file_once(path: str, guard: FileGuard | None = None) -> memoryview:
    """The bytes of the regular file ``path`` (a link, FIFO or device is refused), read once.

    A file of at most ``PRIVATE_READ_MAX_BYTES`` is read into private memory. A bigger one is mapped
    privately (copy-on-write, writable, so tensors may be views of it) where the file system allows
    it, else read into memory; its descriptor is kept in ``guard`` (closed when no guard is given),
    which checks it for later changes.

    Raises:
        CheckpointError: If ``path`` is a link or not a regular file, or cannot be read.
    """
    try:
        fd = open_regular_fd(path, follow=False)
    except OSError as err:  # a link, a special file, or gone since the folder was scanned
        raise CheckpointError(
            f"The checkpoint is damaged: {path!r} cannot be read ({err}). Load another checkpoint "
            "(load_state() without a folder picks the newest complete one) or save a new one."
        ) from None
    kept = False
    try:
        info = os.fstat(fd)
        if info.st_size <= PRIVATE_READ_MAX_BYTES:
            return _read_into_memory(fd, info.st_size)
        try:
            mapped = memoryview(mmap.mmap(fd, info.st_size, access=mmap.ACCESS_COPY))
        except (OSError, ValueError):  # a file system that cannot map files: read it instead
            return _read_into_memory(fd, info.st_size)
        if guard is not None:
            guard.add(path, fd, info)
            kept = True
        return mapped
    except OSError as err:
        raise CheckpointError(
            f"The checkpoint is damaged: {path!r} cannot be read ({err}). Load another checkpoint "
            "(load_state() without a folder picks the newest complete one) or save a new one."
        ) from None
    finally:
        if not kept:
            os.close(fd)


class CheckedFiles:
    """A checkpoint's files read once (:func:`start_reading`), their checksums being computed meanwhile.

    The bytes may be deserialized while they are hashed (deserializing never writes to them), but
    nothing in them may be applied to live objects before :meth:`verify` has returned. ``guard``
    holds the mapped files open: check it again after deserializing and around the apply
    (:class:`FileGuard`), and close it after the apply.
    """

    def __init__(
        self,
        folder: str,
        files: dict[str, memoryview],
        expected: dict[str, FileEntry],
        pending: PendingBufferDigests | None,
        guard: FileGuard | None = None,
    ) -> None:
        self.folder = folder
        self.files = files
        self.guard = guard if guard is not None else FileGuard()
        self._expected = expected
        self._pending = pending

    def verify(self) -> dict[str, memoryview]:
        """Wait for the checksums and compare them with the manifest; return the files by name.

        Raises:
            CheckpointError: Naming the first file, in reading order, whose checksum differs, or a
                mapped file that changed on disk since it was opened.
        """
        if self._pending is not None:
            pending, self._pending = self._pending, None
            for name, entry in zip(self._expected, pending.result(), strict=True):
                wanted = self._expected[name]
                if entry.checksum != wanted.checksum or entry.size != wanted.size:
                    raise checksum_mismatch(self.folder, name, wanted, entry)
        self.guard.check()  # the bytes hashed were the file's from start to end of the hashing
        return self.files

    def raise_damage(self) -> None:
        """For an error raised while deserializing unverified bytes: wait for the checksums and raise
        the first mismatch in place of that error (a damaged file is named by its checksum, not by
        whatever parse error it caused); return when every file is as saved.

        Raises:
            CheckpointError: If a file's checksum differs (its context, the parse error, suppressed).
        """
        try:
            self.verify()
        except CheckpointError as damage:
            raise damage from None

    def close(self) -> None:
        """Stop using the checksums (waits until no worker reads a file any more; idempotent).

        The guard stays open: it is closed by whoever applies the files (or when collected).
        """
        if self._pending is not None:
            self._pending.close()
            self._pending = None


def start_reading(
    folder: str, manifest: Manifest, names: Iterable[str], checksums: bool, stacklevel: int = 2
) -> CheckedFiles:
    """Read each named file of ``folder`` once, compare its size with ``manifest`` and start hashing it.

    Args:
        folder: The checkpoint folder.
        manifest: Its manifest.
        names: The files to read; each must be listed in the manifest.
        checksums: Also compare each file's checksum (by :meth:`CheckedFiles.verify`).
        stacklevel: Of the warning about a checksum this installation cannot compute, as seen from
            the caller.

    Raises:
        CheckpointError: Naming the first file that is unlisted, a link or not a regular file, or of
            the wrong size.
    """
    names = list(dict.fromkeys(names))
    require_listed(folder, manifest, names)
    guard = FileGuard()
    try:
        found = {name: read_file_once(os.path.join(folder, name), guard) for name in names}
        for name, data in found.items():
            check_size(folder, name, manifest.files[name], {name: len(data)})
        if not checksums:
            return CheckedFiles(folder, found, {}, None, guard)
        expected = checkable_entries(folder, {name: manifest.files[name] for name in names}, stacklevel + 1)
        pending = PendingBufferDigests([(found[name], entry.algorithm) for name, entry in expected.items()])
    except BaseException:
        guard.close()
        raise
    return CheckedFiles(folder, found, expected, pending, guard)


def read_once(
    folder: str, manifest: Manifest | None, names: Iterable[str], checksums: bool
) -> tuple[dict[str, memoryview], FileGuard]:
    """Read each named file of ``folder`` once and check those bytes against ``manifest``.

    Args:
        folder: The checkpoint folder.
        manifest: Its manifest (None: a folder without one; the files are read unchecked).
        names: The files to read; with a manifest each must be listed in it.
        checksums: Also compare each file's checksum (its size is always compared).

    Returns:
        The bytes of each file by name, to deserialize (see :func:`read_file_once`), and the guard
        of the mapped ones: check it before and after applying them, then close it.

    Raises:
        CheckpointError: Naming the first file that is unlisted, a link or not a regular file, of
            the wrong size, or fails its checksum (the same messages as
            :func:`~accelerando.checkpointing.manifest.verify_checkpoint`).
    """
    if manifest is None:
        guard = FileGuard()
        return {
            name: read_file_once(os.path.join(folder, name), guard) for name in dict.fromkeys(names)
        }, guard
    reading = start_reading(folder, manifest, names, checksums, stacklevel=3)
    try:
        return reading.verify(), reading.guard
    except BaseException:
        reading.guard.close()
        raise
    finally:
        reading.close()
