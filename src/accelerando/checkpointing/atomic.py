"""Crash-safe checkpoint folders: stage, make durable, describe in a manifest, rename into place.

The manifest itself and verification against it live in :mod:`accelerando.checkpointing.manifest`
(re-exported here).

Invariant: a folder that carries a manifest under its final name is complete. Every file is written
into a hidden sibling (``.<name>.partial``), flushed to disk, described in the manifest (size and
checksum of every file), and only then is the folder renamed to its final name, which is atomic on
POSIX file systems. Deletions (rotation, overwrite) first rename the doomed folder to a hidden trash
name, so a crash never leaves a half-deleted folder that looks like a checkpoint.

Contract for callers (``accelerando.checkpointing.state_io``, ``save`` and ``load``):
1. ``prepare_staging(final_dir)`` on the committing process, then a barrier;
2. every process writes its files into the staging folder and calls ``describe_files`` on them;
3. the committing process calls ``commit(staging, final_dir, manifest)`` after a barrier.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import re
import shutil
import threading
import uuid
from collections.abc import Iterable

from accelerando.checkpointing.digest import FileEntry, PendingDigests, default_algorithm, file_digest
from accelerando.checkpointing.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    Manifest,
    read_manifest,
    verify_checkpoint,
    verify_checksums,
)

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "FileDescriber",
    "FileEntry",
    "Manifest",
    "commit",
    "default_algorithm",
    "describe_files",
    "discard",
    "file_digest",
    "fsync_dir",
    "fsync_file",
    "list_checkpoints",
    "prepare_staging",
    "read_manifest",
    "remove_stale",
    "rotate",
    "staging_path",
    "verify_checkpoint",
    "verify_checksums",
]

_PARTIAL_SUFFIX = ".partial"
_TRASH_MARK = ".trash-"
_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")


def fsync_file(path: str) -> None:
    """Flush a file's data and metadata to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Flush a folder's entries (new, renamed or removed names) to stable storage."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # some platforms (Windows) cannot open folders; renames are durable there anyway
        return
    try:
        os.fsync(fd)
    except OSError as err:  # some file systems refuse fsync on folders
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


class FileDescriber:
    """Make files durable and describe them for the manifest, each as soon as it is written.

    ``add(name)`` hands over a finished file: a flusher thread ``fsync``s it and the digest pool hashes it
    (reading back the bytes that reached the file) while the caller writes the next one, so disk
    writeback and checksums overlap serialisation. ``finish()`` waits and returns the entries;
    ``close()`` (idempotent) releases everything after a failure.
    """

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._names: list[str] = []
        self._digests = PendingDigests()
        self._paths: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._errors: list[BaseException] = []
        self._flusher: threading.Thread | None = None

    def add(self, name: str) -> None:
        """Start flushing and hashing ``name`` (relative to the folder); raises if it cannot be opened."""
        path = os.path.join(self._folder, name)
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="accelerando-fsync", daemon=True)
            self._flusher.start()
        self._paths.put(path)
        self._names.append(name)
        self._digests.add(path)

    def _flush_loop(self) -> None:
        while (path := self._paths.get()) is not None:
            if self._errors:
                continue
            try:
                fsync_file(path)
            except BaseException as err:  # noqa: BLE001 - re-raised by finish() in the caller's thread
                self._errors.append(err)

    def _stop_flusher(self) -> None:
        if self._flusher is not None:
            self._paths.put(None)
            self._flusher.join()
            self._flusher = None

    def finish(self) -> dict[str, FileEntry]:
        """Wait until every added file is on disk and hashed; return ``{name: entry}``.

        Raises:
            OSError: If a flush or a read failed.
        """
        try:
            entries = self._digests.result()
        finally:
            self._stop_flusher()
        if self._errors:
            raise self._errors[0]
        return dict(zip(self._names, entries, strict=True))

    def close(self) -> None:
        """Stop the flusher and the hashing of a describer that will not finish (after a failure)."""
        self._stop_flusher()
        self._digests.close()


def describe_files(folder: str, names: Iterable[str]) -> dict[str, FileEntry]:
    """Make the named files (relative to ``folder``) durable and return their manifest entries.

    Raises:
        OSError: If a file is missing or cannot be flushed or read.
    """
    describer = FileDescriber(folder)
    try:
        for name in names:
            describer.add(name)
        return describer.finish()
    finally:
        describer.close()


def staging_path(final_dir: str) -> str:
    """The hidden sibling folder a checkpoint is written into before it becomes visible."""
    final_dir = os.path.abspath(final_dir)
    parent, name = os.path.split(final_dir)
    return os.path.join(parent, f".{name}{_PARTIAL_SUFFIX}")


def discard(path: str) -> None:
    """Delete a folder crash-safely: rename it to a hidden trash name first, then remove it."""
    if not os.path.lexists(path):
        return
    parent, name = os.path.split(os.path.abspath(path))
    trash = os.path.join(parent, f".{name.lstrip('.')}{_TRASH_MARK}{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    fsync_dir(parent)
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale(parent: str, name_prefix: str = "checkpoint_") -> None:
    """Remove staging and trash folders left in ``parent`` by an interrupted save or rotation.

    Only hidden folders made by this module for targets whose name starts with ``name_prefix`` are
    touched, so other hidden files in a user's folder are left alone.
    """
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        if not name.startswith("." + name_prefix):
            continue
        if name.endswith(_PARTIAL_SUFFIX) or _TRASH_MARK in name:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def prepare_staging(final_dir: str) -> str:
    """Create an empty staging folder for ``final_dir`` (removing a stale one) and return its path."""
    staging = staging_path(final_dir)
    parent = os.path.dirname(staging)
    os.makedirs(parent, exist_ok=True)
    if os.path.lexists(staging):
        discard(staging)
    os.makedirs(staging)
    return staging


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0


def commit(staging: str, final_dir: str, manifest: Manifest) -> None:
    """Write the manifest into ``staging`` and make it visible as ``final_dir`` atomically.

    An existing ``final_dir`` is replaced: swapped atomically where the kernel allows it, otherwise
    moved to the trash just before the rename (a crash in between leaves the old checkpoint in the
    trash and the new one staged, both complete; ``load_state()`` then falls back to older ones).
    """
    final_dir = os.path.abspath(final_dir)
    parent = os.path.dirname(final_dir)
    manifest_path = os.path.join(staging, MANIFEST_NAME)
    tmp_manifest = manifest_path + ".tmp"
    with open(tmp_manifest, "w", encoding="utf-8") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_manifest, manifest_path)
    fsync_dir(staging)
    if os.path.lexists(final_dir):
        if _exchange(staging, final_dir):
            fsync_dir(parent)
            discard(staging)  # now holds the previous checkpoint
            return
        discard(final_dir)
    os.rename(staging, final_dir)
    fsync_dir(parent)


def list_checkpoints(checkpoints_dir: str) -> list[tuple[int, str]]:
    """Return ``(number, path)`` of every ``checkpoint_<n>`` folder with a manifest, oldest first.

    Folders without a manifest (interrupted saves of other tools) and hidden staging or trash
    folders are not listed. Damage inside a listed folder is found by :func:`verify_checkpoint`.
    """
    if not os.path.isdir(checkpoints_dir):
        return []
    found = []
    for name in os.listdir(checkpoints_dir):
        match = _CHECKPOINT_RE.match(name)
        path = os.path.join(checkpoints_dir, name)
        if match and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def rotate(checkpoints_dir: str, total_limit: int | None) -> list[str]:
    """Delete the oldest complete checkpoints so that at most ``total_limit`` remain.

    Call only after the newest checkpoint was committed. Returns the deleted paths.
    """
    if total_limit is None:
        return []
    complete = list_checkpoints(checkpoints_dir)
    doomed = [path for _, path in complete[: max(0, len(complete) - total_limit)]]
    for path in doomed:
        discard(path)
    return doomed
