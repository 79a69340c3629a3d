"""Weights kept outside the model: on CPU in a dict, or on disk as memory-mapped files.

Disk format: one raw little-endian file ``<name>.dat`` per tensor plus ``index.json`` mapping each
name to ``{"dtype", "shape"}``. An index entry may instead point into an existing safetensors file
(``{"safetensors_file", "weight_name", "dtype", "shape"}``): weights already on disk in that format
are used in place, never copied. Reads are zero-copy memory maps with private (copy-on-write)
pages, so an offloaded weight costs page cache, not process memory, until it is written.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TypeGuard

import torch

from accelerando.big_modeling.tensors import set_module_tensor_to_device
from accelerando.common.progress import progress
from accelerando.core.safe_files import NotRegularFileError, open_regular
from accelerando.core.settings.fields import quote_value

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "offload_state_dict",
    "offload_weight",
    "read_safetensors_header",
    "safetensors_view",
    "save_offload_index",
]

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype for dtype in SAFETENSORS_DTYPES.values()
}


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = _DTYPE_BY_NAME.get(name.removeprefix("torch."))
    if dtype is None:
        raise ValueError(
            f"Unsupported dtype {name!r} in an offload index; re-offload the weights with this version."
        )
    return dtype


# The safetensors library refuses headers over 100 MB; a larger claim is damage or a crafted file.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_DAMAGED_FIX = (
    "Fix: re-download or re-save the checkpoint (it is truncated, damaged or not a safetensors file)."
)


def _bad_safetensors(path: str | os.PathLike, problem: str) -> ValueError:
    return ValueError(f"{os.fspath(path)} is not a valid safetensors file: {problem}. {_DAMAGED_FIX}")


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, dict], int]:
    """Read the JSON header of a safetensors file without touching the tensor data.

    The header length and every entry's offsets are checked against the file's size before anything
    is read or mapped, so a damaged or crafted file is refused instead of exhausting memory.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        ``(entries, data_start)``: the header entries (name -> ``{"dtype", "shape", "data_offsets"}``,
        without ``"__metadata__"``) and the byte offset where the tensor data begins.

    Raises:
        ValueError: if the file is not a valid safetensors file (the message names it).
    """
    try:
        handle = open_regular(path)  # a FIFO or a device would hang the read
    except NotRegularFileError as err:
        raise _bad_safetensors(path, f"it is {err.what}, not a regular file") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        raw = handle.read(8)
        if len(raw) != 8:
            raise _bad_safetensors(path, f"it is {size} bytes long, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", raw)
        if length > size - 8 or length > _MAX_HEADER_BYTES:
            raise _bad_safetensors(
                path,
                f"its header claims {length} bytes but the file holds {size - 8} after the length field "
                f"(at most {_MAX_HEADER_BYTES} allowed)",
            )
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise _bad_safetensors(path, "its header is not readable JSON") from error
    if not isinstance(header, dict):
        raise _bad_safetensors(path, f"its header is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        _check_entry(path, name, entry, size - 8 - length)
    return header, 8 + length


def _naturals(value: object) -> TypeGuard[list[int]]:
    """Whether ``value`` is a list of non-negative ints (bools excluded)."""
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    )


def _check_entry(path: str | os.PathLike, name: str, entry: object, data_size: int) -> None:
    """One header entry: a known layout whose bytes lie inside the file (and match its shape)."""
    shape = entry.get("shape") if isinstance(entry, dict) else None
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if (
        not isinstance(entry, dict)
        or not _naturals(shape)
        or not _naturals(offsets)
        or len(offsets) != 2
        or not isinstance(entry.get("dtype"), str)
    ):
        raise _bad_safetensors(path, f"the header entry of {quote_value(name, 80)} is malformed")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise _bad_safetensors(
            path, f"{quote_value(name, 80)} lies at bytes {begin}..{end}, outside the {data_size} data bytes"
        )
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    numel = 1
    for dim in shape:
        numel *= dim
    if dtype is not None and numel * dtype.itemsize != end - begin:
        raise _bad_safetensors(
            path,
            f"{quote_value(name, 80)} has shape {shape} of {entry['dtype']} but {end - begin} bytes of data",
        )


@lru_cache(maxsize=64)
def _mapped_file(path: str) -> tuple[mmap.mmap, dict[str, dict], int]:
    header, start = read_safetensors_header(path)
    with open(path, "rb") as handle:
        # ACCESS_COPY: pages are private, so a tensor view is writable without ever changing the file.
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    return mapped, header, start


def _view(buffer: mmap.mmap, offset: int, nbytes: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
    if offset % dtype.itemsize:  # misaligned data can not be reinterpreted in place
        raw = raw.clone()
    return raw.view(dtype).reshape(shape)


def safetensors_view(path: str | os.PathLike, name: str) -> torch.Tensor:
    """Return one tensor of a safetensors file as a zero-copy, copy-on-write memory map.

    Args:
        path: the ``.safetensors`` file.
        name: the tensor's name in the file.

    Returns:
        A CPU tensor backed by the file's pages (read lazily by the OS).

    Raises:
        KeyError: if the file has no tensor of that name.
        ValueError: if the file is not a valid safetensors file, or the tensor's dtype is not supported.
    """
    mapped, header, start = _mapped_file(str(Path(path).resolve()))
    if name not in header:
        raise KeyError(f"{os.fspath(path)} holds no tensor named {name!r}.")
    entry = header[name]
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise ValueError(
            f"{os.fspath(path)}: {name!r} is stored as {entry['dtype']!r}, a dtype that can not be memory-mapped "
            f"here (supported: {', '.join(SAFETENSORS_DTYPES)}). Fix: convert the checkpoint's tensors to one of them."
        )
    begin, end = entry["data_offsets"]
    return _view(mapped, start + begin, end - begin, dtype, entry["shape"])


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike, index: dict | None = None
) -> dict:
    """Write one tensor to ``<offload_folder>/<weight_name>.dat`` and record it in ``index``.

    Args:
        weight: the tensor (any device; it is copied to CPU to be written).
        weight_name: its name in the model's state dict.
        offload_folder: the folder (created if needed).
        index: the index to update; a new one is started when None.

    Returns:
        The updated index (name -> ``{"dtype", "shape"}``).
    """
    index = {} if index is None else index
    os.makedirs(offload_folder, exist_ok=True)
    tensor = weight.detach().to("cpu").contiguous()
    index[weight_name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
    with open(os.path.join(offload_folder, f"{weight_name}.dat"), "wb") as handle:
        if tensor.numel():
            # numpy's stubs declare the buffer protocol (__buffer__) only for Python 3.12 and later.
            handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))  # pyright: ignore[reportArgumentType]
    return index


def load_offloaded_weight(weight_file: str | os.PathLike, weight_info: dict) -> torch.Tensor:
    """Map one offloaded tensor from disk (zero-copy, copy-on-write).

    Args:
        weight_file: the ``.dat`` file written by :func:`offload_weight`.
        weight_info: its index entry (``{"dtype", "shape"}``).

    Returns:
        A CPU tensor backed by the file.
    """
    dtype = _dtype_from_name(weight_info["dtype"])
    shape = list(weight_info["shape"])
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    # torch maps the file privately and closes the descriptor: no file handle is held per weight.
    flat = torch.from_file(str(weight_file), shared=False, size=numel * dtype.itemsize, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def save_offload_index(index: dict, offload_folder: str | os.PathLike) -> None:
    """Write (merging with any existing) ``index.json`` in an offload folder.

    Args:
        index: entries to add or replace.
        offload_folder: the folder.
    """
    if not index:
        return
    os.makedirs(offload_folder, exist_ok=True)
    path = os.path.join(offload_folder, "index.json")
    current = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            current = json.load(handle)
    current.update(index)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=2)


def offload_state_dict(save_dir: str | os.PathLike, state_dict: Mapping[str, torch.Tensor]) -> dict:
    """Write a whole state dict to an offload folder (one ``.dat`` file per tensor + ``index.json``).

    Args:
        save_dir: the folder.
        state_dict: the tensors.

    Returns:
        The index that was written.
    """
    index: dict = {}

    for name, tensor in progress(
        state_dict.items(), desc="Offloading weights to disk", total=len(state_dict)
    ):
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)
    return index


def load_offloaded_weights(model: torch.nn.Module, index: dict, offload_folder: str | os.PathLike) -> None:
    """Load every tensor listed in an offload index back into a model, on CPU.

    Args:
        model: the model.
        index: the offload index.
        offload_folder: where the ``.dat`` files are.
    """
    loader = OffloadedWeightsLoader(save_folder=offload_folder, index=index)
    for name in index:
        set_module_tensor_to_device(model, name, "cpu", value=loader[name].clone())


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping over weights held in a CPU state dict and/or an offload folder on disk.

    Reading a disk weight maps its file (or its slice of a safetensors file); nothing is read until
    the tensor's pages are used.

    Args:
        state_dict: weights kept in memory (looked up first).
        save_folder: an offload folder with an ``index.json``.
        index: the index (read from ``save_folder`` when None).
        device: if given, weights are moved there when read.

    Raises:
        ValueError: if neither weights nor a folder/index are given.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike | None = None,
        index: Mapping[str, dict] | None = None,
        device: int | str | torch.device | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("Give OffloadedWeightsLoader a state_dict, a save_folder or an index.")
        self.state_dict = dict(state_dict or {})
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            index_file = os.path.join(save_folder, "index.json")
            if os.path.isfile(index_file):
                with open(index_file, encoding="utf-8") as handle:
                    index = json.load(handle)
        self.index = dict(index or {})
        self.all_keys = list(self.state_dict)
        self.all_keys.extend(key for key in self.index if key not in self.state_dict)
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if "safetensors_file" in info:
            tensor = safetensors_view(info["safetensors_file"], info.get("weight_name", key))
            if "dtype" in info and str(tensor.dtype).removeprefix("torch.") != info["dtype"]:
                tensor = tensor.to(_dtype_from_name(info["dtype"]))
        else:
            if self.save_folder is None:
                raise KeyError(f"{key} is offloaded to disk but the loader has no save_folder.")
            tensor = load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), info)
        return tensor if self.device is None else tensor.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)

    def __contains__(self, key: object) -> bool:
        return key in self.state_dict or key in self.index


class PrefixedDataset(Mapping):
    """A view of a weights mapping restricted to the keys under one prefix, read without the prefix.

    Args:
        dataset: the underlying mapping (a dict or an :class:`OffloadedWeightsLoader`).
        prefix: e.g. ``"encoder.layer.0."``.
    """

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self) -> Iterator[str]:
        size = len(self.prefix)
        return iter([key[size:] for key in self.dataset if key.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for key in self.dataset if key.startswith(self.prefix))


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """Keep the entries of a state dict that belong to some of the submodules.

    Args:
        state_dict: full tensor names -> tensors.
        submodule_names: module names (``"encoder.layer.0"``); an entry is kept when its name is one
            of them or lies under one (``"encoder.layer.0.weight"``, not ``"encoder.layer.01.weight"``).

    Returns:
        A new dict with the kept entries, full names unchanged, in ``state_dict``'s order.
    """
    prefixes = tuple(f"{name}." for name in submodule_names if name)
    exact = set(submodule_names)
    if "" in exact:
        return dict(state_dict)
    return {key: value for key, value in state_dict.items() if key in exact or key.startswith(prefixes)}
