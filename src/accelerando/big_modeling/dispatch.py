"""Place a model over devices with hooks: :func:`dispatch_model`, :func:`cpu_offload`, :func:`disk_offload`.

``dispatch_model`` turns a device map into hooks (:mod:`accelerando.big_modeling.hooks`): blocks on an
accelerator stay there, blocks mapped to ``"cpu"``/``"disk"`` are loaded onto the main device at each
forward while the next offloaded block is prefetched in the background.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import torch
from torch import nn

from accelerando.big_modeling.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    link_prefetch,
)
from accelerando.big_modeling.budgets import DeviceKey, DeviceLike, check_device_visible
from accelerando.big_modeling.hooks import (
    _MOVE_METHODS,
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
)
from accelerando.big_modeling.offload import (
    OffloadedWeightsLoader,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from accelerando.big_modeling.tensors import (
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    summarize_names,
    tensors_on_meta,
    to_torch_device,
)

__all__ = ["cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model"]


def _default_execution_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def cpu_offload(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep all weights on CPU and load each layer's weights onto ``execution_device`` only while it runs.

    Args:
        model: the model.
        execution_device: where forwards run (default: the device of the model's first parameter).
        offload_buffers: offload buffers too.
        state_dict: the CPU weights to use (default: the model's own, moved to CPU).
        preload_module_classes: class names whose submodules' weights load together.

    Returns:
        The model, with hooks attached.

    Example:
        >>> import torch
        >>> from accelerando import cpu_offload
        >>> model = cpu_offload(torch.nn.Linear(4, 2), execution_device="cpu")  # execution_device=0 on a GPU
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    device = (
        to_torch_device(check_device_visible(execution_device, "execution_device"))
        if execution_device is not None
        else _default_execution_device(model)
    )
    if state_dict is None:
        _refuse_empty(model, tensors_on_meta(model), "cpu_offload")
        state_dict = {
            name: tensor.detach().to("cpu") for name, tensor in model.state_dict(keep_vars=True).items()
        }
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model, device, offload=True, weights_map=state_dict, offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )  # fmt: skip
    link_prefetch(model)
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep a whole model on CPU and move it to ``execution_device`` when it runs; it stays there
    until offloaded through the returned hook (or until the next model of a chain runs).

    Chain models of a pipeline by passing each model's hook as the next one's ``prev_module_hook``.

    Args:
        model: the model.
        execution_device: where it runs (default: the first accelerator, else CPU).
        prev_module_hook: hook of the previous model; that model is offloaded when this one runs.

    Returns:
        ``(model, hook)``; call ``hook.offload()`` to move the model back to CPU, ``hook.remove()``
        to detach it.

    Example:
        >>> import torch
        >>> from accelerando import cpu_offload_with_hook
        >>> encoder, encoder_hook = cpu_offload_with_hook(torch.nn.Linear(4, 4), execution_device="cpu")
        >>> decoder, decoder_hook = cpu_offload_with_hook(
        ...     torch.nn.Linear(4, 2), execution_device="cpu", prev_module_hook=encoder_hook
        ... )  # execution_device=0 on a GPU: the encoder goes back to CPU when the decoder runs
        >>> out = decoder(encoder(torch.ones(1, 4)))
        >>> decoder_hook.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep all weights on disk (memory-mapped) and load each layer's weights only while it runs.

    If ``offload_dir`` has no ``index.json`` yet, the model's current weights are written there first.

    Args:
        model: the model.
        offload_dir: the offload folder.
        execution_device: where forwards run (default: the device of the model's first parameter).
        offload_buffers: offload buffers too.
        preload_module_classes: class names whose submodules' weights load together.

    Returns:
        The model, with hooks attached.

    Example:
        >>> import torch
        >>> from accelerando import disk_offload
        >>> model = disk_offload(torch.nn.Linear(4, 2), offload_dir="offload", execution_device="cpu")
        >>> model(torch.ones(1, 4)).shape  # weights read from offload/ for the forward
        torch.Size([1, 2])
    """
    if not os.path.isfile(os.path.join(offload_dir, "index.json")):
        _refuse_empty(model, tensors_on_meta(model), "disk_offload")
        offload_state_dict(offload_dir, model.state_dict())
    device = (
        to_torch_device(check_device_visible(execution_device, "execution_device"))
        if execution_device is not None
        else _default_execution_device(model)
    )
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model, device, offload=True, weights_map=weights_map, offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )  # fmt: skip
    link_prefetch(model)
    return model


def _normalize_map(device_map: Mapping[str, int | str | torch.device]) -> dict[str, DeviceKey]:
    if not isinstance(device_map, Mapping):
        raise TypeError(
            f"device_map must be a dict of module name -> device, got {type(device_map).__name__}."
        )
    return {
        name: check_device_visible(device, f"device_map[{name!r}]") for name, device in device_map.items()
    }


def _refuse_empty(model: nn.Module, empty: list[str], caller: str) -> None:
    """Moving a tensor that holds no data fails deep inside torch; say which ones and why instead."""
    if not empty:
        return
    raise ValueError(
        f"{caller}: {len(empty)} parameter(s)/buffer(s) of the model hold no data (still on the meta device: "
        f"never loaded): {summarize_names(empty)}. Fix: load their weights first (load_checkpoint_in_model "
        "with a checkpoint that matches the model; strict=True lists every missing key), or map their modules "
        "to 'disk' with an offload_dir / offload_index that holds them."
    )


def _unloadable(model: nn.Module, offloaded: list[str], weights: Mapping[str, object] | None) -> list[str]:
    """Tensors on meta that no hook can fill: not in an offloaded module, or absent from its weights."""
    return [
        name
        for name in tensors_on_meta(model)
        if not (_covered_by(name, offloaded) and weights is not None and name in weights)
    ]


def _covered_by(name: str, prefixes: list[str]) -> bool:
    return any(prefix == "" or name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)


def _disk_weights(model, disk_modules, offload_dir, offload_index, offload_buffers) -> dict:
    if offload_dir is None and offload_index is None:
        raise ValueError(
            "The device_map sends modules to 'disk': pass offload_dir (or offload_index) to dispatch_model."
        )
    index = (
        dict(offload_index or OffloadedWeightsLoader(save_folder=offload_dir, index=None).index)
        if offload_dir
        else dict(offload_index)
    )
    fresh: dict = {}
    tensors = model.state_dict(keep_vars=True)
    buffers = {name for name, _ in model.named_buffers()}
    for name, tensor in tensors.items():
        if name in index or tensor.device.type == "meta" or not _covered_by(name, disk_modules):
            continue
        if name in buffers and not offload_buffers:
            continue
        if offload_dir is None:
            raise ValueError(f"{name!r} must be written to disk: pass offload_dir to dispatch_model.")
        offload_weight(tensor, name, offload_dir, index=fresh)
    if fresh and offload_dir is not None:  # only written (above) when offload_dir is set
        save_offload_index(fresh, offload_dir)
        index.update(fresh)
    return index


def _guard_moves(model: nn.Module, summary: str) -> None:
    def refuse_for(method: str):
        def refuse(*args: object, **kwargs: object) -> nn.Module:
            raise RuntimeError(
                f"This model is dispatched over {summary} with hooks; .{method}() would move only part of it and "
                "break them. Call accelerando.hooks.remove_hook_from_submodules(model) first (offloaded weights "
                "are restored), or load it again with the device_map you want."
            )

        return refuse

    for method in _MOVE_METHODS:
        model.__dict__[method] = refuse_for(method)
    model.__dict__["_dispatch_move_guard"] = True


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, DeviceLike],
    main_device: int | str | torch.device | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike | None = None,
    offload_index: dict[str, dict] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place a model according to a device map, attaching the hooks that make it run across devices.

    Blocks mapped to an accelerator are moved there; blocks mapped to ``"cpu"`` (when the main device
    is an accelerator) or ``"disk"`` are offloaded and loaded onto the main device for each forward.
    A model that fits on a single device is simply moved there (unless ``force_hooks``). Afterwards
    ``model.hf_device_map`` holds the map, and ``.to()``/``.cuda()`` raise a clear error instead of
    silently breaking the placement.

    Args:
        model: the model (weights loaded, or on ``meta`` for disk-offloaded blocks).
        device_map: module name -> device (``0``, ``"cuda:1"``, ``"mps"``, ``"cpu"``, ``"disk"``).
        main_device: where offloaded blocks run (default: the first accelerator in the map, else CPU).
        state_dict: CPU weights of the CPU-offloaded blocks (default: read from the model).
        offload_dir: folder of disk-offloaded weights (weights not there yet are written to it).
        offload_index: the disk offload index (default: ``offload_dir/index.json``).
        offload_buffers: offload buffers too.
        skip_keys: input/output dict keys never moved (e.g. ``"past_key_values"``).
        preload_module_classes: class names whose submodules' weights load together.
        force_hooks: attach hooks even for a single-device map.

    Returns:
        The model.

    Raises:
        ValueError: if the map misses parameters, names a device this machine does not have, sends
            modules to disk without ``offload_dir``, or leaves tensors on ``meta`` that nothing can fill.

    Example:
        >>> import torch
        >>> from accelerando import dispatch_model
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> model = dispatch_model(model, device_map={"0": "cpu", "1": "cpu"})  # {"0": 0, "1": 1} on 2 GPUs
        >>> model.hf_device_map
        {'0': 'cpu', '1': 'cpu'}
    """
    checked = _normalize_map(device_map)
    # Looked up on the package at call time: transformers swaps ``accelerate.big_modeling.check_device_map``
    # for a no-op while dispatching models that deliberately leave some tensors unmapped. The package
    # is always imported before its modules, so it is read from sys.modules (no import cycle).
    package = sys.modules[__name__.rpartition(".")[0]]

    package.check_device_map(model, checked)
    check_tied_parameters_on_same_device(find_tied_parameters(model), checked)
    values = set(checked.values())
    if main_device is None:
        main_device = (
            "cpu"
            if values <= {"cpu", "disk"}
            else next(v for v in checked.values() if v not in ("cpu", "disk"))
        )
    main_device = check_device_visible(main_device, "main_device")
    if len(values) == 1 and "disk" not in values and not force_hooks:
        if values != {"meta"}:
            _refuse_empty(model, tensors_on_meta(model), "dispatch_model")
        model.to(to_torch_device(values.pop()))
        model.__dict__["hf_device_map"] = dict(checked)
        return model
    cpu_modules = [name for name, device in checked.items() if device == "cpu" and main_device != "cpu"]
    disk_modules = [name for name, device in checked.items() if device == "disk"]
    if state_dict is None and cpu_modules:
        state_dict = {
            name: tensor.detach().to("cpu")
            for name, tensor in model.state_dict(keep_vars=True).items()
            if _covered_by(name, cpu_modules) and tensor.device.type != "meta"
        }
    index = (
        _disk_weights(model, disk_modules, offload_dir, offload_index, offload_buffers)
        if disk_modules
        else {}
    )
    weights_map = (
        OffloadedWeightsLoader(state_dict=state_dict or {}, save_folder=offload_dir, index=index)
        if (cpu_modules or disk_modules)
        else None
    )
    _refuse_empty(model, _unloadable(model, cpu_modules + disk_modules, weights_map), "dispatch_model")
    execution = {
        name: main_device if device in ("cpu", "disk") else device for name, device in checked.items()
    }
    offload = {name: name in cpu_modules or name in disk_modules for name in checked}
    # The root hook moves inputs to the main device and outputs back (the reference's root hook).
    execution.setdefault("", main_device)
    tied_map = {}
    for group in find_tied_parameters(model):
        for name in group:
            if state_dict and name in state_dict:
                tied_map.setdefault(state_dict[name].data_ptr(), {})
    attach_align_device_hook_on_blocks(
        model, execution, offload, weights_map, offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, tied_params_map=tied_map,
    )  # fmt: skip
    link_prefetch(model)
    model.__dict__["hf_device_map"] = dict(checked)
    if len(values) > 1 or disk_modules or cpu_modules:
        _guard_moves(model, f"{sorted(map(str, values))}")
    return model
