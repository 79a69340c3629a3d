"""The files of a checkpoint folder: their names, and how each kind of state is written and read.

Names follow the reference project so folders look familiar: ``model.safetensors`` (or
``pytorch_model.bin``), ``model_1.safetensors``, ``optimizer.bin``, ``scheduler.bin``,
``dl_state_dict.bin`` / ``sampler.bin``, ``scaler.pt``, ``random_states_<rank>.pkl``,
``custom_checkpoint_<i>.pkl``. Accumulated gradients of an unfinished accumulation cycle go in
``gradients_<rank>.safetensors`` (gradients differ per rank until they are all-reduced).

Every ``torch.save`` file is read back with ``torch.load(weights_only=True)``, which cannot run code
hidden in a pickle; what accelerando writes (tensors, numbers, strings, lists, tuples, dicts, the RNG
states as plain data) loads that way. A file holding other objects (a registered object whose state
holds arbitrary Python objects, or a malicious file) raises :class:`UnsafeCheckpointError`; only the
caller's explicit ``load_kwargs={"weights_only": False}`` unpickles it fully.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import pickle
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch

import accelerando.checkpointing.written as written
from accelerando.checkpointing.headers import check_buffer_header, check_file_header
from accelerando.checkpointing.manifest import CheckpointError
from accelerando.common.constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
)
from accelerando.common.environment import parse_flag_from_env
from accelerando.common.serialization import clean_state_dict_for_safetensors, refused_type
from accelerando.core.safe_files import NotRegularFileError, UnsafeArchiveError, check_archive, check_regular

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

__all__ = [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "SCHEDULER_NAME",
    "SAMPLER_NAME",
    "DATALOADER_STATE_NAME",
    "SCALER_NAME",
    "RNG_STATE_NAME",
    "CUSTOM_NAME",
    "GRADIENTS_NAME",
    "OPT_IN",
    "UnsafeCheckpointError",
    "bounded_archive",
    "indexed",
    "model_file",
    "torch_load",
    "torch_save",
    "unpickling",
    "weights_only_default",
]

logger = logging.getLogger(__name__)

DATALOADER_STATE_NAME = "dl_state_dict"
CUSTOM_NAME = "custom_checkpoint"
GRADIENTS_NAME = "gradients"


def indexed(stem: str, index: int, suffix: str) -> str:
    """``stem.suffix`` for the first object, ``stem_<index>.suffix`` for the others."""
    return f"{stem}{suffix}" if index == 0 else f"{stem}_{index}{suffix}"


def model_file(index: int, safe_serialization: bool) -> str:
    """File name of the ``index``-th model's weights."""
    if safe_serialization:
        return indexed(SAFE_MODEL_NAME, index, ".safetensors")
    return indexed(MODEL_NAME, index, ".bin")


def torch_save(obj: object, path: str) -> None:
    """``torch.save`` to ``path`` (durability is handled by the commit step).

    Inside a save's staging folder (:func:`accelerando.checkpointing.written.collecting`) the bytes are
    hashed as they are written, so the manifest's checksum needs no second read of the file.
    """
    if not written.is_collected(path):
        torch.save(obj, path)  # a path, not a Python file object: torch's C++ writer is faster
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        sink = written.HashingFile(fd)
        # torch's stub asks for IO[bytes]; torch.save only calls write() and flush() on a file object.
        torch.save(obj, sink)  # pyright: ignore[reportArgumentType]
        sink.flush()
        written.record(path, sink.digest.entry(), os.fstat(fd))
    finally:
        os.close(fd)


# Weights up to this many bytes are serialized in memory and written with one write (and hashed from
# that buffer); bigger ones are written by safetensors from the tensors' memory (no copy).
SMALL_FILE_BYTES = 1 << 20

# Files at least this big are read through a memory map when the caller copies their tensors
# elsewhere anyway (see state_io.load_optimizer_state): no fresh allocation, no second copy.
MAPPED_LOAD_MIN_BYTES = 16 * 2**20

# Whether torch_load may fully unpickle (run code from) a file: False unless the caller of the load
# opted in with load_kwargs={"weights_only": False}; a context variable so that strategy loaders
# called in between (the FSDP optimizer loader) follow the same choice without a parameter.
_WEIGHTS_ONLY: ContextVar[bool] = ContextVar("accelerando_weights_only", default=True)

# Further torch.load options of the caller of the load (the reference's load_kwargs besides
# weights_only: mmap, encoding, ...); set with unpickling(), read by every torch_load in between.
_LOAD_OPTIONS: ContextVar[dict[str, object] | None] = ContextVar("accelerando_load_options", default=None)

OPT_IN = "load_kwargs={'weights_only': False}"


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds objects that only full unpickling can rebuild, which could run code.

    Attributes:
        path: The file.
        refused: The type or function ``torch.load(weights_only=True)`` refused (as torch names it).
    """

    def __init__(self, path: str, refused: str, hint: str = "") -> None:
        self.path, self.refused, self.hint = path, refused, hint
        super().__init__(
            f"Refused to load {path!r}: it holds {refused}, which only full unpickling can rebuild, and "
            f"unpickling can run code hidden in the file. Checkpoint files are read with "
            f"weights_only=True.{hint} If you trust this checkpoint, pass {OPT_IN} to load_state "
            "(or load_accelerator_state / load_custom_state)."
        )

    def __reduce__(self) -> tuple[Callable[..., UnsafeCheckpointError], tuple[object, ...]]:
        # Picklable with its message: torch.distributed.checkpoint sends a rank's error to the others.
        return (_rebuild_unsafe, (type(self), self.path, self.refused, self.hint, self.args))


def _rebuild_unsafe(
    cls: type[UnsafeCheckpointError], path: str, refused: str, hint: str, args: tuple[object, ...]
) -> UnsafeCheckpointError:
    error = cls(path, refused, hint)
    error.args = args  # a message a caller reworded (merge_fsdp_weights) stays as it was
    return error


def weights_only_default() -> bool:
    """The ``weights_only`` that loads use now: True unless inside :func:`unpickling` ``(False)``."""
    return _WEIGHTS_ONLY.get()


@contextmanager
def unpickling(weights_only: bool, options: Mapping[str, object] | None = None) -> Iterator[None]:
    """Within the block, :func:`torch_load` calls without ``weights_only`` use this value.

    Only a caller's explicit opt-in (``load_kwargs={"weights_only": False}``) should pass False.
    ``options`` are further ``torch.load`` keyword arguments for every file read in the block
    (``mmap`` decides memory mapping for every file; the others are passed as given).
    """
    token = _WEIGHTS_ONLY.set(bool(weights_only))
    options_token = _LOAD_OPTIONS.set(dict(options) if options else None)
    try:
        yield
    finally:
        _LOAD_OPTIONS.reset(options_token)
        _WEIGHTS_ONLY.reset(token)


# Returns Any: whatever the file holds, as torch.load returns it.
def torch_load(
    path: str,
    map_location: MAP_LOCATION = None,
    mapped: bool = False,
    weights_only: bool | None = None,
    data: memoryview | None = None,
) -> Any:
    """``torch.load`` with ``weights_only=True`` (never falling back to full unpickling by itself).

    Args:
        mapped: For a file of at least ``MAPPED_LOAD_MIN_BYTES``, return tensors backed by a private,
            read-only-on-disk memory map of the file (``torch.load(mmap=True)``) instead of fresh
            memory. The caller must copy or clone them before the file may go away.
        weights_only: False to unpickle fully (runs whatever code the file holds: only for files the
            user trusts and opted in for). None: True, unless inside :func:`unpickling` ``(False)``.
        data: The file's bytes, already read once (and verified) by
            :func:`accelerando.checkpointing.sources.read_once`: they are deserialized instead of the
            file being read again. A writable view of a private memory map is deserialized in place
            (``mapped``: the tensors are views of it), anything else is copied out.

    Raises:
        UnsafeCheckpointError: If the file holds a type ``weights_only`` loading refuses (the message
            names the file, the type and the opt-in).
        CheckpointError: If ``path`` is not a regular file (a FIFO, a device such as ``/dev/zero`` or a
            folder would hang or fail the reader), or is an archive that would inflate beyond its size
            (a compressed entry, or entries declaring more bytes than the file holds: a zip bomb).
    """
    weights_only = _WEIGHTS_ONLY.get() if weights_only is None else bool(weights_only)
    extra = dict(_LOAD_OPTIONS.get() or {})
    if data is not None:
        bounded_archive(_BufferReader(data), path)  # the bytes deserialized below
        in_place = bool(extra.pop("mmap", mapped and len(data) >= MAPPED_LOAD_MIN_BYTES))
        return _load_buffer(path, data, map_location, in_place, weights_only, extra)
    try:
        check_regular(path)
    except NotRegularFileError as err:
        raise CheckpointError(f"Cannot load {err}; the checkpoint is damaged.") from None
    bounded_archive(path, path)
    if "mmap" in extra:  # the caller's explicit choice, for every file (torch refuses legacy files)
        return _load(path, map_location, bool(extra.pop("mmap")), weights_only, extra)
    # Legacy (non-zip) torch.save files cannot be memory-mapped.
    if mapped and os.path.getsize(path) >= MAPPED_LOAD_MIN_BYTES and zipfile.is_zipfile(path):
        try:
            return _load(path, map_location, True, weights_only, extra)
        except CheckpointError:
            raise
        except (OSError, RuntimeError, ValueError) as err:  # e.g. a file system that cannot map files
            logger.debug("memory-mapped load of %s failed (%s); reading it instead", path, err)
    return _load(path, map_location, False, weights_only, extra)


def bounded_archive(source: str | io.RawIOBase, path: str) -> None:
    """Refuse the ``torch.save`` archive ``source`` (a path, or a reader over its bytes) before
    ``torch.load`` inflates anything in it, when it would inflate beyond its size (see
    :func:`accelerando.core.safe_files.check_archive`).

    Raises:
        CheckpointError: Naming the file and the entry (one line).
    """
    try:
        check_archive(source, path)  # pyright: ignore[reportArgumentType]
    except UnsafeArchiveError as err:
        raise CheckpointError(str(err)) from None


def _load(
    path: str, map_location: MAP_LOCATION, mmap: bool, weights_only: bool, extra: dict[str, object]
) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap, **extra)
    except pickle.UnpicklingError as err:
        refused = refused_type(err) if weights_only else None
        if refused is None:  # not a refusal: a damaged file (or a refusal with full unpickling asked)
            raise
        raise UnsafeCheckpointError(path, refused) from None


class _BufferReader(io.RawIOBase):
    """A read-only, seekable file over bytes in memory (what ``torch.load`` reads a file object with)."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
        with memoryview(buffer) as target, target.cast("B") as out:
            count = max(0, min(len(out), len(self._view) - self._pos))
            out[:count] = self._view[self._pos : self._pos + count]
        self._pos += count
        return count


def _in_place_loader() -> Callable[..., object] | None:
    """The archive loader of torch that takes the archive's bytes as one storage (as ``torch.load(mmap=True)``
    uses it), or None where this torch lacks it or an environment variable overrides ``weights_only``.
    """
    import inspect

    import torch.serialization as serialization

    # torch 2.13: torch/serialization.py:1976 (private; torch.load's archive reader, taking one storage)
    loader = getattr(serialization, "_load", None)
    if loader is None or "overall_storage" not in inspect.signature(loader).parameters:
        return None
    for name in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        try:
            if parse_flag_from_env(name):
                return None
        except ValueError:  # an unknown spelling: let the public torch.load decide what it means
            return None
    return loader


def _load_in_place(data: memoryview, map_location: MAP_LOCATION, weights_only: bool, encoding: str) -> object:
    """Deserialize a ``torch.save`` archive whose tensors become views of ``data`` (no copy), or return
    ``_NOT_IN_PLACE`` when this archive or this torch cannot be read so (then it is copied out).
    """
    import torch.serialization as serialization

    loader = _in_place_loader()
    reader = _BufferReader(data)
    if loader is None or not zipfile.is_zipfile(reader):
        return _NOT_IN_PLACE
    reader.seek(0)
    storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
    # torch's stub asks for IO[bytes]; its reader only calls seek, tell and readinto.
    # torch 2.13: torch/serialization.py:805, :2231 (private; open the archive as torch.load does)
    with serialization._open_zipfile_reader(reader) as archive:  # pyright: ignore[reportArgumentType]
        if serialization._is_torchscript_zip(archive):
            return _NOT_IN_PLACE
        if weights_only:
            # torch 2.13: torch/_weights_only_unpickler.py:1 (private; torch.load(weights_only=True)'s unpickler)
            from torch import _weights_only_unpickler

            return loader(
                archive, map_location, _weights_only_unpickler, overall_storage=storage, encoding=encoding
            )
        return loader(archive, map_location, pickle, overall_storage=storage, encoding=encoding)


_NOT_IN_PLACE = object()


def _load_buffer(
    path: str,
    data: memoryview,
    map_location: MAP_LOCATION,
    in_place: bool,
    weights_only: bool,
    extra: dict[str, object],
) -> object:
    """``torch.load`` of the bytes ``data`` of the file ``path`` (see :func:`torch_load`'s ``data``)."""
    try:
        encoding = extra.get("encoding", "utf-8")
        if in_place and set(extra) <= {"encoding"} and isinstance(encoding, str) and not data.readonly:
            try:
                loaded = _load_in_place(data, map_location, weights_only, encoding)
            except pickle.UnpicklingError:
                loaded = _NOT_IN_PLACE  # read again below through torch.load, for its own message
            if loaded is not _NOT_IN_PLACE:
                return loaded
        reader = _BufferReader(data)  # copied out by torch.load (a file object cannot be mapped)
        return torch.load(
            reader,  # pyright: ignore[reportArgumentType]
            map_location=map_location,
            weights_only=weights_only,
            mmap=False,
            **extra,
        )
    except pickle.UnpicklingError as err:
        refused = refused_type(err) if weights_only else None
        if refused is None:
            raise
        raise UnsafeCheckpointError(path, refused) from None


def save_model_weights(state_dict: Mapping[str, torch.Tensor], path: str, safe_serialization: bool) -> None:
    """Write one model's weights (safetensors or ``torch.save``)."""
    if safe_serialization:
        from safetensors.torch import save_file

        cleaned = clean_state_dict_for_safetensors(state_dict)
        tensors = {k: v.detach() for k, v in cleaned.items()}
        if sum(int(t.nbytes) for t in tensors.values()) <= SMALL_FILE_BYTES:
            from safetensors.torch import save

            # One buffer: one write, hashed from memory (save_file's bytes, without the file's set-up).
            written.write_bytes(path, save(tensors, metadata={"format": "pt"}))
            return
        save_file(tensors, path, metadata={"format": "pt"})
        if written.is_collected(path):
            written.record_safetensors(path, tensors)  # hashes the memory just written, not the file
    else:
        torch_save(state_dict, path)


def load_model_weights(
    path: str, map_location: MAP_LOCATION = None, data: memoryview | None = None
) -> dict[str, torch.Tensor]:
    """Read one model's weights written by :func:`save_model_weights` (``.bin``: see :func:`torch_load`).

    With ``data`` (the file's bytes, read once and verified), they are deserialized instead of the
    file: a safetensors file's tensors are views of them (no copy; ``load_state_dict`` copies them).

    Raises:
        CheckpointError: If a ``.safetensors`` file is not a regular file or is damaged (its header
            length too large, its header unreadable); the message names the file.
        UnsafeCheckpointError: See :func:`torch_load`.
    """
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if data is not None:
            return _safetensors_from_buffer(path, data, map_location)
        check_file_header(path)  # a regular file with a sane header, named in any refusal
        try:
            return load_file(path, device="cpu" if map_location is None else str(map_location))
        except SafetensorError as err:
            raise CheckpointError(
                f"{path!r} is not a readable safetensors file ({str(err)[:200]})."
            ) from None
    return torch_load(path, map_location=map_location if map_location is not None else "cpu", data=data)


# safetensors dtype names -> torch dtypes (those this torch has); other names go through safetensors itself.
_SAFETENSORS_DTYPES = {
    name: getattr(torch, attr)
    for name, attr in {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "I16": "int16",
        "U16": "uint16",
        "I32": "int32",
        "U32": "uint32",
        "I64": "int64",
        "U64": "uint64",
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
    }.items()
    if hasattr(torch, attr)
}


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("duplicate key in the header")
    return found


def _safetensors_entry(name: str, info: object) -> tuple[str, torch.dtype, list[int], int, int] | None:
    """``(name, dtype, shape, start, stop)`` of one header entry (None: a dtype left to safetensors).

    Raises:
        ValueError: If the entry is malformed or its size does not match its dtype and shape.
    """
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name[:80]!r} is not described by an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise ValueError(f"tensor {name[:80]!r} has no dtype")
    if dtype not in _SAFETENSORS_DTYPES:
        return None
    if not (
        isinstance(shape, list)
        and isinstance(offsets, list)
        and all(type(x) is int and x >= 0 for x in [*shape, *offsets])
        and len(offsets) == 2
        and offsets[0] <= offsets[1]
    ):
        raise ValueError(f"tensor {name[:80]!r} has an invalid shape or data_offsets")
    torch_dtype = _SAFETENSORS_DTYPES[dtype]
    if offsets[1] - offsets[0] != math.prod(shape) * torch_dtype.itemsize:
        raise ValueError(f"tensor {name[:80]!r} has data_offsets that do not match its shape")
    return name, torch_dtype, shape, offsets[0], offsets[1]


def _safetensors_layout(
    path: str, data: memoryview
) -> list[tuple[str, torch.dtype, list[int], int, int]] | None:
    """The tensors of a safetensors file's bytes as ``(name, dtype, shape, start, stop)``, checked as
    the safetensors reader checks them (every byte after the header belongs to exactly one tensor, in
    order, of the size its dtype and shape give); None for a dtype this reader leaves to safetensors.

    Raises:
        CheckpointError: If the header is damaged (the message names the file).
    """
    length = check_buffer_header(path, data)  # the same checks and messages as for a file
    header = json.loads(bytes(data[8 : 8 + length]), object_pairs_hook=_unique_keys)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise ValueError("__metadata__ is not an object of strings")
    layout = []
    for name, info in header.items():
        entry = _safetensors_entry(name, info)
        if entry is None:
            return None
        layout.append(entry)
    layout.sort(key=lambda item: (item[3], item[4]))
    position, body = 0, len(data) - 8 - length
    for name, _, _, start, stop in layout:
        if start != position:
            raise ValueError(f"tensor {name[:80]!r} does not start where the previous one ends")
        position = stop
    if position != body:
        raise ValueError("the tensors do not cover the data exactly")
    base = 8 + length
    return [(name, dtype, shape, base + start, base + stop) for name, dtype, shape, start, stop in layout]


def _safetensors_from_buffer(
    path: str, data: memoryview, map_location: MAP_LOCATION
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file from its bytes, as views of them where their offsets allow."""
    try:
        layout = _safetensors_layout(path, data)
    except ValueError as err:
        raise CheckpointError(f"{path!r} is not a readable safetensors file ({str(err)[:200]}).") from None
    if layout is None or sys.byteorder != "little":  # leave dtypes and byte orders to safetensors
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            tensors = load(bytes(data))
        except SafetensorError as err:
            raise CheckpointError(
                f"{path!r} is not a readable safetensors file ({str(err)[:200]})."
            ) from None
    else:
        view = data if not data.readonly else memoryview(bytearray(data))  # writable: torch may write
        tensors = {}
        for name, dtype, shape, start, stop in layout:
            if start == stop:
                tensors[name] = torch.empty(shape, dtype=dtype)
            elif start % dtype.itemsize:  # unaligned: copied out
                tensors[name] = torch.frombuffer(bytearray(view[start:stop]), dtype=dtype).reshape(shape)
            else:
                count = (stop - start) // dtype.itemsize
                tensors[name] = torch.frombuffer(view, dtype=dtype, count=count, offset=start).reshape(shape)
    if map_location is not None and str(map_location) != "cpu":
        tensors = {name: tensor.to(str(map_location)) for name, tensor in tensors.items()}
    return tensors


def find_model_file(folder: str, index: int) -> str:
    """Path of the ``index``-th model's weights in ``folder``, whichever format was used.

    Raises:
        FileNotFoundError: Naming both candidate files when neither exists.
    """
    safe = os.path.join(folder, model_file(index, True))
    if os.path.exists(safe):
        return safe
    unsafe = os.path.join(folder, model_file(index, False))
    if os.path.exists(unsafe):
        return unsafe
    raise FileNotFoundError(
        f"Checkpoint {folder!r} has no weights for model {index}: neither {os.path.basename(safe)!r} nor "
        f"{os.path.basename(unsafe)!r} exists. Pass the same models to load_state as to save_state."
    )
