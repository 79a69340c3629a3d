"""Attach hooks to a whole model: per module, per device-map block, for layerwise casting, and chain
the offloading hooks so each one prefetches the next.

These are the functions :mod:`accelerando.big_modeling.dispatch` builds placements from; the hooks
themselves live in :mod:`accelerando.big_modeling.hooks`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from torch import nn

from accelerando.big_modeling.hooks import (
    AlignDevicesHook,
    LayerwiseCastingHook,
    SequentialHook,
    add_hook_to_module,
)
from accelerando.big_modeling.offload import PrefixedDataset
from accelerando.big_modeling.sizes import named_module_tensors
from accelerando.big_modeling.tensors import set_module_tensor_to_device
from accelerando.common.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

__all__ = [
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "attach_layerwise_casting_hooks",
    "link_prefetch",
]


def _has_direct_tensors(module: nn.Module) -> bool:
    return bool(module._parameters) or bool(module._buffers)


def _prefixed(weights_map: Mapping | None, module_name: str) -> Mapping | None:
    if weights_map is None or not module_name:
        return weights_map
    return PrefixedDataset(weights_map, f"{module_name}.")


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Hook every submodule that owns tensors so that its inputs are moved to ``execution_device``.

    Args:
        module: the root module.
        execution_device: where the modules run.
        skip_keys: input dict keys left in place.
        preload_module_classes: class names whose submodules are not hooked separately.
        tied_params_map: shared tied-weights cache.
    """
    if not hasattr(module, "_hf_hook") and _has_direct_tensors(module):
        add_hook_to_module(
            module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        )
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Attach an :class:`AlignDevicesHook` to every submodule that owns tensors.

    A module whose class is in ``preload_module_classes`` gets one hook handling all its submodules'
    tensors (for modules whose forward reads a child's weights directly); its children get none.

    Args:
        module: the root module.
        execution_device: where the modules run.
        offload: offload the weights between forwards.
        weights_map: where offloaded weights are read (keys relative to the model root).
        offload_buffers: offload buffers too.
        module_name: the name of ``module`` inside the model (prefix of its keys in ``weights_map``).
        skip_keys: input/output dict keys left in place.
        preload_module_classes: class names loaded as one unit.
        tied_params_map: shared tied-weights cache.
    """
    preload = preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if _has_direct_tensors(module) or (offload and preload):
        hook = AlignDevicesHook(
            execution_device,
            offload=offload,
            weights_map=_prefixed(weights_map, module_name),
            offload_buffers=offload_buffers,
            place_submodules=preload,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if preload:
        return
    prefix = f"{module_name}." if module_name else ""
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child, execution_device, offload, weights_map, offload_buffers, prefix + child_name,
            skip_keys, preload_module_classes, tied_params_map,
        )  # fmt: skip


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: int | str | torch.device | Mapping[str, int | str | torch.device] | None = None,
    offload: bool | dict[str, bool] = False,
    weights_map: Mapping | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Attach hooks block by block from per-block execution devices and offload flags (a device map).

    A block that is not offloaded is moved to its device once and moves its inputs there at each
    call; an offloaded block gets offloading hooks on its submodules. The root always returns its
    outputs on the device its inputs came from.

    Args:
        module: the model (or a submodule, with ``module_name``).
        execution_device: one device, or block name -> device.
        offload: one flag, or block name -> whether that block's weights are offloaded.
        weights_map: offloaded weights (keys relative to the model root).
        offload_buffers: offload buffers too.
        module_name: the name of ``module`` inside the model.
        skip_keys: input/output dict keys left in place.
        preload_module_classes: class names loaded as one unit.
        tied_params_map: shared tied-weights cache.
    """
    if isinstance(execution_device, Mapping):
        devices = execution_device
        flags = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    elif isinstance(offload, Mapping):
        flags = offload
        devices = dict.fromkeys(flags, execution_device)
    else:
        if offload:
            attach_align_device_hook(
                module, execution_device, True, weights_map, offload_buffers, module_name,
                skip_keys, preload_module_classes, tied_params_map,
            )  # fmt: skip
        else:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device, io_same_device=True, place_submodules=True, skip_keys=skip_keys
                ),
            )
        return
    _attach_block(
        module,
        devices,
        flags,
        weights_map,
        offload_buffers,
        module_name,
        skip_keys,
        preload_module_classes,
        tied_params_map,
    )


def _attach_block(
    module, devices, offload, weights_map, offload_buffers, name, skip_keys, preload, tied
) -> None:
    is_root = name == ""
    # A name with a device but no offload entry is not a block (the reference's rule): dispatch_model
    # gives the root its main device this way, for the root hook below.
    if name in devices and name in offload and not offload[name]:
        hook = AlignDevicesHook(devices[name], offload_buffers=offload_buffers, io_same_device=is_root,
                                place_submodules=True, skip_keys=skip_keys, tied_params_map=tied)  # fmt: skip
        add_hook_to_module(module, hook)
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):  # containers have no forward of their own
            for child in module.children():
                add_hook_to_module(child, AlignDevicesHook(devices[name], skip_keys=skip_keys), append=True)
        return
    if name in devices and name in offload:
        attach_align_device_hook(
            module, devices[name], True, weights_map, offload_buffers, name, skip_keys, preload, tied
        )
        if not hasattr(module, "_hf_hook") or is_root:
            hook = AlignDevicesHook(devices[name], io_same_device=is_root, skip_keys=skip_keys)
            add_hook_to_module(module, hook, append=True)
        return
    if is_root:
        add_hook_to_module(
            module, AlignDevicesHook(devices.get(""), io_same_device=True, skip_keys=skip_keys)
        )
    prefix = f"{name}." if name else ""
    for child_name, child in module.named_children():
        _attach_block(
            child,
            devices,
            offload,
            weights_map,
            offload_buffers,
            prefix + child_name,
            skip_keys,
            preload,
            tied,
        )
    # Tensors owned directly by a split module have their own entries in the map.
    _attach_direct_tensors(module, devices, offload, weights_map, offload_buffers, prefix, skip_keys, tied)


def _attach_direct_tensors(
    module, devices, offload, weights_map, offload_buffers, prefix, skip_keys, tied
) -> None:
    own = [tensor_name for tensor_name, _ in named_module_tensors(module) if prefix + tensor_name in devices]
    if not own:
        return
    for tensor_name in own:
        key = prefix + tensor_name
        if not offload.get(key, False):
            set_module_tensor_to_device(module, tensor_name, devices[key])
    offloaded = [tensor_name for tensor_name in own if offload.get(prefix + tensor_name, False)]
    if offloaded:
        device = devices[prefix + offloaded[0]]
        hook = AlignDevicesHook(device, offload=True, weights_map=_prefixed(weights_map, prefix.rstrip(".")),
                                offload_buffers=offload_buffers, skip_keys=skip_keys, tied_params_map=tied)  # fmt: skip
        add_hook_to_module(module, hook, append=True)


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | list[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of every supported layer in ``storage_dtype`` and compute in ``compute_dtype``.

    The model is walked from ``module`` down. A module whose qualified name (the root's is ``""``)
    matches one of ``skip_modules_pattern`` (``re.search``), or that is an instance of
    ``skip_modules_classes``, is left alone together with everything under it. A layer of one of
    :data:`~accelerando.common.constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING` (linear and
    convolution layers) gets a :class:`LayerwiseCastingHook` (its parameters and buffers are stored in
    ``storage_dtype`` from now on) and its children are not visited; other modules, norms and
    embeddings included, keep their dtype.

    As in the reference, ``skip_modules_pattern`` is iterated: pass a list or tuple of expressions. A
    plain string is read character by character (each character one expression).

    Args:
        module: the model.
        storage_dtype: dtype between forwards (e.g. ``torch.float8_e4m3fn``).
        compute_dtype: dtype during each layer's forward (e.g. ``torch.bfloat16``).
        skip_modules_pattern: regular expressions; modules whose name matches one are left alone
            (use it for precision-sensitive layers).
        skip_modules_classes: module classes left alone.
        non_blocking: passed to the casts.

    Warns:
        UserWarning: ``skip_modules_pattern`` is a string of more than one character.

    Raises:
        TypeError: if a dtype is not a ``torch.dtype``.
    """
    import re

    if not isinstance(storage_dtype, torch.dtype) or not isinstance(compute_dtype, torch.dtype):
        raise TypeError(
            "storage_dtype and compute_dtype must be torch dtypes, e.g. torch.float8_e4m3fn and torch.bfloat16."
        )
    if isinstance(skip_modules_pattern, str) and len(skip_modules_pattern) > 1:
        warnings.warn(
            f"skip_modules_pattern={skip_modules_pattern!r} is a string: as in the reference, each of its "
            f"characters is used as one regular expression. Pass [{skip_modules_pattern!r}] to skip the "
            "modules matching the whole expression.",
            UserWarning,
            stacklevel=2,
        )
    patterns = [re.compile(pattern) for pattern in (skip_modules_pattern or ())]
    classes = tuple(skip_modules_classes or ())
    pending: list[tuple[str, nn.Module]] = [("", module)]
    while pending:
        name, sub = pending.pop()
        if any(p.search(name) for p in patterns) or (classes and isinstance(sub, classes)):
            continue
        if isinstance(sub, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(
                sub, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True
            )
            continue
        children = [(f"{name}.{child}" if name else child, mod) for child, mod in sub.named_children()]
        pending.extend(reversed(children))


def _hooks_in_order(model: nn.Module) -> list[AlignDevicesHook]:
    found: list[AlignDevicesHook] = []
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        for item in hook.hooks if isinstance(hook, SequentialHook) else [hook]:
            if isinstance(item, AlignDevicesHook) and item.offload and item.offloaded_names:
                found.append(item)
    return found


def link_prefetch(model: nn.Module) -> int:
    """Chain the offloading hooks of a model in module order so each prefetches the next one's weights.

    Args:
        model: a model with offloading hooks attached.

    Returns:
        The number of offloading hooks linked.
    """
    hooks = _hooks_in_order(model)
    for current, following in zip(hooks, hooks[1:], strict=False):
        current.next_hook = following
    return len(hooks)
