"""Disk offload of quantised layers.

8-bit weights go to the offload folder as int8 rows plus their scales (``<module>.SCB``); the
offload hooks of a dispatched model are then given a view that turns those files (and the
full-precision disk copies of 4-bit weights) back into bitsandbytes parameters when a module runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Protocol, cast

import torch
from torch import nn

from accelerando.big_modeling.offload import OffloadedWeightsLoader, offload_weight, save_offload_index
from accelerando.big_modeling.quantization.layers import bnb_layers, is_quantized
from accelerando.big_modeling.tensors import set_module_tensor_to_device
from accelerando.plugins.bnb import BnbQuantizationConfig

__all__ = [
    "offload_8bit_disk_weights",
    "packed_meta_4bit",
    "quantize_and_offload_8bit",
    "wrap_offload_hooks",
]


class _Params4bitFields(Protocol):
    """The quantisation settings a bitsandbytes ``Params4bit`` carries (copied to a rebuilt one)."""

    blocksize: int
    compress_statistics: bool
    quant_type: str
    quant_storage: torch.dtype


def _params4bit_fields(weight: object) -> _Params4bitFields:
    # A Linear4bit's weight is a Params4bit; bitsandbytes declares it as nn.Linear's plain Tensor.
    return cast("_Params4bitFields", weight)


def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype | None,
    offload_folder: str | os.PathLike,
    offload_index: dict,
    fp16_statistics: torch.Tensor | None,
) -> dict:
    """Write an 8-bit weight to an offload folder and leave the model's tensor on ``meta``.

    With ``fp16_statistics`` None, ``param`` holds the full-precision weight: it is quantised here (on
    CPU) into int8 rows and their scales. Otherwise ``param`` is already int8 and ``fp16_statistics``
    its scales. Both are written (the scales as ``<module>.SCB``) and recorded in ``offload_index``.

    Args:
        model: the model owning the tensor.
        param: the weight (or bias, which is written as is).
        param_name: its dotted name.
        new_dtype: dtype for a non-weight tensor (None keeps it).
        offload_folder: the offload folder.
        offload_index: the index, updated in place.
        fp16_statistics: the scales of an already quantised weight, or None.

    Returns:
        The updated index.
    """
    if param_name.endswith("weight") and (fp16_statistics is not None or param.is_floating_point()):
        if fp16_statistics is None:
            import bitsandbytes as bnb

            int8, scales, _ = bnb.functional.int8_vectorwise_quant(
                param.detach().to("cpu", torch.float16).contiguous()
            )
            param = int8
        else:
            scales = fp16_statistics
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(scales, f"{param_name[: -len('weight')]}SCB", offload_folder, index=offload_index)
    else:
        value = param if new_dtype is None or not param.is_floating_point() else param.to(new_dtype)
        offload_weight(value, param_name, offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", value=torch.empty(*param.size(), device="meta"))
    return offload_index


class _QuantizingWeights(Mapping[str, torch.Tensor]):
    """The offloaded weights of one hooked module, returned as bitsandbytes parameters.

    An int8 weight with its ``SCB`` next to it becomes an ``Int8Params`` carrying the scales; a
    full-precision weight of a 4-bit layer is quantised into a ``Params4bit``. Everything else passes
    through unchanged.
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], root: nn.Module) -> None:
        self.weights = weights
        self.root = root

    def __getitem__(self, key: str) -> torch.Tensor:
        value = self.weights[key]
        owner_name, _, leaf = key.rpartition(".")
        if leaf != "weight":
            return value
        owner = self.root.get_submodule(owner_name) if owner_name else self.root
        import bitsandbytes as bnb

        if isinstance(owner, bnb.nn.Linear8bitLt) and value.dtype == torch.int8:
            scb_key = f"{owner_name}.SCB" if owner_name else "SCB"
            statistics = self.weights[scb_key]
            return bnb.nn.Int8Params(
                value, requires_grad=False, has_fp16_weights=False, CB=value, SCB=statistics
            )
        if isinstance(owner, bnb.nn.Linear4bit) and value.is_floating_point():
            template = _params4bit_fields(owner.weight)
            fresh = bnb.nn.Params4bit(
                value,
                requires_grad=False,
                blocksize=template.blocksize,
                compress_statistics=template.compress_statistics,
                quant_type=template.quant_type,
                quant_storage=template.quant_storage,
                module=owner,
            )
            return fresh.to(value.device if value.device.type != "meta" else "cpu")
        return value

    def __contains__(self, key: object) -> bool:
        return key in self.weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def wrap_offload_hooks(model: nn.Module) -> int:
    """Make the offload hooks of a dispatched model hand bnb layers bitsandbytes parameters."""
    wrapped = 0
    for _, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        for single in getattr(hook, "hooks", [hook]):
            weights = getattr(single, "weights_map", None)
            if (
                getattr(single, "offload", False)
                and weights is not None
                and not isinstance(weights, _QuantizingWeights)
            ):
                single.weights_map = _QuantizingWeights(weights, module)
                wrapped += 1
    return wrapped


def packed_meta_4bit(model: nn.Module) -> None:
    """Give the disk-offloaded 4-bit weights (still on ``meta``) the packed shape their quantised values have."""
    import bitsandbytes as bnb

    for _, module in bnb_layers(model):
        weight = module.weight
        assert isinstance(weight, torch.Tensor)  # a bnb layer's weight is a parameter
        if not isinstance(module, bnb.nn.Linear4bit) or weight.device.type != "meta" or is_quantized(weight):
            continue
        fields = _params4bit_fields(weight)
        # two 4-bit values per byte of quant_storage, stored as a column
        per_item = 2 * fields.quant_storage.itemsize
        rows = (weight.numel() + per_item - 1) // per_item
        module._parameters["weight"] = bnb.nn.Params4bit(
            torch.empty(rows, 1, dtype=fields.quant_storage, device="meta"),
            requires_grad=False,
            blocksize=fields.blocksize,
            compress_statistics=fields.compress_statistics,
            quant_type=fields.quant_type,
            quant_storage=fields.quant_storage,
            module=module,
            bnb_quantized=True,
        )


def _read_index(offload_folder: str | os.PathLike | None) -> dict:
    if offload_folder is None:
        return {}
    path = os.path.join(offload_folder, "index.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def offload_8bit_disk_weights(
    model: nn.Module, config: BnbQuantizationConfig, offload_folder: str | os.PathLike
) -> None:
    """Replace the full-precision disk copies of 8-bit weights by int8 rows + scales."""
    index = _read_index(offload_folder)
    if not index:
        return
    loader = OffloadedWeightsLoader(save_folder=offload_folder, index=index)
    import bitsandbytes as bnb

    updated: dict = {}
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear8bitLt):
            continue
        key = f"{name}.weight" if name else "weight"
        if key in index and index[key]["dtype"] != "int8":
            quantize_and_offload_8bit(
                model, loader[key], key, config.torch_dtype, offload_folder, updated, None
            )
    save_offload_index(updated, offload_folder)
