"""Opening files that users, configs and checkpoints name: regular files only, bounded reads, no links.

A path read from a checkpoint folder, a config option or a lock location may name a FIFO (reading it
blocks until someone writes), a device (``/dev/zero`` never ends), a socket or a folder, or be a
symbolic link to one. Every such file is opened here: without blocking (``O_NONBLOCK``), checked with
``fstat`` on the open descriptor (so the check and the read see the same file), refused unless it is a
regular file, and read no further than the bound the caller states. Files we write into (lock files)
are opened without following a link (``O_NOFOLLOW``).

The bottom layer: it imports nothing of accelerando, so the settings, the CLI and checkpointing share it.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing's constant, without importing typing (launcher start-up)
if TYPE_CHECKING:
    from typing import BinaryIO
__all__ = [
    "FileTooLargeError",
    "NotRegularFileError",
    "check_regular",
    "describe_mode",
    "open_regular",
    "open_regular_fd",
    "read_regular",
]

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows


class NotRegularFileError(OSError):
    """A path names something other than a regular file (a folder, FIFO, device, socket or link).

    Attributes:
        path: The path.
        what: What it is instead, in words ("a directory", "a FIFO (named pipe)", ...).
    """

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        super().__init__(errno.EINVAL, f"{path!r} is {what}, not a regular file")

    def __str__(self) -> str:
        return f"{self.path!r} is {self.what}, not a regular file"


class FileTooLargeError(OSError):
    """A file is bigger than the bound its reader accepts.

    Attributes:
        path: The file.
        size: Its size in bytes.
        limit: The largest size accepted.
    """

    def __init__(self, path: str, size: int, limit: int) -> None:
        self.path, self.size, self.limit = path, size, limit
        super().__init__(errno.EFBIG, f"{path!r} is {size} bytes, more than the {limit} bytes accepted")

    def __str__(self) -> str:
        return f"{self.path!r} is {self.size} bytes, more than the {self.limit} bytes accepted"


def describe_mode(mode: int) -> str:
    """What an ``st_mode`` names, in words: "a regular file", "a directory", "a FIFO (named pipe)", ..."""
    for test, words in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return words
    return "a special file"


def check_regular(path: str | os.PathLike[str], follow: bool = True) -> os.stat_result:
    """``stat`` (``lstat`` with ``follow=False``) ``path`` and require a regular file, opening nothing.

    Returns:
        Its ``stat`` result.

    Raises:
        NotRegularFileError: If it is anything else (with ``follow=False``, a symbolic link too).
        OSError: If it cannot be looked at (``FileNotFoundError`` when it does not exist).
    """
    info = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFileError(os.fspath(path), describe_mode(info.st_mode))
    return info


def open_regular_fd(
    path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644, follow: bool = True
) -> int:
    """Open ``path`` without blocking, check the open file is a regular one, return a blocking descriptor.

    Args:
        flags: ``os.open`` flags (``O_RDONLY``, or ``O_RDWR | O_CREAT`` for a lock file).
        mode: Permissions of a file ``O_CREAT`` creates.
        follow: False opens with ``O_NOFOLLOW``: a symbolic link as the last component is refused.

    Raises:
        NotRegularFileError: If it is a folder, FIFO, device, socket, or (``follow=False``) a link.
        OSError: Anything else ``os.open`` raises (missing, permission denied, read-only, ...).
    """
    name = os.fspath(path)
    extra = _NONBLOCK | _CLOEXEC | _BINARY | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(name, flags | extra, mode)
    except OSError as err:
        if err.errno == errno.EISDIR:
            raise NotRegularFileError(name, "a directory") from None
        if not follow and err.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(name):
            raise NotRegularFileError(name, "a symbolic link") from None
        if err.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise NotRegularFileError(name, _lstat_words(name)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(name, describe_mode(info.st_mode))
        if _NONBLOCK and hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat_words(path: str) -> str:
    try:
        return describe_mode(os.lstat(path).st_mode)
    except OSError:
        return "a special file"


def open_regular(path: str | os.PathLike[str], max_bytes: int | None = None, follow: bool = True) -> BinaryIO:
    """Open a regular file for binary reading (see :func:`open_regular_fd`), refusing one above ``max_bytes``.

    Raises:
        NotRegularFileError: If it is not a regular file.
        FileTooLargeError: If it is bigger than ``max_bytes``.
        OSError: If it cannot be opened.
    """
    fd = open_regular_fd(path, os.O_RDONLY, follow=follow)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise FileTooLargeError(os.fspath(path), size, max_bytes)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], max_bytes: int, follow: bool = True) -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` bytes (never reading past the bound).

    Raises:
        NotRegularFileError: If it is not a regular file.
        FileTooLargeError: If it is, or grows while read, bigger than ``max_bytes``.
        OSError: If it cannot be read.
    """
    with open_regular(path, max_bytes, follow) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(os.fspath(path), len(data), max_bytes)
    return data
