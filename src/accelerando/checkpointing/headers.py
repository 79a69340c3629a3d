"""Header checks of checkpoint files: a safetensors JSON header, or a ``torch.save`` zip archive.

Shared by the loader of weights (:mod:`~accelerando.checkpointing.files`) and the recogniser of the
reference's folders (:mod:`~accelerando.checkpointing.foreign`); it imports neither.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable

from accelerando.checkpointing.manifest import CheckpointError
from accelerando.core.safe_files import open_regular

__all__ = ["check_buffer_header", "check_file_header"]

_ZIP_MAGIC = b"PK\x03\x04"
# A safetensors header above this is not a real one (the format's own reader limit is 100 MB).
_MAX_SAFETENSORS_HEADER = 100_000_000
_FIX = "Load another checkpoint (or save this one again)."


def _check_bytes(path: str, name: str, size: int, head: bytes, read: Callable[[int], bytes]) -> int:
    """Check a file's first bytes ``head`` (at most 8) as its name says; ``read(n)`` gives the next ``n``.

    Returns:
        For a safetensors file the length of its JSON header, else 0.
    """
    if name.endswith(".safetensors"):
        if len(head) < 8:
            raise CheckpointError(
                f"The checkpoint is damaged: {path!r} is too short to be a safetensors file. {_FIX}"
            )
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_SAFETENSORS_HEADER:
            raise CheckpointError(
                f"The checkpoint is damaged: {path!r} has a safetensors header length ({length}) above the "
                f"format's limit ({_MAX_SAFETENSORS_HEADER}): header too large. {_FIX}"
            )
        if length > size - 8:
            raise CheckpointError(
                f"The checkpoint is damaged: {path!r} has a safetensors header length ({length}) beyond "
                f"its size. {_FIX}"
            )
        try:
            json.loads(read(length))
        except ValueError:
            raise CheckpointError(
                f"The checkpoint is damaged: {path!r} has an unreadable safetensors header. {_FIX}"
            ) from None
        return length
    if not head.startswith(_ZIP_MAGIC):
        raise CheckpointError(
            f"The checkpoint is damaged or was not written by save_state: {path!r} is not a torch.save "
            f"archive (no zip header). {_FIX}"
        )
    return 0


def _check_header(path: str, name: str, size: int = 0) -> None:
    del size  # the open file's own size is used (the folder scan's may be stale)
    try:
        handle = open_regular(path, follow=False)
    except OSError as err:  # a link, a special file, or gone since the folder was scanned
        raise CheckpointError(f"The checkpoint is damaged: {path!r} cannot be read ({err}). {_FIX}") from None
    with handle:
        _check_bytes(path, name, os.fstat(handle.fileno()).st_size, handle.read(8), handle.read)


def check_file_header(path: str) -> None:
    """Check one checkpoint file's header as its name says (safetensors JSON header, or a torch zip).

    The file must be a regular file (not a link, FIFO or device) and is read only as far as its
    header (at most ``_MAX_SAFETENSORS_HEADER`` bytes).

    Raises:
        CheckpointError: Naming the file, when it is not a regular file or its header is wrong
            (e.g. a safetensors header length of 2**62: "header too large").
    """
    _check_header(path, os.path.basename(path))


def check_buffer_header(path: str, data: bytes | memoryview) -> int:
    """:func:`check_file_header` of the file ``path`` whose bytes were already read into ``data``.

    Returns:
        For a safetensors file the length of its JSON header (which follows the first 8 bytes), else 0.

    Raises:
        CheckpointError: As :func:`check_file_header`, with the same messages.
    """
    view = memoryview(data)
    return _check_bytes(
        path, os.path.basename(path), len(view), bytes(view[:8]), lambda n: bytes(view[8 : 8 + n])
    )
