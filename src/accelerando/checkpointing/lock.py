"""One writer per checkpoint folder: exclusive locks.

Two kinds, both exclusive between processes and both released by the operating system when the holding
process dies (``kill -9`` included), so a crashed run never blocks the next one:

- the project lock (:func:`hold`), on the project's ``checkpoints`` folder itself: taken by a run at its
  first automatically named save and held until the process exits or every ``Accelerator`` that took it
  is freed. Accelerators of one process share it (they do not save concurrently); another process
  that tries to save into the same project folder is refused (:class:`CheckpointLockedError`) or
  waits, if asked to. Locking the folder (``flock`` on a descriptor of the directory) leaves no file
  anywhere, so ``os.listdir`` of the project folder or of ``checkpoints`` shows only what the user and
  the reference expect. Where a directory cannot be locked (Windows; some network file systems) the
  lock falls back to a file beside the folder, ``<project_dir>/.checkpoints.lock``, which stays there.
- the save lock (:func:`save_lock`), ``<parent>/.<name>.lock``: held for the length of one save into an
  explicit folder, so two processes never stage or commit the same folder at once; its file is
  removed again when the save ends.

A lock file holds the holder's pid, host and start time, which the refusal quotes; for a locked folder
the refusal names the holder's pid from the kernel's lock table (``/proc/locks``) where there is one.

Why ``flock`` rather than POSIX record locks (``lockf``): a record lock is dropped when *any*
descriptor of the file is closed by its process, so a user copying the project folder in the same
process would silently release it. ``flock`` locks belong to the open file, which a forked child
shares; after a fork the child closes its copy (``os.register_at_fork``), so the lock stays with the
parent and dies with it, and descriptors are not inherited across ``exec``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelerando.checkpointing.manifest import CheckpointError
from accelerando.checkpointing.project import CHECKPOINTS_FOLDER
from accelerando.core.safe_files import NotRegularFileError, describe_mode, open_regular_fd, read_regular

__all__ = [
    "PROJECT_LOCK_NAME",
    "WAIT_FOR_LOCK_S",
    "CheckpointLockedError",
    "check_wait",
    "hold",
    "holds",
    "project_lock_path",
    "refusal",
    "save_lock",
]

PROJECT_LOCK_NAME = ".checkpoints.lock"

# How long a save waits for another process's lock before giving up (seconds; 0 refuses at once).
# ``save_state(wait_for_lock=...)`` overrides it per call.
WAIT_FOR_LOCK_S: float = 0.0

_POLL_S = (0.02, 0.5)  # first and longest pause between attempts while waiting
_RECORD_BYTES = 512  # the holder's details in the lock file


class CheckpointLockedError(CheckpointError):
    """Another process is writing checkpoints into the same folder; the message names it and the fix.

    Attributes:
        lock_file: what the other process locked (the ``checkpoints`` folder, or a lock file).
        folder: the folder it protects.
    """

    def __init__(self, message: str, lock_file: str = "", folder: str = "") -> None:
        super().__init__(message)
        self.lock_file = lock_file
        self.folder = folder


def check_wait(value: object) -> float:
    """Validate a ``wait_for_lock`` value: seconds >= 0 (``math.inf`` waits for as long as it takes).

    Raises:
        TypeError: If it is not a number.
        ValueError: If it is negative or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"wait_for_lock must be a number of seconds, got {type(value).__name__}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"wait_for_lock must be seconds >= 0 (0: refuse at once), got {value!r}")
    return float(value)


def project_lock_path(project_dir: str | os.PathLike) -> str:
    """What the project lock of ``project_dir`` locks: its ``checkpoints`` folder (created if needed).

    Where that folder cannot be locked, :func:`_acquire` locks the file ``<project_dir>/.checkpoints.lock``
    instead (:data:`PROJECT_LOCK_NAME`).
    """
    return os.path.join(os.path.abspath(os.fspath(project_dir)), CHECKPOINTS_FOLDER)


# ----------------------------------------------------------------------------------- the mechanism
def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without blocking; False if another open file holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: a byte-range lock on the first byte
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _describe_holder(path: str) -> str:
    """What the lock file says about its holder ("pid 12 on host h since ..."), or a neutral phrase."""
    if os.path.isdir(path):
        return _describe_folder_holder(path)

    try:
        info = json.loads(read_regular(path, 4096, follow=False).decode("utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on host {str(info['host'])[:64]!r}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):  # being written, or left by another tool
        return "a process that left no details"


def _describe_folder_holder(path: str) -> str:
    """The pid holding an ``flock`` on the folder ``path``, from Linux's ``/proc/locks``, or a neutral phrase.

    Its lines read ``1: FLOCK  ADVISORY  WRITE <pid> <major hex>:<minor hex>:<inode> 0 EOF``.
    """
    try:
        info = os.stat(path)
        with open("/proc/locks", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return "a process that left no details"
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and "FLOCK" in fields and "->" not in fields and fields[5] == wanted:
            return f"pid {fields[4]} on host {socket.gethostname()[:64]!r}"
    return "a process that left no details"


def _acquire_folder(path: str, wait: float, what: str) -> int | None:
    """Exclusively lock the folder ``path`` (created if needed), waiting up to ``wait`` seconds.

    Returns:
        The locked descriptor, or None where folders cannot be locked (Windows cannot open them; some
        network file systems refuse ``flock`` on a descriptor not open for writing): the caller then
        locks a file instead.

    Raises:
        CheckpointLockedError: If another process still holds it after ``wait`` seconds.
        CheckpointError: If ``path`` exists and is not a folder.
    """
    flag = getattr(os, "O_DIRECTORY", None)
    if flag is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | flag | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileExistsError, NotADirectoryError):
        try:
            words = describe_mode(os.lstat(path).st_mode)
        except OSError:
            words = "not a folder"
        raise CheckpointError(
            f"Cannot save into {what!r}: {path!r} is {words}, not a folder. Move it away and save again."
        ) from None
    deadline = time.monotonic() + wait
    pause = _POLL_S[0]
    try:
        while not _try_lock(fd):
            left = deadline - time.monotonic()
            if left <= 0:
                raise refusal(path, wait, what)
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_S[1])
    except CheckpointLockedError:
        os.close(fd)
        raise
    except OSError:  # this file system does not lock folders
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _acquire_project(path: str, wait: float, what: str, run: str) -> int:
    """Take the project lock on the ``checkpoints`` folder ``path``, or on the fallback file beside it.

    Raises:
        CheckpointLockedError: If another process still holds it after ``wait`` seconds.
    """
    fd = _acquire_folder(path, wait, what)
    if fd is not None:
        return fd
    return _acquire(os.path.join(os.path.dirname(path), PROJECT_LOCK_NAME), wait, what, run)


def _write_holder(fd: int, run: str) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "run": run}
    # One fixed-width record written over the previous one: truncating a non-empty file first costs
    # milliseconds on ext4 (it flushes the file), on every explicit-folder save.
    data = (json.dumps(info).ljust(_RECORD_BYTES - 1) + "\n").encode()
    try:
        if hasattr(os, "pwrite"):
            os.pwrite(fd, data, 0)
        else:  # Windows
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, data)
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError:  # e.g. a full disk: the details are a courtesy, the lock is what matters
        pass


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a removed lock file does not count)."""
    try:
        mine, now = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _open_lock_file(path: str, what: str) -> int:
    """Open (creating it if needed) the lock file ``path`` for writing, never through a link.

    ``O_NOFOLLOW`` and a non-blocking open, then ``fstat`` on the descriptor: a symbolic link, a
    folder, a FIFO or a device at ``path`` is refused, so that no other file is ever truncated or
    overwritten with lock data and no open hangs.

    Raises:
        CheckpointError: One line naming the lock file, what it is and the fix, when it is not a
            regular file or an existing one cannot be opened for writing (immutable, read-only).
        OSError: The lock file could not be created: the folder is not writable (the save reports
            that folder and the fix, see ``save._translated``), or another failure of ``open``.
    """
    try:
        return open_regular_fd(path, os.O_RDWR | os.O_CREAT, 0o644, follow=False)
    except NotRegularFileError as err:
        raise CheckpointError(
            f"Cannot save into {what!r}: {path!r}, the lock file kept beside it while saving, is "
            f"{err.what}, not a regular file (links are never followed, so that no other file is "
            "overwritten). Remove it and save again."
        ) from None
    except OSError as err:
        if not os.path.lexists(path):
            raise  # not created: the folder is what is not writable, not a file of ours
        raise CheckpointError(
            f"Cannot save into {what!r}: {path!r}, the lock file kept beside it while saving, cannot be "
            f"opened for writing ({err.strerror or err}; is it immutable or read-only?). Remove it or fix "
            "its permissions, then save again."
        ) from None


def _acquire(path: str, wait: float, what: str, run: str) -> int:
    """Open and exclusively lock ``path``, waiting up to ``wait`` seconds; return the descriptor.

    Raises:
        CheckpointLockedError: If another process still holds it after ``wait`` seconds.
        CheckpointError: If ``path`` is a link, a folder or another special file, or cannot be opened
            for writing (see :func:`_open_lock_file`).
    """
    deadline = time.monotonic() + wait
    pause = _POLL_S[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while True:
        fd = _open_lock_file(path, what)
        try:
            locked = _try_lock(fd)
            if locked and _same_file(fd, path):
                _write_holder(fd, run)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if locked:  # a save lock's holder removed the file as it let go: try the new one at once
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise refusal(path, wait, what)
        time.sleep(min(pause, left))
        pause = min(pause * 2, _POLL_S[1])


def refusal(path: str, waited: float, what: str) -> CheckpointLockedError:
    """The error for a lock ``path`` (protecting ``what``) still held by another process after ``waited`` s."""
    waited_text = f" (still held after waiting {waited:g} s)" if waited > 0 else ""
    return CheckpointLockedError(
        f"Cannot save into {what!r}: another process is writing checkpoints there{waited_text}: "
        f"{_describe_holder(path)} ({'locked folder' if os.path.isdir(path) else 'lock file'} {path!r}). Two runs saving into one folder would overwrite "
        "and delete each other's checkpoints. Give this run its own project_dir (or output_dir), stop the "
        "other run, or wait for it with save_state(wait_for_lock=<seconds>).",
        lock_file=path,
        folder=what,
    )


def _unlock_close(fd: int) -> None:
    try:
        os.close(fd)  # closing the only descriptor of the open file releases its lock
    except OSError:
        pass


# ------------------------------------------------------------------- the project lock, per process
@dataclass
class _Held:
    fd: int
    run: str
    holders: int = 0


_HELD: dict[str, _Held] = {}
_MUTEX = threading.Lock()
# Drops requested while the mutex was taken (a finalizer may run during any allocation, even in hold()).
_PENDING: list[str] = []
# Counts forks: a forked child's holds (and its parent's finalizers) belong to an earlier generation.
_GENERATION = 0
# What each owner holds (path -> (generation, finalizer)) lives with the owner: CheckpointMemory.locks.
if TYPE_CHECKING:
    Owned = dict[str, tuple[int, weakref.finalize[..., object]]]


def hold(owner: object, owned: Owned, path: str, wait: float, what: str, run: str) -> None:
    """Make sure this process holds the project lock ``path`` on behalf of ``owner``.

    The first call for a path takes the lock (waiting up to ``wait`` seconds for another process);
    later calls, from any owner of this process, only count the owner. The lock is released when every
    owner that took it was freed or passed to :func:`release`, or when the process ends.

    Args:
        owner: the object whose lifetime bounds the lock (the Accelerator).
        owned: the locks ``owner`` counts in (its ``CheckpointMemory.locks``), updated here.
        path: the project's ``checkpoints`` folder (:func:`project_lock_path`).
        wait: seconds to wait for another process's lock.
        what: the folder the lock protects, for the error message.
        run: a token naming this run, recorded in the lock file.

    Raises:
        CheckpointLockedError: If another process holds it (after waiting ``wait`` seconds).
    """
    path = os.path.realpath(path)  # one entry however the folder is reached (a symlink, a relative path)
    with _MUTEX:
        _drain()
        entry = owned.get(path)
        if entry is not None and entry[0] == _GENERATION:
            return
        if entry is not None:  # taken before a fork: this child holds nothing yet
            entry[1].detach()
        held = _HELD.get(path)
        if held is None:
            held = _HELD[path] = _Held(_acquire_project(path, wait, what, run), run)
        held.holders += 1
        owned[path] = (_GENERATION, weakref.finalize(owner, _drop, path, _GENERATION))


def holds(path: str) -> bool:
    """Whether this process holds the project lock ``path``."""
    return os.path.realpath(path) in _HELD


def _drop(path: str, generation: int) -> None:
    if generation != _GENERATION:
        return  # a hold of the parent process (before a fork): not this process's to give up
    _PENDING.append(path)
    if _MUTEX.acquire(blocking=False):
        try:
            _drain()
        finally:
            _MUTEX.release()


def _drain() -> None:
    """Apply the requested drops (the caller holds the mutex)."""
    while _PENDING:
        path = _PENDING.pop()
        held = _HELD.get(path)
        if held is None:
            continue
        held.holders -= 1
        if held.holders <= 0:
            del _HELD[path]
            _unlock_close(held.fd)


def _after_fork_in_child() -> None:
    """A forked child shares its parent's lock: drop the child's reference so the lock stays the parent's."""
    for held in _HELD.values():
        _unlock_close(held.fd)
    _HELD.clear()
    _PENDING.clear()
    global _MUTEX, _GENERATION
    _GENERATION += 1  # the parent's holds, still recorded with their owners, are not this child's
    _MUTEX = threading.Lock()  # it may have been held by another thread at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------------ the save lock, per save
@contextmanager
def save_lock(final_dir: str, wait: float, run: str) -> Iterator[None]:
    """Hold ``<parent>/.<name>.lock`` exclusively while saving into the explicit folder ``final_dir``.

    Raises:
        CheckpointLockedError: If another process is saving into the same folder (after ``wait`` s).
        CheckpointError: If the lock file is a link or a special file, or cannot be opened for writing.
    """
    parent, name = os.path.split(os.path.abspath(final_dir))
    path = os.path.join(parent, f".{name}.lock")
    fd = _acquire(path, wait, final_dir, run)
    try:
        yield
    finally:
        # Remove the file while still holding the lock; a waiter that opened it sees it is gone.
        try:
            os.remove(path)
        except OSError:
            pass
        _unlock_close(fd)
