"""Place, tie and walk the tensors of a model."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch import nn

from accelerando.big_modeling.budgets import check_device_visible, normalize_device_key
from accelerando.big_modeling.sizes import parse_dtype
from accelerando.common.memory import clear_device_cache
from accelerando.core.settings.fields import quote_value

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "check_device_same",
    "check_tied_parameters_on_same_device",
    "find_tied_parameters",
    "get_module_children_bottom_up",
    "get_non_persistent_buffers",
    "id_tensor_storage",
    "resolve_submodule",
    "retie_parameters",
    "set_module_tensor_to_device",
    "summarize_names",
    "tensors_on_meta",
    "to_torch_device",
]


def summarize_names(names: list[str] | tuple[str, ...], limit: int = 10) -> str:
    """Name up to ``limit`` tensors for a message, then say how many more there are.

    Args:
        names: tensor names, in the order to show them.
        limit: the most names to show.

    Returns:
        ``"'a.weight', 'b.bias'"`` or ``"'a.weight', ... and 7 more (17 in all)"``.
    """
    shown = ", ".join(quote_value(name, 80) for name in names[:limit])
    extra = len(names) - limit
    return shown + (f", ... and {extra} more ({len(names)} in all)" if extra > 0 else "")


def tensors_on_meta(model: nn.Module) -> list[str]:
    """Names of the model's parameters and buffers that hold no data (on the ``meta`` device).

    Args:
        model: the model.

    Returns:
        The names, parameters first, in module order (a tied parameter once).
    """
    return [
        name
        for named in (model.named_parameters(), model.named_buffers())
        for name, tensor in named
        if tensor.device.type == "meta"
    ]


def to_torch_device(device: int | str | torch.device) -> torch.device:
    """Turn a device-map value (``0``, ``"cuda:0"``, ``"cpu"``, ``torch.device``) into a ``torch.device``.

    Args:
        device: the device; ``"disk"`` is not a torch device and is rejected.

    Returns:
        The matching ``torch.device``.

    Raises:
        ValueError: for ``"disk"`` or an unknown name.
    """
    if isinstance(device, torch.device):
        return device
    key = normalize_device_key(device)
    if key == "disk":
        raise ValueError(
            "'disk' is not a torch device: offloaded tensors are loaded through hooks, not moved."
        )
    if isinstance(key, int):
        return torch.device("cuda", key)
    return torch.device(key)


def resolve_submodule(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """Split a dotted tensor name into the module that owns the tensor and the tensor's own name.

    Args:
        module: the root module.
        tensor_name: e.g. ``"encoder.layer.0.weight"``.

    Returns:
        ``(owner, "weight")``.

    Raises:
        ValueError: if a part of the path is not a submodule.
    """
    owner = module
    *path, leaf = tensor_name.split(".")
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            raise ValueError(
                f"{type(owner).__name__} has no submodule {part!r} (while resolving {tensor_name!r})."
            )
        owner = child
    return owner, leaf


def _new_parameter(old: nn.Parameter, data: torch.Tensor) -> nn.Parameter:
    if type(old) is nn.Parameter:
        return nn.Parameter(data, requires_grad=old.requires_grad and data.is_floating_point())
    # Parameter subclasses (quantised weights) carry extra attributes in their __dict__.
    extra = {key: value for key, value in old.__dict__.items() if not key.startswith("_")}
    try:
        return type(old)(data, requires_grad=old.requires_grad, **extra)
    except TypeError:
        return type(old)(data, requires_grad=old.requires_grad)


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: torch.dtype | str | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Move one parameter or buffer of a module to a device, optionally replacing its value.

    This is how weights get out of the ``meta`` device: pass the loaded ``value``. When ``value`` is
    already on ``device`` with the right dtype it is used as is (no copy).

    Args:
        module: the root module.
        tensor_name: dotted name of the tensor (``"layers.0.weight"``).
        device: target device (index, name or ``torch.device``).
        value: the new content; required when the tensor is on ``meta`` and ``device`` is not.
        dtype: cast a floating-point ``value`` to this dtype. Without it, a floating-point value takes
            the current tensor's floating dtype; integer and boolean values are never cast.
        fp16_statistics: quantisation statistics stored as ``SCB`` next to an int8 weight.
        tied_params_map: shared cache ``{data_ptr of the source: {device: tensor}}`` so that tied
            weights loaded twice to the same device reuse one copy.
        non_blocking: copy asynchronously where the devices allow it (pinned CPU memory to an
            accelerator); the copy is ordered on the device's current stream.
        clear_cache: after placing a tensor on an accelerator, release the memory the device's caching
            allocator holds but no tensor uses (no effect for ``cpu`` and ``meta``).

    Raises:
        ValueError: for an unknown tensor, a shape mismatch, or a meta tensor without a value.
    """
    owner, name = resolve_submodule(module, tensor_name)
    is_buffer = name in owner._buffers
    if name not in owner._parameters and not is_buffer:
        raise ValueError(
            f"{type(owner).__name__} has no parameter or buffer named {name!r} ({tensor_name!r})."
        )
    old = owner._buffers[name] if is_buffer else owner._parameters[name]
    target = device if isinstance(device, torch.device) else to_torch_device(device)
    if target.type not in ("cpu", "meta"):
        check_device_visible(target, repr(tensor_name))
    if value is None:
        if old is None:
            return
        if old.device.type == "meta" and target.type != "meta":
            raise ValueError(f"{name} is on the meta device, we need a `value` to put in on {target}.")
        value = old
    elif old is not None and old.shape != value.shape and old.dtype not in (torch.uint8, torch.int8):
        raise ValueError(
            f'Trying to set a tensor of shape {value.shape} in "{name}" (which has shape {old.shape}), this '
            "looks incorrect."
        )
    if tied_params_map is not None and value.device.type != "meta":
        cached = tied_params_map.get(value.data_ptr(), {}).get(target)
        if cached is not None:
            _store(owner, name, is_buffer, old, cached)
            return
    cast = _target_dtype(value, old, dtype)
    new = value.to(device=target, dtype=cast, non_blocking=non_blocking)
    if fp16_statistics is not None:
        # bitsandbytes' row statistics ride on the tensor as an attribute torch's stubs do not declare.
        setattr(new, "SCB", fp16_statistics.to(target, non_blocking=non_blocking))  # noqa: B010
    if tied_params_map is not None and value.device.type != "meta" and value.data_ptr() in tied_params_map:
        tied_params_map[value.data_ptr()][target] = new
    _store(owner, name, is_buffer, old, new)
    if clear_cache and target.type not in ("cpu", "meta"):
        clear_device_cache()


def _target_dtype(
    value: torch.Tensor, old: torch.Tensor | None, dtype: torch.dtype | str | None
) -> torch.dtype | None:
    if not value.is_floating_point():
        return None
    if dtype is not None:
        parsed = parse_dtype(dtype)
        return parsed if isinstance(parsed, torch.dtype) else None
    if old is not None and old.is_floating_point() and old.dtype != value.dtype:
        return old.dtype
    return None


def _store(owner: nn.Module, name: str, is_buffer: bool, old: torch.Tensor | None, new: torch.Tensor) -> None:
    if is_buffer:
        owner._buffers[name] = new
    elif isinstance(new, nn.Parameter) and (old is None or type(new) is type(old)):
        owner._parameters[name] = new
    elif old is None:
        owner._parameters[name] = nn.Parameter(new, requires_grad=new.is_floating_point())
    else:
        assert isinstance(old, nn.Parameter)  # _parameters holds Parameters (register_parameter's rule)
        owner._parameters[name] = _new_parameter(old, new.detach() if new.requires_grad else new)


def find_tied_parameters(model: nn.Module, **kwargs: object) -> list[list[str]]:
    """List the groups of parameter names that share one parameter object (tied weights).

    Works on the ``meta`` device because ties are found by identity, not by memory address.

    Args:
        model: the model.
        **kwargs: ignored (accepted for compatibility with older call forms).

    Returns:
        A sorted list of sorted name groups, e.g. ``[["lm_head.weight", "transformer.wte.weight"]]``.

    Example:
        >>> import torch
        >>> from accelerando.utils import find_tied_parameters
        >>> model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
        >>> model[1].weight = model[0].weight  # tie the output layer to the embedding
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def _tensor_devices(model: nn.Module) -> dict[str, str]:
    devices: dict[str, str] = {}
    for module_name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        execution = getattr(hook, "execution_device", None) if getattr(hook, "offload", False) else None
        prefix = f"{module_name}." if module_name else ""
        for name, param in module.named_parameters(recurse=False):
            devices[prefix + name] = str(execution if execution is not None else param.device)
    return devices


def _device_of(name: str, device_map: Mapping[str, object]) -> object:
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            return None
        probe = probe.rpartition(".")[0]


def check_tied_parameters_on_same_device(
    tied_params: list[list[str]] | nn.Module, device_map: Mapping[str, object] | None = None
) -> bool:
    """Check that every group of tied parameters lives on one device.

    Two call forms: ``check_tied_parameters_on_same_device(tied_params, device_map)`` checks a planned
    device map (the reference's form); ``check_tied_parameters_on_same_device(model)`` reads where the
    model's tensors (or, for offloaded modules, their execution device) are. Each split group is
    reported with a warning.

    Args:
        tied_params: groups of tied names from :func:`find_tied_parameters`, or a model.
        device_map: the planned device map (second form only).

    Returns:
        True when every group is on one device.

    Raises:
        TypeError: for a list of groups without a ``device_map``.

    Example:
        >>> import torch
        >>> from accelerando.utils import check_tied_parameters_on_same_device, find_tied_parameters
        >>> model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
        >>> model[1].weight = model[0].weight
        >>> check_tied_parameters_on_same_device(find_tied_parameters(model), {"0": 0, "1": 0})
        True
    """
    if isinstance(tied_params, nn.Module):
        devices = _tensor_devices(tied_params)
        groups = find_tied_parameters(tied_params)
        lookup: Callable[[str], object] = devices.get
    else:
        if device_map is None:
            raise TypeError("Pass the device_map to check tied parameter groups, or pass the model itself.")
        groups = tied_params
        planned = device_map

        def in_map(name: str) -> object:
            return _device_of(name, planned)

        lookup = in_map

    all_same = True
    for group in groups:
        placed = {str(lookup(name)) for name in group}
        if len(placed) > 1:
            all_same = False
            warnings.warn(
                f"Tied parameters {group} are on different devices {sorted(placed)}; keep them together "
                "(infer_auto_device_map does) or results may be wrong.",
                stacklevel=2,
            )
    return all_same


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point to one parameter again (after loading replaced some).

    The kept parameter is the first one of the group that holds real data (not ``meta``).

    Args:
        model: the model.
        tied_params: groups of names, as returned by :func:`find_tied_parameters` before loading.

    Example:
        >>> import torch
        >>> from accelerando.utils import find_tied_parameters, retie_parameters
        >>> model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
        >>> model[1].weight = model[0].weight
        >>> tied = find_tied_parameters(model)
        >>> model[1].weight = torch.nn.Parameter(model[0].weight.detach().clone())  # e.g. by loading
        >>> retie_parameters(model, tied)
        >>> model[1].weight is model[0].weight
        True
    """
    for group in tied_params:
        located = [resolve_submodule(model, name) for name in group]
        params = [owner._parameters.get(leaf) for owner, leaf in located]
        source = next((p for p in params if p is not None and p.device.type != "meta"), None)
        source = source if source is not None else next((p for p in params if p is not None), None)
        if source is None:
            continue
        for owner, leaf in located:
            owner._parameters[leaf] = source


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list:
    """List all modules with children before their parents (post-order); the model comes last.

    Args:
        model: the root module.
        return_fqns: return ``(name, module)`` pairs instead of modules.

    Returns:
        The modules (or pairs) in post-order.
    """
    ordered: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module, bool]] = [("", model, False)]
    while stack:
        name, module, expanded = stack.pop()
        if expanded:
            ordered.append((name, module))
            continue
        stack.append((name, module, True))
        prefix = f"{name}." if name else ""
        for child_name, child in reversed(list(module.named_children())):
            stack.append((prefix + child_name, child, False))
    return ordered if return_fqns else [module for _, module in ordered]


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """Identify the memory a tensor lives in: two tensors with equal ids share storage (are tied).

    Views of one tensor share the id whatever their offset or shape; the device is part of the id
    because two devices can hand out the same address.

    Args:
        tensor: any tensor.

    Returns:
        ``(device, storage address, storage size in bytes)``; address and size are 0 when the tensor
        has no storage of its own to inspect (some tensor subclasses; ``meta`` tensors have address 0).
    """
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        # Wrapper subclasses (e.g. functional or distributed tensors) expose no storage.
        return tensor.device, 0, 0


def check_device_same(
    first_device: int | str | torch.device, second_device: int | str | torch.device
) -> bool:
    """Tell whether two device specs mean the same device.

    An accelerator device without an index means the first one, so ``"cuda"`` and ``"cuda:0"`` (or
    ``0``) are the same device; ``"cpu"`` and ``"cuda"`` are not.

    Args:
        first_device: a device (``torch.device``, name or accelerator index).
        second_device: another one.

    Returns:
        True for the same device.

    Raises:
        ValueError: a spec that names no device (``"disk"``, an unknown name).
    """
    first, second = (to_torch_device(d) for d in (first_device, second_device))
    if first.type != second.type:
        return False
    if first.type in ("cpu", "meta"):
        return True
    return (first.index or 0) == (second.index or 0)


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers that are left out of the module's ``state_dict`` (non-persistent ones).

    Args:
        module: the module.
        recurse: include the buffers of all submodules.
        fqns: with ``recurse``, give full dotted names (``"block.0.mask"``) instead of the bare
            buffer names (which may then collide across submodules).

    Returns:
        A new set of names (the module's own bookkeeping set is not shared).
    """
    names = set(module._non_persistent_buffers_set)
    if not recurse:
        return names
    for module_name, submodule in module.named_modules():
        if not module_name:
            continue
        for buffer_name in submodule._non_persistent_buffers_set:
            names.add(f"{module_name}.{buffer_name}" if fqns else buffer_name)
    return names
