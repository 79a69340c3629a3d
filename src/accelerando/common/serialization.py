"""Saving and loading objects: safetensors for flat tensor dicts, ``torch.save`` for everything else.

``save`` writes from one process only (the main process, or each node's local main process), so a
script can call it on every rank. ``load`` uses ``weights_only`` loading, which cannot run code
hidden in a pickle, unless the caller passes ``weights_only=False``; it never falls back by itself.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from collections.abc import Mapping
from typing import Any, overload

import torch

from accelerando.core.safe_files import check_archive
from accelerando.state import PartialState

__all__ = ["clean_state_dict_for_safetensors", "load", "refused_type", "save"]

logger = logging.getLogger(__name__)

_SAFETENSORS_SUFFIX = ".safetensors"


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int]:
    """Identify the memory a tensor lives in (device, storage pointer, storage size)."""
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr(), storage.nbytes())


@overload
def clean_state_dict_for_safetensors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


@overload
def clean_state_dict_for_safetensors(state_dict: Mapping[str, object]) -> dict[str, object]: ...


def clean_state_dict_for_safetensors(state_dict: Mapping[str, object]) -> Mapping[str, object]:
    """Make a state dict writable by safetensors.

    safetensors refuses tensors that share memory (tied weights such as an embedding and its output
    layer) and non-contiguous tensors. For each group of tensors sharing storage, the first name is
    kept and the others are dropped (loading with ``strict=False`` and re-tying restores them); every
    remaining tensor is made contiguous.

    Args:
        state_dict: Mapping of names to tensors (non-tensor values are kept as they are).

    Returns:
        A new plain ``dict`` that ``safetensors.torch.save_file`` accepts.

    Raises:
        TypeError: If ``state_dict`` is not a mapping.

    Example:
        >>> sd = clean_state_dict_for_safetensors(model.state_dict())
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"clean_state_dict_for_safetensors expects a mapping of names to tensors, got "
            f"{type(state_dict).__name__}; pass model.state_dict()."
        )
    first_name: dict[tuple[str, int, int], str] = {}
    dropped: list[str] = []
    cleaned: dict[str, object] = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            cleaned[name] = value
            continue
        # Zero-sized tensors all report a null pointer: they never really share memory.
        if value.numel() > 0 and value.device.type != "meta":
            key = _storage_key(value)
            if key in first_name:
                dropped.append(f"{name} (shares memory with {first_name[key]})")
                continue
            first_name[key] = name
        cleaned[name] = value if value.is_contiguous() else value.contiguous()
    if dropped:
        logger.warning(
            "Removed shared tensors before saving with safetensors: %s. Re-tie them after loading "
            "(load with strict=False, or call tie_weights()).",
            ", ".join(dropped),
        )
    return cleaned


def _should_write(save_on_each_node: bool) -> bool:
    """Whether this process is the one that writes shared files."""
    state = PartialState()
    return bool(state.is_local_main_process if save_on_each_node else state.is_main_process)


def save(
    obj: object,
    f: str | os.PathLike,
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """Save ``obj`` to ``f`` from one process only.

    Args:
        obj: What to save; with ``safe_serialization`` a mapping of names to tensors.
        f: Destination file path.
        save_on_each_node: Write on each node's local main process instead of only the global main
            process (for nodes without a shared file system).
        safe_serialization: Write safetensors (shared tensors removed, see
            :func:`clean_state_dict_for_safetensors`) instead of ``torch.save``.

    Raises:
        TypeError: If ``safe_serialization`` is set and ``obj`` is not a mapping of tensors.

    Example:
        >>> save(model.state_dict(), "weights.safetensors", safe_serialization=True)
    """
    if not _should_write(save_on_each_node):
        return
    if safe_serialization:
        from safetensors.torch import save_file

        save_file(_as_tensor_dict(obj), os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def _as_tensor_dict(obj: object) -> dict[str, torch.Tensor]:
    """Clean a mapping for safetensors and check every value is a tensor."""
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"safe_serialization=True needs a mapping of names to tensors, got {type(obj).__name__}; "
            "save other objects with safe_serialization=False."
        )
    cleaned = clean_state_dict_for_safetensors(obj)
    bad = [name for name, value in cleaned.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise TypeError(
            f"safe_serialization=True can only write tensors, but {bad[:5]} are not tensors; "
            "save this object with safe_serialization=False."
        )
    return {name: value.detach() for name, value in cleaned.items() if isinstance(value, torch.Tensor)}


# What a file holds is known only once read (the reference's contract too), and the keyword arguments
# are torch.load's own (weights_only, mmap, pickle_module, pickle's load arguments).
def load(f: str | os.PathLike, map_location: str | torch.device | None = None, **kwargs: Any) -> Any:
    """Load an object written by :func:`save` (or ``torch.save`` / safetensors).

    Files ending in ``.safetensors`` are read with safetensors; anything else with ``torch.load``,
    using ``weights_only=True`` unless the caller passes ``weights_only`` explicitly. A file that
    ``weights_only`` loading refuses is never retried with full unpickling.

    Args:
        f: Path of the file to read.
        map_location: Device to place tensors on (``None``: where they were saved; safetensors
            files default to ``"cpu"``).
        **kwargs: Passed to ``torch.load`` (``weights_only=False`` unpickles fully, which runs any
            code the file holds: only for files you trust).

    Returns:
        The loaded object.

    Raises:
        FileNotFoundError: If ``f`` does not exist.
        pickle.UnpicklingError: If ``weights_only`` loading refuses a type in the file (the message
            names the file, the type and ``weights_only=False``).
        UnsafeArchiveError: (an ``OSError``) If the file is a zip archive that would inflate beyond
            its size (a compressed entry, or entries declaring more bytes than the file holds).

    Example:
        >>> state_dict = load("weights.safetensors")
    """
    path = os.fspath(f)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Cannot load {path!r}: the file does not exist; check the path.")
    if path.endswith(_SAFETENSORS_SUFFIX):
        from safetensors.torch import load_file

        device = "cpu" if map_location is None else str(map_location)
        return load_file(path, device=device)
    kwargs.setdefault("weights_only", True)
    check_archive(path)  # before torch.load inflates anything: a zip bomb is refused
    try:
        return torch.load(path, map_location=map_location, **kwargs)
    except pickle.UnpicklingError as err:
        refused = refused_type(err) if kwargs["weights_only"] else None
        if refused is None:
            raise
        raise pickle.UnpicklingError(
            f"Refused to load {path!r}: it refers to {refused}, which weights_only loading does not allow "
            "(rebuilding it needs full unpickling, which can run code hidden in the file). If you trust "
            "the file, pass weights_only=False."
        ) from None


# How torch's weights_only unpickler names what it refused, in the messages of torch 2.4 to 2.13.
_REFUSALS = (
    re.compile(r"GLOBAL ([\w.]*\w)"),
    re.compile(r"but got <class '([^']+)'>"),
    re.compile(r"unrecognized function (.+?)(?: which belongs to|$)", re.MULTILINE),
)


def refused_type(error: BaseException) -> str | None:
    """The type or function named in a ``torch.load(weights_only=True)`` refusal, else None.

    Args:
        error: An ``UnpicklingError`` raised by ``torch.load``.

    Returns:
        E.g. ``"posix.system"`` or ``"mymodule.MyState"`` (at most 80 characters) when ``error`` is
        a refusal of a type; None when it is anything else (such as a damaged file).
    """
    text = str(error)
    if "Weights only load failed" not in text:
        return None
    for pattern in _REFUSALS:
        match = pattern.search(text)
        if match:
            found = match.group(1).strip()
            return found if len(found) <= 80 else found[:77] + "..."
    return None
