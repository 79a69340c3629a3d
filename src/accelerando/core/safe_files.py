"""Opening files that users, configs and checkpoints name: regular files only, bounded reads, no links.

A path read from a checkpoint folder, a config option or a lock location may name a FIFO (reading it
blocks until someone writes), a device (``/dev/zero`` never ends), a socket or a folder, or be a
symbolic link to one. Every such file is opened here: without blocking (``O_NONBLOCK``), checked with
``fstat`` on the open descriptor (so the check and the read see the same file), refused unless it is a
regular file, and read no further than the bound the caller states. Files we write into (lock files)
are opened without following a link (``O_NOFOLLOW``).

Archives are bounded too: :func:`check_archive` reads the central directory of a ``torch.save`` zip
archive before ``torch.load`` reads any entry, and refuses one that would inflate beyond the file
(a zip bomb).

The bottom layer: it imports nothing of accelerando, so the settings, the CLI and checkpointing share it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = [
    "ARCHIVE_SLACK_BYTES",
    "FileTooLargeError",
    "NotRegularFileError",
    "UnsafeArchiveError",
    "check_archive",
    "check_regular",
    "check_regular_inside",
    "describe_mode",
    "open_regular",
    "open_regular_fd",
    "read_regular",
    "replace_file",
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
        expected: What it had to be, in words ("a regular file", or "a folder" for a folder on the way).
    """

    def __init__(self, path: str, what: str, expected: str = "a regular file") -> None:
        self.path, self.what, self.expected = path, what, expected
        super().__init__(errno.EINVAL, f"{path!r} is {what}, not {expected}")

    def __str__(self) -> str:
        return f"{self.path!r} is {self.what}, not {self.expected}"


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


def replace_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o666) -> None:
    """Replace the file ``path`` by one holding ``data``, through a new temporary file next to it.

    The temporary file gets a fresh random name and is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``:
    never through a link or into a file someone planted, so nothing outside is ever written. It is
    then renamed over ``path`` (a link at ``path`` is replaced, not followed).

    Args:
        path: The file to (re)place; its folder must exist.
        data: The whole new content.
        mode: Permissions of the new file (before the umask).

    Raises:
        OSError: If the folder cannot be written (the temporary file is removed).
    """
    name = os.fspath(path)
    folder, base = os.path.split(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY
    while True:
        temporary = os.path.join(folder, f".{base}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(temporary, flags, mode)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits taken: draw again
            continue
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, name)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def check_regular_inside(folder: str, name: str) -> os.stat_result:
    """``lstat`` every component of the relative ``name`` below ``folder``, opening nothing: each folder
    on the way must be a real folder and the last component a regular file, none of them a link.

    So a name read from a file inside ``folder`` (a DCP ``.metadata``) cannot reach outside it
    through a linked folder (``sub/x`` where ``sub`` links elsewhere). ``name`` must already be a
    plain relative name (no ``..``, not absolute).

    Returns:
        The last component's ``lstat`` result.

    Raises:
        NotRegularFileError: Naming the first component that is a link, or not a folder (on the
            way) or not a regular file (at the end).
        OSError: If a component cannot be looked at (``FileNotFoundError`` when missing).
    """
    parts = name.replace("\\", "/").split("/")
    current = folder
    for part in parts[:-1]:
        current = os.path.join(current, part)
        info = os.lstat(current)
        if not stat.S_ISDIR(info.st_mode):
            raise NotRegularFileError(current, describe_mode(info.st_mode), "a folder")
    return check_regular(os.path.join(current, parts[-1]), follow=False)


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


# How far an archive's entries may declare more bytes than the file holds (torch.save stores its
# entries uncompressed, so their sizes add up to less than the file's; the slack only forgives rounding).
ARCHIVE_SLACK_BYTES = 2**20
_ZIP_MAGIC = b"PK\x03\x04"  # what torch.load takes for a zip archive (anything else: its legacy format)


class UnsafeArchiveError(OSError):
    """A ``torch.save`` archive whose entries would inflate beyond the file (a zip bomb), or unreadable.

    Attributes:
        path: The file.
        reason: What is wrong, in words.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(errno.EINVAL, f"Refused to load {path!r}: {reason}")

    def __str__(self) -> str:
        return (
            f"Refused to load {self.path!r}: {self.reason}. torch.save writes its entries uncompressed and "
            "within the file, so this file is damaged or was made to inflate to far more memory than its "
            "size (a zip bomb): load another copy, or re-save the object with torch.save."
        )


def check_archive(
    source: str | os.PathLike[str] | BinaryIO, path: str | None = None, max_total_bytes: int | None = None
) -> None:
    """Refuse a zip archive (``torch.save``'s format) that ``torch.load`` would inflate beyond its size.

    Reads only the archive's central directory (what torch's reader trusts for each entry's method
    and sizes), before ``torch.load`` reads any entry. A file that does not start as a zip archive
    (torch's legacy format) is left to ``torch.load``.

    Args:
        source: The file's path (opened as a regular file), or a seekable binary file object over
            its bytes (its position is kept).
        path: The file's name in messages (default: ``source`` when it is a path).
        max_total_bytes: The most bytes all entries may declare together (default: the file's size
            plus ``ARCHIVE_SLACK_BYTES``).

    Raises:
        UnsafeArchiveError: If an entry is compressed, declares more than the file's size plus
            ``ARCHIVE_SLACK_BYTES``, the entries declare more than ``max_total_bytes`` in all, or the
            central directory cannot be read.
        NotRegularFileError: If ``source`` is a path that is not a regular file.
    """
    if isinstance(source, str | os.PathLike):
        with open_regular(source) as handle:
            check_archive(handle, path if path is not None else os.fspath(source), max_total_bytes)
        return
    name = path if path is not None else str(getattr(source, "name", "<archive>"))
    start = source.tell()
    try:
        size = source.seek(0, os.SEEK_END)
        source.seek(0)
        if source.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            return
        reason = _archive_problem(source, size, max_total_bytes)
        if reason is not None:
            raise UnsafeArchiveError(name, reason)
    finally:
        source.seek(start)


def _archive_problem(source: BinaryIO, size: int, max_total_bytes: int | None) -> str | None:
    """What makes the zip archive ``source`` (of ``size`` bytes) unsafe to inflate (None: nothing)."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        return f"its zip central directory cannot be read ({str(err)[:200]})"
    total = 0
    for entry in entries:
        name = entry.filename[:200]
        if entry.compress_type != zipfile.ZIP_STORED:
            return f"its entry {name!r} is compressed (zip method {entry.compress_type})"
        if entry.file_size > size + ARCHIVE_SLACK_BYTES:
            return f"its entry {name!r} declares {entry.file_size} bytes, more than the file's {size}"
        total += entry.file_size
    limit = size + ARCHIVE_SLACK_BYTES if max_total_bytes is None else max_total_bytes
    if total > limit:
        return f"its {len(entries)} entries declare {total} bytes in all, more than the {limit} accepted"
    return None
