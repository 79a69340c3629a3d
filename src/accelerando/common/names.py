"""How objects are named and sizes written for people, and two small dictionary and attribute helpers."""

from __future__ import annotations

import functools
from collections.abc import Mapping, MutableMapping
from typing import TypeVar

__all__ = ["convert_bytes", "get_pretty_name", "merge_dicts", "recursive_getattr"]

_K = TypeVar("_K")


def merge_dicts(
    source: Mapping[_K, object], destination: MutableMapping[_K, object]
) -> MutableMapping[_K, object]:
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


def get_pretty_name(obj: object) -> str:
    """Return a readable name for a function, class or instance.

    Args:
        obj: anything.

    Returns:
        The qualified name of a function or class, the class's qualified name for an instance, or
        ``str(obj)`` when neither exists.
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attribute in ("__qualname__", "__name__"):
        if hasattr(obj, attribute):
            return getattr(obj, attribute)
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

    Example:
        >>> from accelerando.utils import convert_bytes
        >>> convert_bytes(1536)
        '1.5 KB'
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


def recursive_getattr(obj: object, attr: str) -> object:
    """Read a dotted attribute path: ``recursive_getattr(model, "encoder.layer.0")``.

    Args:
        obj: the object to start from.
        attr: attribute names separated by dots.

    Returns:
        The attribute at the end of the path.

    Raises:
        AttributeError: naming the first attribute of the path that does not exist.
    """
    return functools.reduce(getattr, attr.split("."), obj)
