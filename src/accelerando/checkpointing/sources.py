"""Each checkpoint file read once: the bytes whose checksum is verified are the bytes then deserialized.

Loading checks every file it reads against the manifest (size always, checksum by default) before
anything in it is used. :func:`read_once` opens each file once (a regular file, never through a
link), maps it privately (copy-on-write: nothing done to the tensors built on it reaches the file), or
reads it into memory where it cannot be mapped, compares its size with the manifest and hashes those
bytes, all pieces of all files in parallel. The loaders of
:mod:`~accelerando.checkpointing.files` then deserialize the same bytes (tensors of big files are
views of the mapping, copied by ``load_state_dict``), so no file is read twice and no file can change
between its check and its use.

Memory: a mapping holds the file's page-cache pages, not a copy of them; the only copies made are
those of files read in place of a mapping and of the small files ``torch.load`` copies out.
"""

from __future__ import annotations

import mmap
import os
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

__all__ = ["CheckedFiles", "read_file_once", "read_once", "start_reading"]


def read_file_once(path: str) -> memoryview:
    """The bytes of the regular file ``path`` (a link, FIFO or device is refused), read once.

    A private, copy-on-write memory map where the file system allows it (writable, so tensors may be
    views of it), else the bytes read into memory.

    Raises:
        CheckpointError: If ``path`` is a link or not a regular file, or cannot be read.
    """
    try:
        fd = open_regular_fd(path, follow=False)
    except OSError as err:  # a link, a special file, or gone since the folder was scanned
        raise CheckpointError(f"{path!r} cannot be read ({err}); the checkpoint is damaged.") from None
    try:
        size = os.fstat(fd).st_size
        if not size:
            return memoryview(b"")
        try:
            return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_COPY))
        except (OSError, ValueError):  # a file system that cannot map files: read it instead
            data = bytearray(size)
            done = 0
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as handle, memoryview(data) as view:
                while done < size and (count := handle.readinto(view[done:])):
                    done += count
            return memoryview(data)[:done]
    except OSError as err:
        raise CheckpointError(f"{path!r} cannot be read ({err}); the checkpoint is damaged.") from None
    finally:
        os.close(fd)


class CheckedFiles:
    """A checkpoint's files read once (:func:`start_reading`), their checksums being computed meanwhile.

    The bytes may be deserialized while they are hashed (deserializing never writes to them), but
    nothing in them may be applied to live objects before :meth:`verify` has returned.
    """

    def __init__(
        self,
        folder: str,
        files: dict[str, memoryview],
        expected: dict[str, FileEntry],
        pending: PendingBufferDigests | None,
    ) -> None:
        self.folder = folder
        self.files = files
        self._expected = expected
        self._pending = pending

    def verify(self) -> dict[str, memoryview]:
        """Wait for the checksums and compare them with the manifest; return the files by name.

        Raises:
            CheckpointError: Naming the first file, in reading order, whose checksum differs.
        """
        if self._pending is not None:
            pending, self._pending = self._pending, None
            for name, entry in zip(self._expected, pending.result(), strict=True):
                wanted = self._expected[name]
                if entry.checksum != wanted.checksum or entry.size != wanted.size:
                    raise checksum_mismatch(self.folder, name, wanted, entry)
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
        """Stop using the checksums (waits until no worker reads a file any more; idempotent)."""
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
    found = {name: read_file_once(os.path.join(folder, name)) for name in names}
    for name, data in found.items():
        check_size(folder, name, manifest.files[name], {name: len(data)})
    if not checksums:
        return CheckedFiles(folder, found, {}, None)
    expected = checkable_entries(folder, {name: manifest.files[name] for name in names}, stacklevel + 1)
    pending = PendingBufferDigests([(found[name], entry.algorithm) for name, entry in expected.items()])
    return CheckedFiles(folder, found, expected, pending)


def read_once(
    folder: str, manifest: Manifest | None, names: Iterable[str], checksums: bool
) -> dict[str, memoryview]:
    """Read each named file of ``folder`` once and check those bytes against ``manifest``.

    Args:
        folder: The checkpoint folder.
        manifest: Its manifest (None: a folder without one; the files are read unchecked).
        names: The files to read; with a manifest each must be listed in it.
        checksums: Also compare each file's checksum (its size is always compared).

    Returns:
        The bytes of each file by name, to deserialize (see :func:`read_file_once`).

    Raises:
        CheckpointError: Naming the first file that is unlisted, a link or not a regular file, of
            the wrong size, or fails its checksum (the same messages as
            :func:`~accelerando.checkpointing.manifest.verify_checkpoint`).
    """
    if manifest is None:
        return {name: read_file_once(os.path.join(folder, name)) for name in dict.fromkeys(names)}
    return start_reading(folder, manifest, names, checksums, stacklevel=3).verify()
