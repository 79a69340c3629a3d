"""Small general helpers: unwrapping prepared models, merging dicts, naming objects, sizes in words."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from accelerando.utils.unwrap import is_compiled_module, unwrap_model

__all__ = [
    "convert_bytes",
    "extract_model_from_parallel",
    "get_pretty_name",
    "is_compiled_module",
    "merge_dicts",
]


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Return the user's model from inside the wrappers ``prepare`` added.

    Removes ``DistributedDataParallel``, ``DataParallel``, FSDP and DeepSpeed engine wrappers (in
    any nesting with ``torch.compile``). The wrappers themselves are not modified. The one
    implementation is :func:`accelerando.utils.unwrap.unwrap_model`, which every strategy's
    ``unwrap_model`` uses too.

    Args:
        model: the prepared model.
        keep_fp32_wrapper: keep the mixed-precision forward wrapper (autocast and fp32 outputs). With
            False, the model's original ``forward`` is put back (this modifies the model).
        keep_torch_compile: when the model was compiled, return a compiled module around the
            unwrapped model rather than the plain module.
        recursive: also replace compiled submodules by their original modules (modifies the model).

    Returns:
        The unwrapped model.

    Raises:
        TypeError: if ``model`` is not a ``torch.nn.Module``.
    """
    return unwrap_model(
        model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile, recursive=recursive
    )


def merge_dicts(source: Mapping[Any, Any], destination: MutableMapping[Any, Any]) -> MutableMapping[Any, Any]:
    """Recursively merge ``source`` into ``destination`` (in place); values of ``source`` win.

    Nested mappings present on both sides are merged key by key rather than replaced.

    Args:
        source: the dict whose values are copied in.
        destination: the dict updated in place.

    Returns:
        ``destination``, updated.

    Raises:
        TypeError: if either argument is not a mapping.
    """
    if not isinstance(source, Mapping) or not isinstance(destination, MutableMapping):
        raise TypeError(
            f"merge_dicts(source, destination) needs two dicts, got {type(source).__name__} and "
            f"{type(destination).__name__}."
        )
    for key, value in source.items():
        existing = destination.get(key)
        if isinstance(value, Mapping) and isinstance(existing, MutableMapping):
            merge_dicts(value, existing)
        elif isinstance(value, Mapping):
            destination[key] = merge_dicts(value, {})
        else:
            destination[key] = value
    return destination


def get_pretty_name(obj: Any) -> str:
    """Return a readable name for a function, class or instance.

    Args:
        obj: anything.

    Returns:
        The qualified name of a function or class, the class's qualified name for an instance, or
        ``str(obj)`` when neither exists.
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    if hasattr(obj, "__qualname__"):
        return obj.__qualname__
    if hasattr(obj, "__name__"):
        return obj.__name__
    return str(obj)


_UNITS = ("bytes", "KB", "MB", "GB", "TB")


def convert_bytes(size: float) -> str:
    """Write a number of bytes in the largest binary unit that keeps it at 1 or more.

    Units step by 1024 (``KB`` = 1024 bytes), values are rounded to two decimals:
    ``convert_bytes(1536)`` is ``"1.5 KB"``, ``convert_bytes(3 * 2**30)`` is ``"3.0 GB"``.

    Args:
        size: a number of bytes (not negative).

    Returns:
        The size with its unit, from ``bytes`` up to ``PB``.

    Raises:
        ValueError: if ``size`` is negative.
        TypeError: if ``size`` is not a number.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise TypeError(f"convert_bytes takes a number of bytes, got {type(size).__name__}.")
    if size < 0:
        raise ValueError(f"convert_bytes takes a non-negative number of bytes, got {size}.")
    value: float = size
    for unit in _UNITS:
        if value < 1024.0:
            return f"{round(value, 2)} {unit}"
        value /= 1024.0
    return f"{round(value, 2)} PB"
