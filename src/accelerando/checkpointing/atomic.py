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

``durable=False`` (a scratch save, the ``checkpoint_durable`` setting) keeps every step but the
``fsync`` calls: the rename is still atomic and the manifest still describes every file, so a crashed
*process* never leaves a folder that looks complete and is not; a crashed *machine* (power loss,
kernel panic) may, because the data can still be in the page cache when the rename reaches the disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Sequence

import accelerando.checkpointing.written as written
from accelerando.checkpointing.digest import FileEntry, PendingDigests, default_algorithm, file_digest
from accelerando.checkpointing.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    Manifest,
    read_manifest,
    verify_checkpoint,
    verify_checksums,
)
from accelerando.checkpointing.removal import (
    BACKGROUND_MIN_BYTES,
    regular_file_entries,
    remove_later,
    remove_tree,
    wait_for_removals,
)
from accelerando.checkpointing.workers import flush_pool

__all__ = [
    "BACKGROUND_MIN_BYTES",
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
    "flush_all",
    "fsync_dir",
    "free_bytes",
    "fsync_file",
    "is_out_of_space",
    "list_checkpoints",
    "no_space_error",
    "prepare_staging",
    "read_manifest",
    "regular_file_entries",
    "remove_stale",
    "remove_later",
    "remove_stale_of",
    "remove_tree",
    "rotate",
    "rotated_out",
    "staging_path",
    "verify_checkpoint",
    "verify_checksums",
    "wait_for_removals",
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
    """Describe files for the manifest as soon as they are written, and flush them to disk together.

    ``add(name)`` hands over a finished file. Its checksum is the one its writer computed while
    writing it, when the writer did (:mod:`accelerando.checkpointing.written`: files written by this
    thread into the folder while the describer is open); otherwise the digest pool hashes the file,
    reading back the bytes that reached it. ``finish()`` waits for the checksums and, in a durable
    save, ``fsync``s every added file at once on the flush pool (one call per file; the file system
    commits them together), or leaves them to the caller (``flush=False``: the committing process
    flushes them with the manifest and the staging folder, see :func:`commit`). No thread is started
    per save: the pools keep theirs. ``close()`` (idempotent) releases everything.
    """

    def __init__(self, folder: str, durable: bool = True) -> None:
        self._folder = folder
        self._durable = durable  # False: hash only, no fsync (a scratch save)
        self._names: list[str] = []
        self._hashed: list[str] = []  # the names the digest pool hashes, in its order
        self._known: dict[str, FileEntry] = {}  # checksums computed while writing
        self._digests = PendingDigests()
        self._unflushed: list[str] = []  # paths of added files not yet flushed (durable saves)
        self._collecting: contextlib.ExitStack | None = contextlib.ExitStack()
        self._collecting.enter_context(written.collecting(folder))

    def add(self, name: str) -> None:
        """Describe ``name`` (relative to the folder); raises if it must be hashed and cannot be opened."""
        path = os.path.join(self._folder, name)
        self._names.append(name)
        known = written.take(path)
        if known is not None:
            self._known[name] = known
        else:
            self._hashed.append(name)
            self._digests.add(path)
        if self._durable:
            self._unflushed.append(path)

    def finish(self, flush: bool = True) -> dict[str, FileEntry]:
        """Wait until every added file is hashed (and, with ``flush``, on disk); return ``{name: entry}``.

        Raises:
            OSError: If a flush or a read failed.
        """
        hashed = dict(zip(self._hashed, self._digests.result(), strict=True))
        if flush:
            flush_all(self.unflushed())
        return {name: self._known[name] if name in self._known else hashed[name] for name in self._names}

    def unflushed(self) -> list[str]:
        """The paths of the added files not flushed yet (durable saves; empty in a scratch save); the
        caller now flushes them.
        """
        paths, self._unflushed = self._unflushed, []
        return paths

    def close(self) -> None:
        """Stop the hashing of a describer that will not finish (after a failure)."""
        if self._collecting is not None:
            self._collecting.close()
            self._collecting = None
        self._digests.close()


def flush_all(files: Sequence[str], folders: Sequence[str] = ()) -> None:
    """``fsync`` every file and folder at once: one call each, all but one on the flush pool, so that
    the file system commits them together rather than one journal commit after the other.

    Raises:
        OSError: The first failure (after every call has returned).
    """
    calls = [(fsync_file, path) for path in files] + [(fsync_dir, path) for path in folders]
    if not calls:
        return
    pool = flush_pool()
    futures = [pool.submit(flush, path) for flush, path in calls[1:]]
    error: BaseException | None = None
    try:
        calls[0][0](calls[0][1])
    except BaseException as err:  # noqa: BLE001 - raised below, once every other flush has returned
        error = err
    for future in futures:
        failure = future.exception()
        if error is None and failure is not None:
            error = failure
    if error is not None:
        raise error


def describe_files(folder: str, names: Iterable[str], durable: bool = True) -> dict[str, FileEntry]:
    """Make the named files (relative to ``folder``) durable and return their manifest entries.

    ``durable=False`` describes them without flushing them to disk (a scratch save).

    Raises:
        OSError: If a file is missing or cannot be flushed or read.
    """
    describer = FileDescriber(folder, durable)
    try:
        for name in names:
            describer.add(name)
        return describer.finish()
    finally:
        describer.close()


def staging_path(final_dir: str, run: str | None = None) -> str:
    """The hidden sibling folder a checkpoint is written into before it becomes visible.

    ``run`` (letters and digits) makes the name one run's own (``.<name>.<run>.partial``), so two runs
    saving the same folder never share a staging folder.
    """
    final_dir = os.path.abspath(final_dir)
    parent, name = os.path.split(final_dir)
    if run is None:
        return os.path.join(parent, f".{name}{_PARTIAL_SUFFIX}")
    if not run.isalnum():
        raise ValueError(f"a staging run token must be letters and digits, got {run[:40]!r}")
    return os.path.join(parent, f".{name}.{run}{_PARTIAL_SUFFIX}")


def discard(path: str, durable: bool = True) -> None:
    """Delete a folder crash-safely: rename it to a hidden trash name first, then remove it.

    ``durable=False`` skips the flush of the parent folder after the rename (a scratch save).
    """
    if not os.path.lexists(path):
        return
    trash = _to_trash(path)
    if durable:
        fsync_dir(os.path.dirname(trash))
    remove_tree(trash, together=durable)


def _to_trash(path: str) -> str:
    """Rename ``path`` to a hidden trash name beside it (not flushed) and return that name."""
    parent, name = os.path.split(os.path.abspath(path))
    trash = os.path.join(parent, f".{name.lstrip('.')}{_TRASH_MARK}{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    return trash


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


def remove_stale_of(final_dir: str) -> None:
    """Remove staging and trash folders left beside ``final_dir`` by interrupted saves of that folder.

    Unlike :func:`remove_stale`, other folders' leftovers (``ckpt.v2`` beside ``ckpt``) are left alone:
    another process may be saving them. Call it only while holding the folder's save lock.
    """
    parent, name = os.path.split(os.path.abspath(final_dir))
    # .<name>.partial, .<name>.<run>.partial (run: 32 hex digits), either with .trash-<hex>, .<name>.trash-<hex>
    own = re.compile(
        rf"^\.{re.escape(name)}(?:(?:\.[0-9a-f]{{32}})?{re.escape(_PARTIAL_SUFFIX)}(?:{re.escape(_TRASH_MARK)}[0-9a-f]+)?"
        rf"|{re.escape(_TRASH_MARK)}[0-9a-f]+)$"
    )
    if not os.path.isdir(parent):
        return
    for entry in os.listdir(parent):
        if own.match(entry):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def prepare_staging(final_dir: str, run: str | None = None) -> str:
    """Create an empty staging folder for ``final_dir`` (removing a stale one) and return its path.

    ``run``: see :func:`staging_path`.
    """
    staging = staging_path(final_dir, run)
    parent = os.path.dirname(staging)
    os.makedirs(parent, exist_ok=True)
    if os.path.lexists(staging):
        discard(staging)
    os.makedirs(staging)
    return staging


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_RENAMEAT2: list[Callable[..., int] | None] = []  # looked up once per process (empty: not yet)


def _renameat2() -> Callable[..., int] | None:
    """Libc's ``renameat2`` (None where this libc lacks it), looked up on first use."""
    if not _RENAMEAT2:
        try:
            function = ctypes.CDLL(None, use_errno=True).renameat2
            function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _RENAMEAT2.append(function)
        except (OSError, AttributeError):
            _RENAMEAT2.append(None)
    return _RENAMEAT2[0]


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _write_manifest(staging: str, manifest: Manifest) -> str:
    """Write the manifest into ``staging`` (not flushed) and return its path."""
    manifest_path = os.path.join(staging, MANIFEST_NAME)
    tmp_manifest = manifest_path + ".tmp"
    # A new file only (O_EXCL, O_NOFOLLOW): never written through a link planted in the staging folder.
    new_only = (
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    fd = os.open(tmp_manifest, new_only, 0o666)
    try:
        data = manifest.to_json().encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp_manifest, manifest_path)
    return manifest_path


def commit(
    staging: str,
    final_dir: str,
    manifest: Manifest,
    durable: bool = True,
    flush: Sequence[str] = (),
    flush_folders: Sequence[str] = (),
) -> None:
    """Write the manifest into ``staging`` and make it visible as ``final_dir`` atomically.

    A durable save flushes, all at once (:func:`flush_all`), the files in ``flush`` (the files of the
    checkpoint not flushed yet), the manifest, the folders in ``flush_folders`` (sub-folders of the
    staging folder) and the staging folder; then renames the staging folder into place and flushes its
    parent: two rounds of waiting on the disk, whatever the number of files.

    An existing ``final_dir`` is replaced: swapped atomically where the kernel allows it, otherwise
    moved to the trash just before the rename (a crash in between leaves the old checkpoint in the
    trash and the new one staged, both complete; ``load_state()`` then falls back to older ones).
    The replaced checkpoint, under its hidden name, is removed in the background (:func:`remove_later`).
    ``durable=False`` makes the same renames without any ``fsync`` (see the module's docstring).
    """
    sync_dir = fsync_dir if durable else _no_sync
    final_dir = os.path.abspath(final_dir)
    parent = os.path.dirname(final_dir)
    manifest_path = _write_manifest(staging, manifest)
    if durable:
        flush_all([*flush, manifest_path], [*flush_folders, staging])
    if os.path.lexists(final_dir):
        if _exchange(staging, final_dir):
            sync_dir(parent)
            # The staging name now holds the previous checkpoint: removed where it is, in the background
            # (a crash leaves a hidden staging folder, which the next save of this folder removes).
            remove_later(staging, together=durable)
            return
        trash = _to_trash(final_dir)
        os.rename(staging, final_dir)
        sync_dir(parent)  # one flush for both renames
        remove_later(trash, together=durable)
        return
    os.rename(staging, final_dir)
    sync_dir(parent)


def _no_sync(_: str) -> None:
    """Stand-in for :func:`fsync_dir` in a scratch save."""


def _is_real_checkpoint(path: str) -> bool:
    """A plain folder holding a plain manifest file; links are not followed (they may lead outside)."""
    try:
        folder, manifest = os.lstat(path), os.lstat(os.path.join(path, MANIFEST_NAME))
    except OSError:
        return False
    return stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(manifest.st_mode)


def list_checkpoints(checkpoints_dir: str) -> list[tuple[int, str]]:
    """Return ``(number, path)`` of every ``checkpoint_<n>`` folder with a manifest, oldest first.

    Folders without a manifest (interrupted saves of other tools), hidden staging or trash folders,
    and symbolic links (to a folder or as the manifest) are not listed. Damage inside a listed folder is found by :func:`verify_checkpoint`.
    """
    if not os.path.isdir(checkpoints_dir):
        return []
    found = []
    for name in os.listdir(checkpoints_dir):
        match = _CHECKPOINT_RE.match(name)
        path = os.path.join(checkpoints_dir, name)
        if match and _is_real_checkpoint(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def rotated_out(
    checkpoints_dir: str, total_limit: int | None, uncounted: Iterable[str] = (), adding: int | None = None
) -> list[str]:
    """The complete checkpoints :func:`rotate` deletes now (oldest first), or, with ``adding`` (the
    number of a checkpoint about to be saved), once that one is committed too.
    """
    if total_limit is None:
        return []
    complete = list_checkpoints(checkpoints_dir)
    skipped = {os.path.abspath(path) for path in uncounted}
    counted = [number for number, path in complete if os.path.abspath(path) not in skipped]
    if adding is not None and adding not in counted:
        counted = sorted([*counted, adding])
    kept = set(counted[max(0, len(counted) - total_limit) :])
    oldest_kept = min(kept) if kept else None
    return [
        path
        for number, path in complete
        if number not in kept
        and (os.path.abspath(path) not in skipped or (oldest_kept is not None and number < oldest_kept))
    ]


def rotate(
    checkpoints_dir: str, total_limit: int | None, uncounted: Iterable[str] = (), durable: bool = True
) -> list[str]:
    """Delete the oldest complete checkpoints so that at most ``total_limit`` remain.

    Call only after the newest checkpoint was committed, and only from the process that holds the
    project's lock (:mod:`accelerando.checkpointing.lock`), so another run's checkpoints are never touched.

    Args:
        checkpoints_dir: the ``checkpoints`` folder.
        total_limit: how many to keep (None: keep all).
        uncounted: checkpoints that do not count toward the limit (those a resumed run skipped as
            damaged): each stays until it is older than the oldest checkpoint kept, then goes too.
        durable: flush each deletion's rename to disk (False in a scratch save).

    Returns:
        The deleted paths, oldest first.
    """
    doomed = rotated_out(checkpoints_dir, total_limit, uncounted)
    trashed = [_to_trash(path) for path in doomed]
    if trashed and durable:
        fsync_dir(checkpoints_dir)  # one flush for every rename above
    for trash in trashed:
        remove_later(trash, together=durable)
    return doomed


# Texts of out-of-space failures that lost their errno on the way (safetensors, torch's legacy writer).
_NO_SPACE_TEXTS = (
    "no space left on device",
    "storagefull",
    "os error 28",
    "disk quota exceeded",
    "os error 122",
)
# torch's zip writer reports a short write without its cause; a full disk is the usual one.
_SHORT_WRITE_TEXTS = ("unexpected pos", "file write failed")


def _folder_bytes(folder: str) -> int:
    """Bytes the files under ``folder`` occupy on disk (0 if it is gone)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += getattr(info, "st_blocks", 0) * 512 or info.st_size
    return total


def free_bytes(folder: str) -> int:
    """Bytes free for writing on the disk holding ``folder`` (its nearest existing parent)."""
    path = os.path.abspath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def is_out_of_space(error: BaseException, staging: str, needed: int) -> bool:
    """Whether ``error``, raised while writing into ``staging``, means the disk (or quota) is full."""
    quota = getattr(errno, "EDQUOT", errno.ENOSPC)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, quota):
        return True
    text = str(error).lower()
    if any(fragment in text for fragment in _NO_SPACE_TEXTS):
        return True
    if isinstance(error, RuntimeError) and any(fragment in text for fragment in _SHORT_WRITE_TEXTS):
        try:
            return free_bytes(staging) < max(needed, 1 << 20)
        except OSError:
            return False
    return False


def _human(size: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)  # pragma: no cover


def no_space_error(error: BaseException, final_dir: str, staging: str, needed: int) -> OSError:
    """An ``OSError(ENOSPC)`` for a save of ``final_dir`` that ran out of space, saying how much is needed.

    ``needed`` is the caller's estimate of the checkpoint's size; the free space is measured now and
    counts the partly written ``staging`` folder as free, since the failed save removes it.
    """
    staged = _folder_bytes(staging)
    needed = max(needed, staged)
    try:
        free = free_bytes(final_dir) + staged
    except OSError:
        free = -1
    free_text = f"{free:,} bytes ({_human(free)}) are free" if free >= 0 else "the free space is unknown"
    cause = " ".join(str(error).split())[:80]
    message = (
        f"Checkpoint {final_dir!r} was not saved: no space left on device. It needs about {needed:,} bytes "
        f"({_human(needed)}) and {free_text} there. Nothing was committed and earlier checkpoints are "
        "untouched; free some space, lower ProjectConfiguration.total_limit, or save to another disk "
        f"(the write failed with: {cause})."
    )
    return OSError(errno.ENOSPC, message)
