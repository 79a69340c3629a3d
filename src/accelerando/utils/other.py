"""Small general helpers: unwrapping prepared models, merging dicts, naming objects, sizes in words."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

__all__ = [
    "convert_bytes",
    "extract_model_from_parallel",
    "get_pretty_name",
    "is_compiled_module",
    "merge_dicts",
]

# Wrappers that hold the user's model in `.module`. Matched by class name so that checking for a
# DeepSpeed engine or an FSDP wrapper never imports deepspeed or torch.distributed.fsdp.
_MODULE_WRAPPER_NAMES = frozenset(
    {
        "DistributedDataParallel",
        "DataParallel",
        "DeepSpeedEngine",
        "PipelineEngine",
        "FullyShardedDataParallel",
    }
)


def is_compiled_module(module: Any) -> bool:
    """Tell whether ``module`` is the wrapper ``torch.compile`` returns for a module.

    Args:
        module: anything.

    Returns:
        True for ``torch._dynamo``'s ``OptimizedModule`` (checked without importing dynamo).
    """
    return type(module).__name__ == "OptimizedModule" and isinstance(
        getattr(module, "_orig_mod", None), torch.nn.Module
    )


def _is_module_wrapper(module: Any) -> bool:
    if not isinstance(getattr(module, "module", None), torch.nn.Module):
        return False
    return any(cls.__name__ in _MODULE_WRAPPER_NAMES for cls in type(module).__mro__)


def _remove_autocast_forward(model: torch.nn.Module) -> None:
    # Contract with accelerando.precision: when it wraps forward in autocast / fp32 conversion, it
    # stores the forward it replaced in `_accelerando_original_forward`.
    original = model.__dict__.pop("_accelerando_original_forward", None)
    if original is None:
        return
    if getattr(original, "__self__", None) is model and getattr(original, "__func__", None) is getattr(
        type(model), "forward", None
    ):
        # The replaced forward was the class's own method: dropping the instance attribute restores it
        # and keeps the model picklable.
        model.__dict__.pop("forward", None)
    else:
        model.forward = original


def _unwrap_compiled_children(model: torch.nn.Module) -> None:
    for name, child in list(model.named_children()):
        if is_compiled_module(child):
            setattr(model, name, child._orig_mod)
            child = child._orig_mod
        _unwrap_compiled_children(child)


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Return the user's model from inside the wrappers ``prepare`` added.

    Removes ``DistributedDataParallel``, ``DataParallel``, FSDP and DeepSpeed engine wrappers (in
    any nesting with ``torch.compile``). The wrappers themselves are not modified.

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
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"extract_model_from_parallel expects a torch.nn.Module, got {type(model).__name__}.")
    outer_compiled = None
    while True:
        if is_compiled_module(model):
            outer_compiled = outer_compiled or model
            model = model._orig_mod
        elif _is_module_wrapper(model):
            model = model.module
        else:
            break
    if not keep_fp32_wrapper:
        _remove_autocast_forward(model)
    if recursive:
        _unwrap_compiled_children(model)
    if keep_torch_compile and outer_compiled is not None:
        if outer_compiled._orig_mod is model:
            return outer_compiled
        # A new compiled wrapper with the same dynamo settings; the user's compiled (DDP) model stays
        # intact for training.
        return type(outer_compiled)(model, outer_compiled.dynamo_ctx)
    return model


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
