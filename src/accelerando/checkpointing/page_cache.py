"""Dropping a replaced checkpoint's files from the page cache before a save writes the new one.

A save keeps the checkpoint it replaces (or rotates out) whole on disk until the new one is committed,
so without care it holds two checkpoints' worth of page cache and allocates fresh memory for every
byte it writes (which costs more than reusing memory just freed, markedly so in virtual machines
whose host hands the guest's memory back lazily). Dropping the old files' *clean* pages right before
writing frees that memory for the new files and writes nothing: the old checkpoint's data is on disk
already. Dirty pages (a scratch save's, not written back yet) are never dropped, since dropping them
would first write back a checkpoint about to be deleted; unlinking it later discards them instead.

Which pages are clean comes from Linux's ``cachestat`` (6.5 and later), asked per range of
``RANGE_BYTES``. Where the kernel lacks it, a file is dropped whole only when the caller knows it is
clean (a checkpoint saved durably: every file was flushed).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable

from accelerando.checkpointing.removal import regular_file_entries

__all__ = ["RANGE_BYTES", "cachestat", "release_cached"]

RANGE_BYTES = 64 << 20
_CACHESTAT_SYSCALL = 451
# Where 451 is cachestat: system calls added since Linux 5.1 share one number on these machines (not on
# alpha, MIPS or ia64, which offset theirs: there the call is never made).
_UNIFIED_SYSCALL_MACHINES = frozenset(
    {
        "x86_64",
        "i386",
        "i686",
        "aarch64",
        "arm64",
        "armv7l",
        "armv8l",
        "riscv64",
        "ppc64le",
        "ppc64",
        "s390x",
        "loongarch64",
    }
)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


_Advise = Callable[[int, int, int, int], None]
_SYSCALL: list[Callable[..., int] | None] = []  # libc's syscall(), None where there is none (looked up once)


def _syscall() -> Callable[..., int] | None:
    if not _SYSCALL:
        function = None
        system = os.uname()
        if system.sysname == "Linux" and system.machine in _UNIFIED_SYSCALL_MACHINES:
            try:
                function = ctypes.CDLL(None, use_errno=True).syscall
                function.restype = ctypes.c_long
            except (OSError, AttributeError):
                function = None
        _SYSCALL.append(function)
    return _SYSCALL[0]


def cachestat(fd: int, offset: int = 0, length: int = 0) -> tuple[int, int, int] | None:
    """``(cached, dirty, under writeback)`` pages of ``fd``'s file in ``[offset, offset + length)``
    (``length`` 0: to the end), or None where the kernel has no ``cachestat``.
    """
    function = _syscall()
    if function is None:
        return None
    window, found = _Range(offset, length), _Stat()
    result = function(
        ctypes.c_long(_CACHESTAT_SYSCALL),
        ctypes.c_int(fd),
        ctypes.byref(window),
        ctypes.byref(found),
        ctypes.c_uint(0),
    )
    if result != 0:
        if ctypes.get_errno() == errno.ENOSYS:
            _SYSCALL[0] = None  # an older kernel: never asked again
        return None
    return found.nr_cache, found.nr_dirty, found.nr_writeback


def release_cached(folder: str, known_clean: bool) -> int:
    """Drop the clean cached pages of the regular files under ``folder``; returns the bytes of the
    ranges dropped (an upper bound of the memory freed). Never raises.

    ``known_clean``: every file was flushed (a durable save's), so each can be dropped whole where
    ``cachestat`` is missing. Links are never followed; files are opened without blocking (a FIFO
    planted there is skipped).
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return 0
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    dropped = 0
    for path in (entry.path for entry in regular_file_entries(folder)):
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                dropped += _drop_clean(fd, info.st_size, known_clean, advise)
        except OSError:
            pass
        finally:
            os.close(fd)
    return dropped


def _drop_clean(fd: int, size: int, known_clean: bool, advise: _Advise) -> int:
    """Drop the clean ranges of one open file; the bytes of the ranges dropped."""
    dropped = 0
    for offset in range(0, size, RANGE_BYTES):
        counts = cachestat(fd, offset, RANGE_BYTES)
        if counts is None:
            if not known_clean:
                return dropped
            advise(fd, offset, 0, os.POSIX_FADV_DONTNEED)  # the rest of the file, at once
            return dropped + size - offset
        cached, dirty, writeback = counts
        if cached and not dirty and not writeback:
            advise(fd, offset, RANGE_BYTES, os.POSIX_FADV_DONTNEED)
            dropped += min(RANGE_BYTES, size - offset)
    return dropped
