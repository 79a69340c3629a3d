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
import warnings
from collections.abc import Iterable

from accelerando.checkpointing.digest import available, digest_buffers
from accelerando.checkpointing.manifest import (
    CheckpointError,
    Manifest,
    check_size,
    checksum_mismatch,
    require_listed,
)
from accelerando.core.safe_files import open_regular_fd

__all__ = ["read_file_once", "read_once"]


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
    names = list(dict.fromkeys(names))
    if manifest is not None:
        require_listed(folder, manifest, names)
    found = {name: read_file_once(os.path.join(folder, name)) for name in names}
    if manifest is None:
        return found
    for name, data in found.items():
        check_size(folder, name, manifest.files[name], {name: len(data)})
    if not checksums:
        return found
    checkable = []
    for name in names:
        entry = manifest.files[name]
        if available(entry.algorithm):
            checkable.append(name)
        else:
            warnings.warn(
                f"Cannot verify {name!r} in {folder!r}: its {entry.algorithm} checksum needs a library this "
                "installation lacks (pip install xxhash); only its size was checked.",
                stacklevel=3,
            )
    actual = digest_buffers([(found[name], manifest.files[name].algorithm) for name in checkable])
    for name, entry in zip(checkable, actual, strict=True):
        expected = manifest.files[name]
        if entry.checksum != expected.checksum or entry.size != expected.size:
            raise checksum_mismatch(folder, name, expected, entry)
    return found
