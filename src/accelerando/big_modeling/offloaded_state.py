"""State dicts of models whose weights are partly offloaded (kept on CPU or disk behind hooks)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from accelerando.big_modeling.hooks import align_module_device, has_offloaded_params
from accelerando.big_modeling.tensors import summarize_names

__all__ = ["get_state_dict_from_offload", "get_state_dict_offloaded_model"]


def _own_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's direct parameters and persistent buffers (what its ``state_dict`` holds itself)."""
    own: dict[str, torch.Tensor] = {name: p for name, p in module._parameters.items() if p is not None}
    own.update(
        (name, b)
        for name, b in module._buffers.items()
        if b is not None and name not in module._non_persistent_buffers_set
    )
    return own


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, str | torch.Tensor],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, str | torch.Tensor]:
    """Fill ``state_dict`` with the real values of one module's tensors, loading them if offloaded.

    ``module_name`` is the dotted name of one of the module's tensors (e.g. ``"block.0.linear.weight"``);
    its module part (``"block.0.linear"``) prefixes the keys. Only keys already in ``state_dict``
    (typically placeholders) are replaced. An offloaded module's weights are loaded to
    ``device_to_put_offload`` for the copy, then offloaded again; other modules' tensors are taken
    where they are.

    Args:
        module: the module owning the tensor.
        module_name: the tensor's full dotted name.
        state_dict: the dict to fill, edited in place.
        device_to_put_offload: where offloaded weights are loaded to.

    Returns:
        ``state_dict``.
    """
    root = module_name.rpartition(".")[0]
    prefix = f"{root}." if root else ""
    target = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, target):
        for key, value in module.state_dict().items():
            if prefix + key in state_dict:
                state_dict[prefix + key] = value
    return state_dict


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a model dispatched with offloaded parts, every tensor on the CPU.

    Offloaded modules are loaded one at a time (to the CPU) while their tensors are copied, so the
    CPU must hold the result plus one module. Tensors that are still on ``meta`` with nothing to load
    them from are left out, with a warning naming them.

    Args:
        model: the model (with hooks from ``dispatch_model`` / ``cpu_offload`` / ``disk_offload``).

    Returns:
        Name -> CPU tensor, in module order.

    Raises:
        MemoryError: an offloaded module does not fit in CPU memory.
    """
    state_dict: dict[str, torch.Tensor] = {}
    missing: dict[str, None] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        try:
            if has_offloaded_params(module):
                # The hook may cover submodules too: take everything it materialises.
                with align_module_device(module, "cpu"):
                    tensors = dict(module.state_dict(keep_vars=True))
            else:
                tensors = _own_tensors(module)
            for key, tensor in tensors.items():
                full = prefix + key
                if full in state_dict:
                    continue
                if tensor.device.type == "meta":
                    missing[full] = None
                    continue
                state_dict[full] = tensor.detach().to("cpu")
        except MemoryError:
            raise MemoryError(
                f"Loading the offloaded module {name!r} to the CPU ran out of memory; free CPU memory or save "
                "the model module by module."
            ) from None
    left_out = [name for name in missing if name not in state_dict]
    if left_out:
        warnings.warn(
            f"{len(left_out)} tensor(s) are still on the meta device and were left out of the state dict: "
            f"{summarize_names(left_out)}. Load their weights (or dispatch with their offload folder) first.",
            stacklevel=2,
        )
    ordered = {name: state_dict[name] for name in model.state_dict(keep_vars=True) if name in state_dict}
    ordered.update((name, tensor) for name, tensor in state_dict.items() if name not in ordered)
    return ordered
