"""Read the tensors of one weights file (safetensors, or a torch pickle read with ``weights_only``).

The readers check what a file claims before trusting it: a safetensors header is validated against
the file, a pickle may hold tensors only, and a damaged file raises a ValueError naming it.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch

from accelerando.big_modeling.budgets import DeviceLike, check_device_visible
from accelerando.big_modeling.offload import SAFETENSORS_DTYPES, read_safetensors_header
from accelerando.big_modeling.tensors import to_torch_device
from accelerando.core.safe_files import UnsafeArchiveError, check_archive
from accelerando.core.settings.fields import quote_value

__all__ = ["check_map_devices", "device_resolver", "iter_checkpoint_file", "load_state_dict"]


def device_resolver(device_map: Mapping[str, DeviceLike] | None) -> Callable[[str], DeviceLike]:
    """Build ``resolve(name) -> device``: the device of the longest ``device_map`` entry covering a name.

    Without a map every name resolves to ``"cpu"``. The returned function raises ValueError for a
    name no entry covers.
    """
    cache: dict[str, DeviceLike] = {}

    def resolve(name: str) -> DeviceLike:
        if device_map is None:
            return "cpu"
        probe = name
        while probe not in device_map:
            if probe in cache:
                return cache[probe]
            if not probe:
                raise ValueError(
                    f"{name!r} is not covered by the device_map; add an entry for it or for a parent."
                )
            probe = probe.rpartition(".")[0]
        if probe != name:
            cache[name.rpartition(".")[0]] = device_map[probe]
        return device_map[probe]

    return resolve


@contextmanager
def _safetensors_errors(path: str) -> Iterator[None]:
    """Re-raise the safetensors library's errors on a damaged file as a ValueError naming the file."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        raise ValueError(
            f"{path} is not a valid safetensors file ({quote_value(str(err), 200)}). Fix: re-download or re-save "
            "the checkpoint (it is truncated, damaged or not a safetensors file)."
        ) from None


def _torch_load(path: str, mmap: bool = False) -> Mapping[str, torch.Tensor]:
    """``torch.load`` with ``weights_only=True`` (never anything else): a file holding other objects is
    refused with a message naming the file, what it holds and the fix.
    """
    try:
        check_archive(path)  # before torch.load inflates anything (a zip bomb is refused)
    except UnsafeArchiveError as err:
        raise ValueError(str(err)) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f"an object of type {found.group(1)}" if found else "objects other than tensors"
        raise ValueError(
            f"{path} holds {what}, which torch.load(weights_only=True) refuses: unpickling it could run code, "
            "and big-model loading never does. Fix: save the weights as safetensors (or as a plain dict of "
            "tensors); if you trust the file and the type is harmless, allow it first with "
            "torch.serialization.add_safe_globals([...])."
        ) from None
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a state dict (name -> tensor). Fix: pass a weights file."
        )
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"{path}: {quote_value(name, 80)} is a {type(tensor).__name__}, not a tensor. Fix: pass a weights "
                "file holding only tensors (a state dict)."
            )
    return state


def iter_checkpoint_file(
    path: str, device_for
) -> Iterator[tuple[str, torch.Tensor | None, tuple[str, dict] | None]]:
    """Yield ``(name, tensor, in_place)``; for names kept on disk in place the tensor is None and
    ``in_place`` is ``(safetensors path, header entry)``.
    """
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        header, _ = read_safetensors_header(path)
        with _safetensors_errors(path), safe_open(path, framework="pt", device="cpu") as handle:
            for name in header:
                if device_for(name) == "disk" and header[name]["dtype"] in SAFETENSORS_DTYPES:
                    yield name, None, (path, header[name])
                else:
                    yield name, handle.get_tensor(name), None
        return
    state = _torch_load(path, mmap=True)
    for name, tensor in state.items():
        # A memory-mapped tensor kept as a CPU parameter would alias the file: copy it out once.
        yield name, (tensor.clone() if device_for(name) == "cpu" else tensor), None


def load_state_dict(
    checkpoint_file: str | os.PathLike, device_map: Mapping[str, DeviceLike] | None = None
) -> dict[str, torch.Tensor]:
    """Load one weights file into a dict, placing each tensor on its device from ``device_map``.

    Args:
        checkpoint_file: a ``.safetensors`` or torch pickle (``.bin``) file.
        device_map: if given, each tensor goes to the device of its longest matching entry
            (tensors mapped to ``"disk"`` stay on CPU).

    Returns:
        The state dict.

    Raises:
        ValueError: a damaged file, a ``.bin`` holding anything but tensors (it is read with
            ``weights_only=True``), or a device this machine does not have.
    """
    path = str(checkpoint_file)
    check_map_devices(device_map)
    resolve = device_resolver(device_map)
    result: dict[str, torch.Tensor] = {}
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        # The header's claims are checked against the file before the library reads it.
        read_safetensors_header(path)
        with _safetensors_errors(path), safe_open(path, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                device = resolve(name)
                tensor = handle.get_tensor(name)
                result[name] = tensor if device in ("cpu", "disk") else tensor.to(to_torch_device(device))
        return result
    state = _torch_load(path)
    for name, tensor in state.items():
        device = resolve(name)
        result[name] = tensor if device in ("cpu", "disk") else tensor.to(to_torch_device(device))
    return result


def check_map_devices(device_map: Mapping[str, DeviceLike] | None) -> None:
    """Every device a map names must exist here: checked before a single file is read."""
    if isinstance(device_map, Mapping):
        for name, device in device_map.items():
            check_device_visible(device, f"device_map[{name!r}]")
