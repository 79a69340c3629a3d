"""One way to find the user's module inside whatever ``prepare`` wrapped it in.

Every strategy's ``unwrap_model`` and the public ``accelerando.utils.extract_model_from_parallel``
go through :func:`unwrap_model` here. Wrappers are recognised by class name, so checking for a
DeepSpeed engine or an FSDP1 wrapper never imports deepspeed or ``torch.distributed.fsdp``.

What is removed, from the outside in (in any nesting):
- ``torch.compile``'s ``OptimizedModule`` (``._orig_mod``), kept or rebuilt with ``keep_torch_compile``;
- wrappers holding the model in ``.module``: DDP, DataParallel, FSDP1, DeepSpeed engines;
- with ``keep_fp32_wrapper=False``, the precision plugin's forward wrapper (autocast / fp32 outputs).
FSDP2 models are their own module (``fully_shard`` changes the class in place): nothing to remove.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeGuard

import torch

if TYPE_CHECKING:
    # torch 2.13: torch/_dynamo/eval_frame.py:430 (private; annotations only)
    from torch._dynamo.eval_frame import OptimizedModule

__all__ = ["MODULE_WRAPPER_NAMES", "is_compiled_module", "unwrap_model"]

# Wrappers that hold the user's model in `.module`, matched by class name along the MRO.
MODULE_WRAPPER_NAMES = frozenset(
    {
        "DistributedDataParallel",
        "DataParallel",
        "DeepSpeedEngine",
        "PipelineEngine",
        "FullyShardedDataParallel",
        "PipelineModel",  # accelerando.backends.strategies.pipeline: every stage shares the user's module
    }
)


def is_compiled_module(module: object) -> TypeGuard[OptimizedModule]:
    """Tell whether ``module`` is the wrapper ``torch.compile`` returns for a module.

    Args:
        module: anything.

    Returns:
        True for ``torch._dynamo``'s ``OptimizedModule`` (checked without importing dynamo).
    """
    # torch 2.13: torch/_dynamo/eval_frame.py:459 (private; OptimizedModule._orig_mod is the compiled module)
    return type(module).__name__ == "OptimizedModule" and isinstance(
        getattr(module, "_orig_mod", None), torch.nn.Module
    )


class _ModuleWrapper(Protocol):
    """A wrapper (DDP, FSDP, an engine...) holding the wrapped model in ``module``."""

    module: torch.nn.Module


def _is_module_wrapper(module: object) -> TypeGuard[_ModuleWrapper]:
    if not isinstance(getattr(module, "module", None), torch.nn.Module):
        return False
    return any(cls.__name__ in MODULE_WRAPPER_NAMES for cls in type(module).__mro__)


def _remove_autocast_forward(model: torch.nn.Module) -> None:
    # Contract with accelerando.backends.precision: when it wraps forward in autocast / fp32 conversion, it
    # stores the forward it replaced in `_accelerando_original_forward`.
    # The reference's name for the same record, `_original_forward`, is honoured too: code written for
    # it (and transformers) sets it before wrapping forward itself.
    original = model.__dict__.pop("_accelerando_original_forward", None)
    if original is None:
        original = model.__dict__.pop("_original_forward", None)
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


def _regions_original(module: torch.nn.Module) -> torch.nn.Module | None:
    # compile_regions (accelerando.common.compilation) returns a copy whose repeated blocks are compiled and
    # records the module it was given in the instance __dict__ (not as a registered submodule).
    original = module.__dict__.get("_orig_mod")
    return original if isinstance(original, torch.nn.Module) else None


def _unwrap_compiled_children(model: torch.nn.Module) -> None:
    for name, child in list(model.named_children()):
        if is_compiled_module(child):
            # torch 2.13: torch/_dynamo/eval_frame.py:459 (private; the compiled child's own module)
            setattr(model, name, child._orig_mod)
            child = child._orig_mod
        _unwrap_compiled_children(child)


def unwrap_model(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Return the user's model from inside the wrappers ``prepare`` added.

    The wrappers themselves are not modified; ``keep_fp32_wrapper=False`` and ``recursive=True``
    modify the returned model (that is what they are for).

    Args:
        model: the prepared model.
        keep_fp32_wrapper: keep the mixed-precision forward wrapper (autocast and fp32 outputs). With
            False, the model's original ``forward`` is put back.
        keep_torch_compile: when the model was compiled, return a compiled module around the
            unwrapped model rather than the plain module.
        recursive: also replace compiled submodules by their original modules.

    Returns:
        The unwrapped model.

    Raises:
        TypeError: if ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unwrapping a model needs a torch.nn.Module, got {type(model).__name__}.")
    outer_compiled = None
    while True:
        if is_compiled_module(model):
            outer_compiled = outer_compiled or model
            # torch 2.13: torch/_dynamo/eval_frame.py:459 (private; the module torch.compile wrapped)
            model = model._orig_mod
        elif _is_module_wrapper(model):
            model = model.module
        else:
            break
    if not keep_torch_compile and (regions_original := _regions_original(model)) is not None:
        model = regions_original
    if not keep_fp32_wrapper:
        _remove_autocast_forward(model)
    if recursive:
        _unwrap_compiled_children(model)
    if keep_torch_compile and outer_compiled is not None:
        # torch 2.13: torch/_dynamo/eval_frame.py:459 (private)
        if outer_compiled._orig_mod is model:
            return outer_compiled
        # A new compiled wrapper with the same dynamo settings; the user's compiled (DDP) model stays
        # intact for training.
        return type(outer_compiled)(model, outer_compiled.dynamo_ctx)
    return model
