"""Helpers over nested batches (tensors inside dicts, lists, tuples, namedtuples).

A *leaf sequence* is a list or tuple of plain values (strings, numbers), such as the list of strings
that ``default_collate`` returns for a text field: it is sliced and concatenated along the batch like
a tensor. Any other list or tuple is a container and is walked into.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar, cast

import torch

from accelerando.common.operations import send_to_device

__all__ = [
    "batch_size_of",
    "concat_batches",
    "like_sample",
    "resolve_send_to_device",
    "slice_batch",
    "to_plain",
]

_CONTAINERS = (torch.Tensor, Mapping, list, tuple)
_T = TypeVar("_T")


def _is_leaf_sequence(obj: object) -> bool:
    return isinstance(obj, (list, tuple)) and not any(isinstance(item, _CONTAINERS) for item in obj)


def _constructor(obj: _T) -> Callable[..., _T]:
    """``type(obj)`` as a callable: a container's constructor is not part of its abstract interface."""
    return type(obj)


def _rebuild(template: _T, items: list[object]) -> _T:
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return _constructor(template)(*items)
    return _constructor(template)(items)


# Values torch.load(weights_only=True) rebuilds as they were (containers are walked separately).
_PLAIN_LEAVES = (torch.Tensor, str, bytes, int, float, complex, bool, type(None))


def to_plain(obj: object) -> object:
    """Return ``obj`` made of plain data only, so that ``torch.load(weights_only=True)`` reads it back.

    A ``dict``, ``list`` or ``tuple`` keeps its type; any other mapping (``UserDict``, a transformers
    ``BatchEncoding``, ``defaultdict``...) becomes a ``dict``, a dataclass instance the ``dict`` of its
    fields, a namedtuple or other tuple subclass a ``tuple`` and a list subclass a ``list``; their
    contents are converted the same way. Tensors, strings, numbers and None are kept. Any other object
    is kept as it is: a state holding one still needs the ``load_kwargs={"weights_only": False}``
    opt-in to be loaded.

    Args:
        obj: A sample or batch.

    Returns:
        The plain version (``obj`` itself when it is plain already).
    """
    import dataclasses

    if isinstance(obj, _PLAIN_LEAVES):
        return obj
    if isinstance(obj, Mapping):
        return {key: to_plain(value) for key, value in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {field.name: to_plain(getattr(obj, field.name)) for field in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return tuple(to_plain(item) for item in obj)
    if isinstance(obj, list):
        return [to_plain(item) for item in obj]
    return obj


def like_sample(plain: object, live: object) -> object:
    """Give ``plain`` (from :func:`to_plain`) the container type of ``live``, a sample of the stream.

    Only the outer container is rebuilt, and only with a type the running stream produced itself
    (nothing is imported or unpickled): a ``dict`` becomes ``live``'s mapping type, a ``tuple``
    ``live``'s namedtuple type. When that type cannot be built from the plain value, ``plain`` is
    returned unchanged.

    Args:
        plain: A plain sample (restored from a state dict).
        live: A sample read from the stream in this run.

    Returns:
        ``plain`` in ``live``'s container type, or ``plain`` itself.
    """
    kind = type(live)
    if kind is type(plain):
        return plain
    try:
        if type(plain) is dict and isinstance(live, Mapping):
            return _constructor(live)(plain)
        if type(plain) is tuple and isinstance(live, tuple) and hasattr(live, "_fields"):
            return getattr(kind, "_make")(plain)  # noqa: B009 - a namedtuple class's method, unknown to Tuple
    except Exception:  # a type whose constructor wants other arguments: keep the plain value
        return plain
    return plain


def batch_size_of(batch: object) -> int | None:
    """Return the batch dimension of the first tensor (or leaf sequence) found in ``batch``.

    Args:
        batch: A tensor or a nested structure of tensors.

    Returns:
        The size of the leading dimension, or None when the batch holds no tensor.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, Mapping):
        values: Iterable[object] = batch.values()
    elif isinstance(batch, (list, tuple)):
        if _is_leaf_sequence(batch):
            return len(batch)
        values = batch
    else:
        return None
    for value in values:
        found = batch_size_of(value)
        if found is not None:
            return found
    return None


def slice_batch(batch: _T, index: slice, process_index: int = 0, num_processes: int = 1) -> _T:
    """Take the rows ``index`` of every tensor and leaf sequence in ``batch``.

    Args:
        batch: The nested batch.
        index: The slice of the batch dimension to keep.
        process_index: Unused; present so the function can serve as ``slice_fn_for_dispatch``.
        num_processes: Unused; see ``process_index``.

    Returns:
        A batch of the same structure holding only the selected rows.
    """
    if isinstance(batch, torch.Tensor):
        # A tensor's rows are a tensor of the same type.
        return cast("_T", batch[index]) if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return _constructor(batch)({key: slice_batch(value, index) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        if _is_leaf_sequence(batch):
            return _rebuild(batch, list(batch[index]))
        return _rebuild(batch, [slice_batch(value, index) for value in batch])
    return batch


def concat_batches(batches: list[_T]) -> _T:
    """Concatenate batches of the same structure along the batch dimension.

    Args:
        batches: A non-empty list of batches with identical structure.

    Returns:
        One batch holding the rows of all of them, in order.
    """
    first = batches[0]
    if len(batches) == 1:
        return first
    # Every batch has the first one's structure (the documented contract), so each is read as a
    # container of the same kind as the first.
    if isinstance(first, torch.Tensor):
        return cast("_T", torch.cat(cast("list[torch.Tensor]", batches))) if first.dim() > 0 else first
    if isinstance(first, Mapping):
        maps = cast("Sequence[Mapping[object, object]]", batches)
        return _constructor(first)({key: concat_batches([b[key] for b in maps]) for key in first})
    if isinstance(first, (list, tuple)):
        rows = cast("Sequence[Sequence[object]]", batches)
        if _is_leaf_sequence(first):
            return _rebuild(first, [item for b in rows for item in b])
        return _rebuild(first, [concat_batches([b[i] for b in rows]) for i in range(len(first))])
    return first


def resolve_send_to_device() -> Callable[..., object]:
    """Return ``accelerando.common.operations.send_to_device``."""
    return send_to_device
