"""Removing checkpoint folders: a folder's files unlinked together, and replaced or rotated-out
checkpoints removed after the commit on a thread of their own.

The committing code (:mod:`accelerando.checkpointing.atomic`) renames a doomed folder to a hidden name
first, so what is removed here is never a folder a load reads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator

from accelerando.checkpointing.workers import flush_pool

__all__ = [
    "BACKGROUND_MIN_BYTES",
    "regular_file_entries",
    "remove_later",
    "remove_tree",
    "wait_for_removals",
]


def remove_tree(path: str, together: bool = True) -> None:
    """Delete the folder ``path`` and everything in it, ignoring errors (as ``shutil.rmtree`` with
    ``ignore_errors``); with ``together``, its files are unlinked at once on the flush pool.

    One after the other, each unlink of a file flushed moments ago can wait for a journal commit of its
    own (about 3 ms each on a busy ext4); unlinked together they wait once. Files never flushed (a
    scratch save's) are unlinked in this thread (``together=False``): handing them to threads would
    cost more than the unlinks. Links are removed, never followed: the folder is opened without
    following a link and its entries are unlinked relative to that descriptor; sub-folders go through
    ``shutil.rmtree``.
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    if os.unlink not in os.supports_dir_fd or os.scandir not in os.supports_fd:
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # gone, a link, or not a folder: what rmtree would do
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        files = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(os.path.join(path, entry.name), ignore_errors=True)
                else:
                    files.append(entry.name)
        if not together or len(files) < 2:  # no other thread to wait with: unlinked here
            for name in files:
                _unlink_at(name, fd)
        else:
            pool = flush_pool()
            futures = [pool.submit(_unlink_at, name, fd) for name in files[1:]]
            _unlink_at(files[0], fd)
            for future in futures:
                future.result()
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


# Folders smaller than this are removed (and their page cache dropped) in line: it costs less than
# what doing it differently saves.
BACKGROUND_MIN_BYTES = 64 << 20

_PENDING_REMOVALS: list[threading.Thread] = []
_PENDING_LOCK = threading.Lock()  # a background save's commit hands removals over too


def _forget_removals_in_child() -> None:
    """A forked child has the parent's list and lock (maybe held by a thread it lacks), not its threads."""
    global _PENDING_LOCK
    _PENDING_LOCK = threading.Lock()
    _PENDING_REMOVALS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_removals_in_child)


def regular_file_entries(folder: str) -> Iterator[os.DirEntry[str]]:
    """The regular files under ``folder``, sub-folders entered, links never followed; unreadable
    folders are skipped.
    """
    pending = [folder]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        yield entry
        except OSError:
            continue


def _bytes_at_least(folder: str, enough: int) -> int:
    """The bytes of the regular files under ``folder``, counted until ``enough`` (links not followed)."""
    total = 0
    for entry in regular_file_entries(folder):
        with contextlib.suppress(OSError):
            total += entry.stat(follow_symlinks=False).st_size
        if total >= enough:
            break
    return total


def remove_later(path: str, together: bool = True) -> None:
    """Remove the folder ``path`` (see :func:`remove_tree`) on a thread of its own and return; a folder
    under ``BACKGROUND_MIN_BYTES`` is removed before returning, starting no thread.

    For a replaced or rotated-out checkpoint already renamed to a hidden name no load reads: the save
    returns once the new checkpoint is in place, without waiting for the unlinks (about 0.1 s per GB on
    ext4). :func:`wait_for_removals` waits for them; the next save does, before it writes anything. The
    thread is not a daemon, so the interpreter's exit (and a ``multiprocessing`` child's) waits for it
    too. A crash or ``os._exit`` meanwhile leaves the hidden folder, which the next save of that folder
    removes (as after any interrupted save).
    """
    if _bytes_at_least(path, BACKGROUND_MIN_BYTES) < BACKGROUND_MIN_BYTES:
        remove_tree(path, together)  # a small folder: gone in less time than a thread takes to start
        return
    thread = threading.Thread(target=remove_tree, args=(path, together), name="accelerando-remove")
    thread.start()
    with _PENDING_LOCK:
        _PENDING_REMOVALS[:] = [t for t in _PENDING_REMOVALS if t.is_alive()]
        _PENDING_REMOVALS.append(thread)


def wait_for_removals() -> None:
    """Wait until every folder this process handed to :func:`remove_later` is removed; never raises."""
    with _PENDING_LOCK:
        pending = list(_PENDING_REMOVALS)
        _PENDING_REMOVALS.clear()
    for thread in pending:
        thread.join()


def _unlink_at(name: str, folder_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder_fd)
