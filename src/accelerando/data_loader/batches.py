"""Helpers over nested batches (tensors inside dicts, lists, tuples, namedtuples).

A *leaf sequence* is a list or tuple of plain values (strings, numbers), such as the list of strings
that ``default_collate`` returns for a text field: it is sliced and concatenated along the batch like
a tensor. Any other list or tuple is a container and is walked into.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["batch_size_of", "concat_batches", "resolve_send_to_device", "slice_batch"]

_CONTAINERS = (torch.Tensor, Mapping, list, tuple)


def _is_leaf_sequence(obj: Any) -> bool:
    return isinstance(obj, (list, tuple)) and not any(isinstance(item, _CONTAINERS) for item in obj)


def _rebuild(template: Any, items: list[Any]) -> Any:
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*items)
    return type(template)(items)


def batch_size_of(batch: Any) -> int | None:
    """Return the batch dimension of the first tensor (or leaf sequence) found in ``batch``.

    Args:
        batch: A tensor or a nested structure of tensors.

    Returns:
        The size of the leading dimension, or None when the batch holds no tensor.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, Mapping):
        values: Any = batch.values()
    elif _is_leaf_sequence(batch):
        return len(batch)
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for value in values:
        found = batch_size_of(value)
        if found is not None:
            return found
    return None


def slice_batch(batch: Any, index: slice, process_index: int = 0, num_processes: int = 1) -> Any:
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
        return batch[index] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return type(batch)({key: slice_batch(value, index) for key, value in batch.items()})
    if _is_leaf_sequence(batch):
        return _rebuild(batch, list(batch[index]))
    if isinstance(batch, (list, tuple)):
        return _rebuild(batch, [slice_batch(value, index) for value in batch])
    return batch


def concat_batches(batches: list[Any]) -> Any:
    """Concatenate batches of the same structure along the batch dimension.

    Args:
        batches: A non-empty list of batches with identical structure.

    Returns:
        One batch holding the rows of all of them, in order.
    """
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.dim() > 0 else first
    if isinstance(first, Mapping):
        return type(first)({key: concat_batches([b[key] for b in batches]) for key in first})
    if _is_leaf_sequence(first):
        return _rebuild(first, [item for b in batches for item in b])
    if isinstance(first, (list, tuple)):
        return _rebuild(first, [concat_batches([b[i] for b in batches]) for i in range(len(first))])
    return first


def _fallback_send_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)({k: _fallback_send_to_device(v, device, non_blocking) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return _rebuild(batch, [_fallback_send_to_device(v, device, non_blocking) for v in batch])
    if hasattr(batch, "to") and callable(batch.to):
        try:
            return batch.to(device, non_blocking=non_blocking)
        except TypeError:
            return batch.to(device)
    return batch


def resolve_send_to_device() -> Callable[..., Any]:
    """Return ``accelerando.utils.operations.send_to_device``, or a local equivalent before it exists."""
    try:
        from accelerando.utils.operations import send_to_device
    except ImportError:
        return _fallback_send_to_device
    return send_to_device
